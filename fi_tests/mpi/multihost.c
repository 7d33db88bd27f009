/* A multi-host job's traffic, every byte checksummed: each rank reports its
 * host; every pair of ranks exchanges messages of every size class (eager,
 * segmented, long: 0 B .. 4 MiB) in both directions at once, tagged by size;
 * then collectives (bcast, allreduce, alltoall, allgather) with verified
 * results. Prints "multihost: all checks passed on N hosts" from rank 0. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <unistd.h>
#include "hosts.h"

#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)

static int rank, size;

static unsigned char byte_of(size_t i, unsigned seed) { return (unsigned char)((i * 2654435761u) >> 7 ^ seed); }
static void fill(unsigned char *b, size_t n, unsigned seed) { for (size_t i = 0; i < n; i++) b[i] = byte_of(i, seed); }
static uint64_t sum(const unsigned char *b, size_t n) { uint64_t s = 1469598103934665603ull; for (size_t i = 0; i < n; i++) s = (s ^ b[i]) * 1099511628211ull; return s; }

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int nhosts;
    char *hosts = gather_hosts(size, &nhosts);
    size_t sizes[] = {0, 1, 64, 1000, 4096, 8192, 65536, 200000, 1 << 20, 4 << 20};
    int nsizes = sizeof sizes / sizeof *sizes;
    size_t max = 4 << 20;
    unsigned char *out = malloc(max), *in = malloc(max);
    for (int round = 0; round < 2; round++) {
        for (int peer = 0; peer < size; peer++) {
            if (peer == rank) continue;
            for (int s = 0; s < nsizes; s++) {
                size_t n = sizes[s];
                unsigned my_seed = (unsigned)(rank * 1000 + peer * 10 + s + round * 7919);
                unsigned their_seed = (unsigned)(peer * 1000 + rank * 10 + s + round * 7919);
                fill(out, n, my_seed);
                uint64_t want = 0;
                { unsigned char *tmp = malloc(n ? n : 1); fill(tmp, n, their_seed); want = sum(tmp, n); free(tmp); }
                MPI_Status st;
                MPI_Sendrecv(out, (int)n, MPI_BYTE, peer, s, in, (int)n, MPI_BYTE, peer, s, MPI_COMM_WORLD, &st);
                int got;
                MPI_Get_count(&st, MPI_BYTE, &got);
                CHECK((size_t)got == n, "size %zu from %d: got %d bytes", n, peer, got);
                CHECK(sum(in, n) == want, "size %zu from %d (%s): checksum mismatch", n, peer, hosts + 256 * peer);
            }
        }
    }
    for (int round = 0; round < 3; round++) {
        int counts[] = {1, 1000, 300000};
        int n = counts[round];
        long *a = malloc(sizeof(long) * n), *b = malloc(sizeof(long) * n);
        for (int i = 0; i < n; i++) a[i] = rank == 0 ? (long)i * 7 + round : -1;
        MPI_Bcast(a, n, MPI_LONG, 0, MPI_COMM_WORLD);
        for (int i = 0; i < n; i++) CHECK(a[i] == (long)i * 7 + round, "bcast[%d]", i);
        for (int i = 0; i < n; i++) a[i] = rank + i;
        MPI_Allreduce(a, b, n, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        for (int i = 0; i < n; i++) CHECK(b[i] == (long)size * (size - 1) / 2 + (long)size * i, "allreduce[%d]", i);
        free(a);
        free(b);
        int per = n / size + 1;
        int *x = malloc(sizeof(int) * per * size), *y = malloc(sizeof(int) * per * size);
        for (int d = 0; d < size; d++) for (int i = 0; i < per; i++) x[d * per + i] = rank * 1000003 + d * 1009 + i;
        MPI_Alltoall(x, per, MPI_INT, y, per, MPI_INT, MPI_COMM_WORLD);
        for (int src = 0; src < size; src++) for (int i = 0; i < per; i++) CHECK(y[src * per + i] == src * 1000003 + rank * 1009 + i, "alltoall from %d [%d]", src, i);
        for (int i = 0; i < per; i++) x[i] = rank * 31 + i;
        MPI_Allgather(x, per, MPI_INT, y, per, MPI_INT, MPI_COMM_WORLD);
        for (int src = 0; src < size; src++) for (int i = 0; i < per; i++) CHECK(y[src * per + i] == src * 31 + i, "allgather from %d [%d]", src, i);
        free(x);
        free(y);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) printf("multihost: all checks passed on %d hosts, %d ranks\n", nhosts, size);
    free(out);
    free(in);
    free(hosts);
    MPI_Finalize();
    return 0;
}
