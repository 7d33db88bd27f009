/* Point-to-point semantics over rdmx (pml cm + mtl ofi): wildcards, probes,
 * matched probes, cancel, truncation as an MPI error, zero-byte messages and
 * sizes up to 64 MiB with data verified. Exit code 0 = pass. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>

#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)

static int rank, size;

static void fill(unsigned char *b, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(i * 131u + seed);
}
static int verify(const unsigned char *b, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) if (b[i] != (unsigned char)(i * 131u + seed)) return 0;
    return 1;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    CHECK(size >= 2, "needs 2 ranks");
    int peer = rank ^ 1;
    if (peer >= size) { MPI_Barrier(MPI_COMM_WORLD); MPI_Finalize(); return 0; }
    MPI_Status st;

    /* 1. ANY_SOURCE / ANY_TAG. */
    if (rank % 2 == 0) {
        int v = 1000 + rank;
        MPI_Send(&v, 1, MPI_INT, peer, 42, MPI_COMM_WORLD);
    } else {
        int v = -1;
        MPI_Recv(&v, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
        CHECK(v == 1000 + peer && st.MPI_SOURCE == peer && st.MPI_TAG == 42, "wildcard recv got %d from %d tag %d", v, st.MPI_SOURCE, st.MPI_TAG);
    }

    /* 2. Probe and Iprobe. */
    if (rank % 2 == 0) {
        double d[3] = {1.5, 2.5, 3.5};
        MPI_Send(d, 3, MPI_DOUBLE, peer, 7, MPI_COMM_WORLD);
        MPI_Send(d, 2, MPI_DOUBLE, peer, 8, MPI_COMM_WORLD);
    } else {
        int count = 0, flag = 0;
        MPI_Probe(peer, 7, MPI_COMM_WORLD, &st);
        MPI_Get_count(&st, MPI_DOUBLE, &count);
        CHECK(count == 3, "probe count %d", count);
        double d[3];
        MPI_Recv(d, 3, MPI_DOUBLE, peer, 7, MPI_COMM_WORLD, &st);
        CHECK(d[2] == 3.5, "probe data");
        while (!flag) MPI_Iprobe(peer, 8, MPI_COMM_WORLD, &flag, &st);
        MPI_Get_count(&st, MPI_DOUBLE, &count);
        CHECK(count == 2, "iprobe count %d", count);
        MPI_Recv(d, 2, MPI_DOUBLE, peer, 8, MPI_COMM_WORLD, &st);
        /* A miss: nothing with tag 999 is coming. */
        MPI_Iprobe(peer, 999, MPI_COMM_WORLD, &flag, &st);
        CHECK(!flag, "iprobe found a message that was never sent");
    }

    /* 3. Mprobe / Mrecv. */
    if (rank % 2 == 0) {
        long l = 77;
        MPI_Send(&l, 1, MPI_LONG, peer, 9, MPI_COMM_WORLD);
    } else {
        MPI_Message m;
        long l = 0;
        MPI_Mprobe(peer, 9, MPI_COMM_WORLD, &m, &st);
        MPI_Mrecv(&l, 1, MPI_LONG, &m, &st);
        CHECK(l == 77, "mrecv got %ld", l);
    }

    /* 4. Cancel of a posted receive. */
    {
        int v;
        MPI_Request r;
        int cancelled = 0;
        MPI_Irecv(&v, 1, MPI_INT, peer, 12345, MPI_COMM_WORLD, &r);
        MPI_Cancel(&r);
        MPI_Wait(&r, &st);
        MPI_Test_cancelled(&st, &cancelled);
        CHECK(cancelled, "receive not cancelled");
    }

    /* 5. Truncation reported as an MPI error. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (rank % 2 == 0) {
        int big[16] = {0};
        MPI_Send(big, 16, MPI_INT, peer, 13, MPI_COMM_WORLD);
    } else {
        int small[4];
        int rc = MPI_Recv(small, 4, MPI_INT, peer, 13, MPI_COMM_WORLD, &st);
        int cls = 0;
        MPI_Error_class(rc, &cls);
        CHECK(rc != MPI_SUCCESS && cls == MPI_ERR_TRUNCATE, "truncation not reported (rc %d class %d)", rc, cls);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);

    /* 6. Zero-byte messages, synchronous send (uses the zero-byte ack). */
    if (rank % 2 == 0) {
        MPI_Ssend(NULL, 0, MPI_BYTE, peer, 14, MPI_COMM_WORLD);
    } else {
        int count = -1;
        MPI_Recv(NULL, 0, MPI_BYTE, peer, 14, MPI_COMM_WORLD, &st);
        MPI_Get_count(&st, MPI_BYTE, &count);
        CHECK(count == 0, "zero-byte count %d", count);
    }

    /* 7. Sizes from 0 to 64 MiB, both directions, data verified. */
    size_t max = (argc > 1) ? strtoull(argv[1], NULL, 0) : (64u << 20);
    unsigned char *buf = malloc(max ? max : 1);
    CHECK(buf != NULL, "malloc");
    size_t sizes[64];
    int nsizes = 0;
    sizes[nsizes++] = 0;
    for (size_t n = 1; n < max && nsizes < 62; n *= 4) sizes[nsizes++] = n;
    if (max > 0) sizes[nsizes++] = max;
    for (int k = 0; k < nsizes; k++) {
        size_t n = sizes[k];
        unsigned seed = (unsigned)n;
        if (rank % 2 == 0) {
            fill(buf, n, seed);
            MPI_Send(buf, (int)n, MPI_BYTE, peer, 20, MPI_COMM_WORLD);
            memset(buf, 0, n);
            MPI_Recv(buf, (int)n, MPI_BYTE, peer, 21, MPI_COMM_WORLD, &st);
            CHECK(verify(buf, n, seed + 1), "echo of %zu bytes corrupted", n);
        } else {
            memset(buf, 0, n);
            MPI_Recv(buf, (int)n, MPI_BYTE, peer, 20, MPI_COMM_WORLD, &st);
            CHECK(verify(buf, n, seed), "%zu bytes corrupted", n);
            fill(buf, n, seed + 1);
            MPI_Send(buf, (int)n, MPI_BYTE, peer, 21, MPI_COMM_WORLD);
        }
    }
    free(buf);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) printf("p2p: all checks passed on %d ranks\n", size);
    MPI_Finalize();
    return 0;
}
