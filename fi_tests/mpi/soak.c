/* Endurance: mixed traffic for argv[1] seconds (default 180), every byte
 * verified, each rank's resident memory sampled every 10 s.
 * Each round: every pair of ranks exchanges messages of several size classes
 * in both directions (eager, segmented, long), plus a nonblocking ring of
 * tagged messages and an allreduce and alltoall with checked results. Rank 0
 * prints one "soak: t=<s> rss_kib=<r0>,<r1>,..." line per sample, then
 * "soak: <rounds> rounds, rss growth after warm-up (KiB): <g0>,<g1>,..."
 * where growth is the largest sample after the warm-up (30 s) minus the
 * sample at the warm-up's end. The test judges the growth. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>

#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)

static int rank, size;

static unsigned char byte_of(size_t i, unsigned seed) { return (unsigned char)((i * 2654435761u) >> 7 ^ seed); }
static void fill(unsigned char *b, size_t n, unsigned seed) { for (size_t i = 0; i < n; i++) b[i] = byte_of(i, seed); }
static int verify(const unsigned char *b, size_t n, unsigned seed) { for (size_t i = 0; i < n; i++) if (b[i] != byte_of(i, seed)) return 0; return 1; }

static long rss_kib(void) {
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return -1;
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = -1;
    fclose(f);
    return resident * 4;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    double duration = argc > 1 ? atof(argv[1]) : 180.0, warmup = 30.0;
    size_t sizes[] = {0, 8, 1000, 8192, 70000, 300000, 1 << 20};
    int nsizes = sizeof sizes / sizeof *sizes;
    size_t max = 1 << 20;
    unsigned char *out = malloc(max), *in = malloc(max);
    enum { RING = 32, RING_LEN = 2048 };
    unsigned char *ring_out = malloc(RING * RING_LEN), *ring_in = malloc(RING * RING_LEN);
    int nsamples_max = (int)(duration / 10) + 3;
    long *samples = calloc((size_t)nsamples_max * size, sizeof(long));
    double *when = calloc((size_t)nsamples_max, sizeof(double));
    int nsamples = 0;
    double t0 = MPI_Wtime(), last = t0 - 10.0;
    long rounds = 0;
    for (;;) {
        /* Rank 0 decides for everyone: sample now? stop now? */
        int ctl[2] = {0, 0};
        if (rank == 0) {
            double now = MPI_Wtime();
            ctl[0] = now - last >= 10.0 && nsamples < nsamples_max;
            ctl[1] = now - t0 >= duration;
            if (ctl[0]) last = now;
        }
        MPI_Bcast(ctl, 2, MPI_INT, 0, MPI_COMM_WORLD);
        if (ctl[0]) {
            long r = rss_kib();
            MPI_Gather(&r, 1, MPI_LONG, samples + (size_t)nsamples * size, 1, MPI_LONG, 0, MPI_COMM_WORLD);
            if (rank == 0) {
                when[nsamples] = MPI_Wtime() - t0;
                printf("soak: t=%.0f rss_kib=", when[nsamples]);
                for (int i = 0; i < size; i++) printf("%s%ld", i ? "," : "", samples[(size_t)nsamples * size + i]);
                printf("\n");
                fflush(stdout);
            }
            nsamples++;
        }
        if (ctl[1]) break;
        unsigned base = (unsigned)rounds * 7919u;
        for (int peer = 0; peer < size; peer++) {
            if (peer == rank) continue;
            for (int s = 0; s < nsizes; s++) {
                size_t n = sizes[s];
                fill(out, n, base + (unsigned)(rank * 1000 + peer * 10 + s));
                MPI_Status st;
                MPI_Sendrecv(out, (int)n, MPI_BYTE, peer, s, in, (int)n, MPI_BYTE, peer, s, MPI_COMM_WORLD, &st);
                int got;
                MPI_Get_count(&st, MPI_BYTE, &got);
                CHECK((size_t)got == n, "round %ld size %zu from %d: got %d bytes", rounds, n, peer, got);
                CHECK(verify(in, n, base + (unsigned)(peer * 1000 + rank * 10 + s)), "round %ld size %zu from %d: wrong bytes", rounds, n, peer);
            }
        }
        /* A ring of nonblocking tagged messages, many in flight at once. */
        MPI_Request reqs[2 * RING];
        int next = (rank + 1) % size, prev = (rank + size - 1) % size;
        for (int i = 0; i < RING; i++) MPI_Irecv(ring_in + i * RING_LEN, RING_LEN, MPI_BYTE, prev, 100 + i, MPI_COMM_WORLD, &reqs[i]);
        for (int i = 0; i < RING; i++) {
            fill(ring_out + i * RING_LEN, RING_LEN, base + (unsigned)(rank * 77 + i));
            MPI_Isend(ring_out + i * RING_LEN, RING_LEN, MPI_BYTE, next, 100 + i, MPI_COMM_WORLD, &reqs[RING + i]);
        }
        MPI_Waitall(2 * RING, reqs, MPI_STATUSES_IGNORE);
        for (int i = 0; i < RING; i++) CHECK(verify(ring_in + i * RING_LEN, RING_LEN, base + (unsigned)(prev * 77 + i)), "round %ld ring message %d", rounds, i);
        long a[64], b[64];
        for (int i = 0; i < 64; i++) a[i] = rank + i + rounds;
        MPI_Allreduce(a, b, 64, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        for (int i = 0; i < 64; i++) CHECK(b[i] == (long)size * (size - 1) / 2 + (long)size * (i + rounds), "round %ld allreduce[%d]", rounds, i);
        int x[64], y[64];
        int per = 64 / size;
        for (int d = 0; d < size; d++) for (int i = 0; i < per; i++) x[d * per + i] = rank * 1009 + d * 31 + i + (int)rounds;
        MPI_Alltoall(x, per, MPI_INT, y, per, MPI_INT, MPI_COMM_WORLD);
        for (int src = 0; src < size; src++) for (int i = 0; i < per; i++) CHECK(y[src * per + i] == src * 1009 + rank * 31 + i + (int)rounds, "round %ld alltoall", rounds);
        rounds++;
    }
    if (rank == 0) {
        int base = -1;
        for (int k = 0; k < nsamples; k++) if (when[k] >= warmup) { base = k; break; }
        printf("soak: %ld rounds, rss growth after warm-up (KiB): ", rounds);
        for (int i = 0; i < size; i++) {
            long grow = 0;
            if (base >= 0) for (int k = base; k < nsamples; k++) {
                long g = samples[(size_t)k * size + i] - samples[(size_t)base * size + i];
                if (g > grow) grow = g;
            }
            printf("%s%ld", i ? "," : "", base >= 0 ? grow : -1);
        }
        printf("\n");
    }
    MPI_Barrier(MPI_COMM_WORLD);
    free(out); free(in); free(ring_out); free(ring_in); free(samples); free(when);
    MPI_Finalize();
    return 0;
}
