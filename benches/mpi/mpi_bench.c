/* MPI point-to-point figures between ranks 0 and 1: ping-pong latency (half the
 * round trip), streaming bandwidth (a window of 64 non-blocking sends, one ack),
 * and message rate (8-byte messages, windows of 64). Prints one line per figure:
 *   latency_us <bytes> <median us>
 *   bandwidth_GBps <bytes> <GB/s>
 *   msgrate_Mps 8 <million messages/s>
 * Usage: mpi_bench [iterations]  (run with np 2). */
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
    size_t lat_sizes[] = {8, 1024, 65536, 1 << 20};
    double *samples = malloc(sizeof(double) * iters);
    for (unsigned s = 0; s < sizeof lat_sizes / sizeof *lat_sizes; s++) {
        size_t n = lat_sizes[s];
        int it = n >= 65536 ? iters / 10 + 1 : iters;
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
    size_t bw_sizes[] = {65536, 1 << 20};
    MPI_Request req[WINDOW];
    for (unsigned s = 0; s < 2; s++) {
        size_t n = bw_sizes[s];
        int rounds = 20;
        size_t per = n * WINDOW > (64u << 20) ? (64u << 20) / n : WINDOW;
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
        if (rank == 0) printf("bandwidth_GBps %zu %.3f\n", n, (double)n * per * rounds / secs / 1e9);
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
