/* Collectives over rdmx: bcast, reduce, allreduce, alltoall, allgather, barrier. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)

int main(int argc, char **argv) {
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int round = 0; round < 3; round++) {
        int counts[] = {1, 1000, 100000};
        int n = counts[round];
        long *a = malloc(sizeof(long) * n * size), *b = malloc(sizeof(long) * n * size);
        for (int i = 0; i < n; i++) a[i] = (rank == 0) ? i * 3 + round : -1;
        MPI_Bcast(a, n, MPI_LONG, 0, MPI_COMM_WORLD);
        for (int i = 0; i < n; i++) CHECK(a[i] == i * 3 + round, "bcast[%d]=%ld", i, a[i]);
        for (int i = 0; i < n; i++) a[i] = rank + i;
        MPI_Reduce(a, b, n, MPI_LONG, MPI_SUM, size - 1, MPI_COMM_WORLD);
        if (rank == size - 1)
            for (int i = 0; i < n; i++) CHECK(b[i] == (long)size * (size - 1) / 2 + (long)i * size, "reduce[%d]=%ld", i, b[i]);
        MPI_Allreduce(a, b, n, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
        for (int i = 0; i < n; i++) CHECK(b[i] == size - 1 + i, "allreduce[%d]=%ld", i, b[i]);
        for (int p = 0; p < size; p++) for (int i = 0; i < n; i++) a[p * n + i] = rank * 1000000L + p * 1000L + (i % 1000);
        MPI_Alltoall(a, n, MPI_LONG, b, n, MPI_LONG, MPI_COMM_WORLD);
        for (int p = 0; p < size; p++) for (int i = 0; i < n; i++)
            CHECK(b[p * n + i] == p * 1000000L + rank * 1000L + (i % 1000), "alltoall from %d [%d]", p, i);
        for (int i = 0; i < n; i++) a[i] = rank * 7 + i;
        MPI_Allgather(a, n, MPI_LONG, b, n, MPI_LONG, MPI_COMM_WORLD);
        for (int p = 0; p < size; p++) for (int i = 0; i < n; i++) CHECK(b[p * n + i] == p * 7 + i, "allgather");
        MPI_Barrier(MPI_COMM_WORLD);
        free(a); free(b);
    }
    if (rank == 0) printf("coll: all checks passed on %d ranks\n", size);
    MPI_Finalize();
    return 0;
}
