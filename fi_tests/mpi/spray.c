/* Traffic to keep a job busy while hostile datagrams hit its endpoints
 * (fi_tests/tests/spray.rs): rounds of pairwise exchanges of every size class
 * (eager, segmented, long: 0 B .. 1 MiB) in both directions, every byte
 * checked, and an allreduce per round, until argv[1] seconds have passed
 * (rank 0's clock decides). Prints "spray: all checks passed, N rounds". */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)

static int rank, size;

static unsigned char byte_of(size_t i, unsigned seed) { return (unsigned char)((i * 2654435761u) >> 7 ^ seed); }

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    double secs = argc > 1 ? atof(argv[1]) : 5.0;
    size_t sizes[] = {0, 1, 64, 1000, 4096, 8192, 65536, 200000, 1 << 20};
    int nsizes = sizeof sizes / sizeof *sizes;
    size_t max = 1 << 20;
    unsigned char *out = malloc(max), *in = malloc(max);
    double t0 = MPI_Wtime();
    int go = 1, rounds = 0;
    while (go) {
        for (int peer = 0; peer < size; peer++) {
            if (peer == rank) continue;
            for (int s = 0; s < nsizes; s++) {
                size_t n = sizes[s];
                unsigned mine = (unsigned)(rank * 1000 + peer * 10 + s + rounds * 7919);
                unsigned theirs = (unsigned)(peer * 1000 + rank * 10 + s + rounds * 7919);
                for (size_t i = 0; i < n; i++) out[i] = byte_of(i, mine);
                MPI_Status st;
                MPI_Sendrecv(out, (int)n, MPI_BYTE, peer, s, in, (int)n, MPI_BYTE, peer, s, MPI_COMM_WORLD, &st);
                int got;
                MPI_Get_count(&st, MPI_BYTE, &got);
                CHECK((size_t)got == n, "round %d size %zu from %d: got %d bytes", rounds, n, peer, got);
                for (size_t i = 0; i < n; i++)
                    CHECK(in[i] == byte_of(i, theirs), "round %d size %zu from %d: byte %zu wrong", rounds, n, peer, i);
            }
        }
        long v = rank + rounds, total = 0;
        MPI_Allreduce(&v, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        CHECK(total == (long)size * (size - 1) / 2 + (long)size * rounds, "round %d allreduce %ld", rounds, total);
        rounds++;
        go = rank == 0 ? MPI_Wtime() - t0 < secs : 0;
        MPI_Bcast(&go, 1, MPI_INT, 0, MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) printf("spray: all checks passed, %d rounds\n", rounds);
    free(out);
    free(in);
    MPI_Finalize();
    return 0;
}
