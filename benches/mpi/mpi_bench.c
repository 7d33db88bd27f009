/* MPI point-to-point figures between ranks 0 and 1: ping-pong latency (half the
 * round trip), streaming bandwidth (a window of 64 non-blocking sends, one ack),
 * and message rate (8-byte messages, windows of 64). Prints one line per figure:
 *   latency_us <bytes> <median us>
 *   bandwidth_GBps <bytes> <GB/s>
 *   msgrate_Mps 8 <million messages/s>
 * Usage: mpi_bench [iterations] [size,size,...]  (run with np 2; sizes up to
 * 4 MiB, default 8,1024,65536,1048576). Large sizes run fewer iterations. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WINDOW 64

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) {
        if (rank == 0) fprintf(stderr, "mpi_bench: run with np 2\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int iters = argc > 1 ? atoi(argv[1]) : 1000;
    int peer = 1 - rank;
    size_t max = 4 << 20;
    char *buf = malloc(max), *rbuf = malloc(max * 1);
    memset(buf, rank + 1, max);
    size_t sizes[64] = {8, 1024, 65536, 1 << 20};
    unsigned nsizes = 4;
    if (argc > 2) {
        nsizes = 0;
        for (char *tok = strtok(argv[2], ","); tok && nsizes < 64; tok = strtok(NULL, ",")) {
            size_t n = (size_t)atol(tok);
            if (n > max) n = max;
            sizes[nsizes++] = n;
        }
    }
    double *samples = malloc(sizeof(double) * (iters + 10));
    for (unsigned s = 0; s < nsizes; s++) {
        size_t n = sizes[s];
        int it = n > 4096 ? (int)(iters * 4096.0 / n) : iters;
        if (it < 20) it = 20;
        if (it > iters) it = iters;
        for (int i = -10; i < it; i++) {
            double t0 = MPI_Wtime();
            if (rank == 0) {
                MPI_Send(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
                MPI_Recv(rbuf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(rbuf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
            }
            if (i >= 0) samples[i] = (MPI_Wtime() - t0) * 1e6 / 2;
        }
        qsort(samples, it, sizeof(double), cmp);
        if (rank == 0) printf("latency_us %zu %.2f\n", n, samples[it / 2]);
    }
    MPI_Request req[WINDOW];
    for (unsigned s = 0; s < nsizes; s++) {
        size_t n = sizes[s] ? sizes[s] : 1;
        size_t per = n * WINDOW > (64u << 20) ? (64u << 20) / n : WINDOW;
        size_t cap = (256u << 20) / (n * per);
        int rounds = iters / 4 < (int)cap ? iters / 4 : (int)cap;
        if (rounds < 5) rounds = 5;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int r = 0; r < rounds; r++) {
            for (size_t w = 0; w < per; w++) {
                if (rank == 0) MPI_Isend(buf, (int)n, MPI_BYTE, peer, 2, MPI_COMM_WORLD, &req[w]);
                else MPI_Irecv(rbuf, (int)n, MPI_BYTE, peer, 2, MPI_COMM_WORLD, &req[w]);
            }
            MPI_Waitall((int)per, req, MPI_STATUSES_IGNORE);
            if (rank == 0) MPI_Recv(rbuf, 1, MPI_BYTE, peer, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            else MPI_Send(buf, 1, MPI_BYTE, peer, 3, MPI_COMM_WORLD);
        }
        double secs = MPI_Wtime() - t0;
        if (rank == 0) printf("bandwidth_GBps %zu %.6f\n", n, (double)n * per * rounds / secs / 1e9);
    }
    {
        int rounds = iters / 4 + 1;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int r = 0; r < rounds; r++) {
            for (int w = 0; w < WINDOW; w++) {
                if (rank == 0) MPI_Isend(buf, 8, MPI_BYTE, peer, 4, MPI_COMM_WORLD, &req[w]);
                else MPI_Irecv(rbuf + 8 * w, 8, MPI_BYTE, peer, 4, MPI_COMM_WORLD, &req[w]);
            }
            MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
            if (rank == 0) MPI_Recv(rbuf, 1, MPI_BYTE, peer, 5, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            else MPI_Send(buf, 1, MPI_BYTE, peer, 5, MPI_COMM_WORLD);
        }
        double secs = MPI_Wtime() - t0;
        if (rank == 0) printf("msgrate_Mps 8 %.3f\n", (double)WINDOW * rounds / secs / 1e6);
    }
    free(samples);
    free(buf);
    free(rbuf);
    MPI_Finalize();
    return 0;
}
