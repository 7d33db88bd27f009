/* One-sided: put, get, accumulate with fence and lock/unlock epochs. */
#include <mpi.h>
#include <stdio.h>

#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)
#define N 64

int main(int argc, char **argv) {
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long win_buf[N], local[N];
    for (int i = 0; i < N; i++) win_buf[i] = 0;
    MPI_Win win;
    MPI_Win_create(win_buf, sizeof(win_buf), sizeof(long), MPI_INFO_NULL, MPI_COMM_WORLD, &win);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;

    /* Fence epoch: put to the right neighbour. */
    for (int i = 0; i < N; i++) local[i] = rank * 1000 + i;
    MPI_Win_fence(0, win);
    MPI_Put(local, N, MPI_LONG, right, 0, N, MPI_LONG, win);
    MPI_Win_fence(0, win);
    for (int i = 0; i < N; i++) CHECK(win_buf[i] == left * 1000 + i, "put[%d]=%ld", i, win_buf[i]);

    /* Fence epoch: get from the left neighbour. */
    MPI_Win_fence(0, win);
    MPI_Get(local, N, MPI_LONG, left, 0, N, MPI_LONG, win);
    MPI_Win_fence(0, win);
    for (int i = 0; i < N; i++) CHECK(local[i] == ((left + size - 1) % size) * 1000 + i, "get[%d]=%ld", i, local[i]);

    /* Accumulate from everyone into rank 0 under lock/unlock. */
    MPI_Win_fence(0, win);
    if (rank == 0) for (int i = 0; i < N; i++) win_buf[i] = 0;
    MPI_Win_fence(0, win);
    for (int i = 0; i < N; i++) local[i] = rank + 1;
    MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win);
    MPI_Accumulate(local, N, MPI_LONG, 0, 0, N, MPI_LONG, MPI_SUM, win);
    MPI_Win_unlock(0, win);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, win);
        for (int i = 0; i < N; i++) CHECK(win_buf[i] == (long)size * (size + 1) / 2, "acc[%d]=%ld", i, win_buf[i]);
        MPI_Win_unlock(0, win);
    }
    MPI_Win_free(&win);
    if (rank == 0) printf("rma: all checks passed on %d ranks\n", size);
    MPI_Finalize();
    return 0;
}
