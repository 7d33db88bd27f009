/* osu_bw / osu_latency-style figures between ranks 0 and 1, every size run for
 * about a fixed time, so that a collapsed run still ends in bounded time.
 *
 * Streaming bandwidth (osu_bw): per window, rank 1 pre-posts WINDOW MPI_Irecv
 * of n bytes, rank 0 posts WINDOW MPI_Isend of n bytes, both MPI_Waitall, then
 * rank 1 sends a 4-byte ack that rank 0 receives. The ack carries rank 1's
 * verdict (0 = go on, 1 = that was the last window): rank 1 stops once the size
 * has run for the target time by its clock, so no size runs much longer than
 * that however slow it is.
 *
 * Latency (osu_latency): ping-pong of n bytes; half the round trip. Rank 1's
 * reply carries the stop flag in its first byte, the same way.
 *
 * Output, rank 0, one line per size (all on stdout):
 *   bw size=<n> MBps=<MB/s> Mmsgs=<million messages/s> windows=<w> secs=<s>
 *      max_window_us=<slowest window> slow_windows=<windows over 1 ms>
 *   lat size=<n> avg_us=<mean one-way> p50_us=<median> max_us=<slowest> iters=<i>
 * (MB = 1e6 bytes, as OSU prints.)
 *
 * Usage: stream_bw [-s sizes] [-w window] [-t seconds per size] [-m bw|lat|both]
 *   -s 8,64,512,4096 (default 8,64,512,4096; up to 4 MiB)
 *   -w 64            (default 64, at most 1024)
 *   -t 1.0           (default 1.0 s per size and test)
 *   -m both          (default both: bandwidth, then latency)
 * Run with np 2. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_WINDOW 1024
#define WARMUP_WINDOWS 10
#define WARMUP_ITERS 100
#define SLOW_WINDOW_US 1000.0

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void bandwidth(int rank, size_t n, int window, double target, char *sbuf, char *rbuf) {
    int peer = 1 - rank;
    MPI_Request req[MAX_WINDOW];
    int ack = 0;
    /* Warm-up windows, untimed, then the timed ones. */
    for (int phase = 0; phase < 2; phase++) {
        long windows = 0;
        double max_us = 0, slow = 0;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (;;) {
            double w0 = MPI_Wtime();
            if (rank == 0) {
                for (int i = 0; i < window; i++) MPI_Isend(sbuf, (int)n, MPI_BYTE, peer, 100, MPI_COMM_WORLD, &req[i]);
                MPI_Waitall(window, req, MPI_STATUSES_IGNORE);
                MPI_Recv(&ack, 1, MPI_INT, peer, 101, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                for (int i = 0; i < window; i++) MPI_Irecv(rbuf, (int)n, MPI_BYTE, peer, 100, MPI_COMM_WORLD, &req[i]);
                MPI_Waitall(window, req, MPI_STATUSES_IGNORE);
                windows++;
                double el = MPI_Wtime() - t0;
                ack = phase == 0 ? windows >= WARMUP_WINDOWS : (el >= target || windows >= 10000000);
                MPI_Send(&ack, 1, MPI_INT, peer, 101, MPI_COMM_WORLD);
            }
            if (rank == 0) {
                windows++;
                double us = (MPI_Wtime() - w0) * 1e6;
                if (us > max_us) max_us = us;
                if (us > SLOW_WINDOW_US) slow++;
            }
            if (ack) break;
        }
        double secs = MPI_Wtime() - t0;
        if (phase == 1 && rank == 0) {
            double msgs = (double)windows * window;
            printf("bw size=%zu MBps=%.3f Mmsgs=%.4f windows=%ld secs=%.3f max_window_us=%.1f slow_windows=%.0f\n", n, msgs * n / secs / 1e6,
                   msgs / secs / 1e6, windows, secs, max_us, slow);
            fflush(stdout);
        }
    }
}

static void latency(int rank, size_t n, double target, char *sbuf, char *rbuf, double *samples, long cap) {
    int peer = 1 - rank;
    if (n == 0) n = 1; /* the stop flag rides in the reply's first byte */
    for (int phase = 0; phase < 2; phase++) {
        long iters = 0;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (;;) {
            double i0 = MPI_Wtime();
            char stop;
            if (rank == 0) {
                MPI_Send(sbuf, (int)n, MPI_BYTE, peer, 200, MPI_COMM_WORLD);
                MPI_Recv(rbuf, (int)n, MPI_BYTE, peer, 200, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                stop = rbuf[0];
            } else {
                MPI_Recv(rbuf, (int)n, MPI_BYTE, peer, 200, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                double el = MPI_Wtime() - t0;
                stop = phase == 0 ? iters + 1 >= WARMUP_ITERS : (el >= target || iters + 1 >= cap);
                sbuf[0] = stop;
                MPI_Send(sbuf, (int)n, MPI_BYTE, peer, 200, MPI_COMM_WORLD);
            }
            if (phase == 1 && rank == 0 && iters < cap) samples[iters] = (MPI_Wtime() - i0) * 1e6 / 2;
            iters++;
            if (stop) break;
        }
        double secs = MPI_Wtime() - t0;
        if (phase == 1 && rank == 0) {
            long k = iters < cap ? iters : cap;
            qsort(samples, k, sizeof(double), cmp);
            printf("lat size=%zu avg_us=%.3f p50_us=%.3f max_us=%.1f iters=%ld\n", n, secs * 1e6 / 2 / iters, samples[k / 2], samples[k - 1], iters);
            fflush(stdout);
        }
    }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, nranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (nranks != 2) {
        if (rank == 0) fprintf(stderr, "stream_bw: run with np 2\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    char sizes_arg[1024] = "8,64,512,4096";
    int window = 64;
    double target = 1.0;
    char mode[16] = "both";
    int c;
    while ((c = getopt(argc, argv, "s:w:t:m:")) != -1) {
        switch (c) {
        case 's': snprintf(sizes_arg, sizeof sizes_arg, "%s", optarg); break;
        case 'w': window = atoi(optarg); break;
        case 't': target = atof(optarg); break;
        case 'm': snprintf(mode, sizeof mode, "%s", optarg); break;
        default:
            if (rank == 0) fprintf(stderr, "usage: stream_bw [-s sizes] [-w window] [-t secs] [-m bw|lat|both]\n");
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (window < 1) window = 1;
    if (window > MAX_WINDOW) window = MAX_WINDOW;
    size_t sizes[64], nsizes = 0, max = 1;
    for (char *tok = strtok(sizes_arg, ","); tok && nsizes < 64; tok = strtok(NULL, ",")) {
        size_t n = (size_t)atol(tok);
        if (n > (4u << 20)) n = 4u << 20;
        sizes[nsizes++] = n;
        if (n > max) max = n;
    }
    char *sbuf = malloc(max), *rbuf = malloc(max);
    memset(sbuf, 'a' + rank, max);
    memset(rbuf, 0, max);
    long cap = 4000000;
    double *samples = malloc(sizeof(double) * (size_t)cap);
    int do_bw = strcmp(mode, "lat") != 0, do_lat = strcmp(mode, "bw") != 0;
    if (do_bw)
        for (size_t s = 0; s < nsizes; s++) bandwidth(rank, sizes[s], window, target, sbuf, rbuf);
    if (do_lat)
        for (size_t s = 0; s < nsizes; s++) latency(rank, sizes[s], target, sbuf, rbuf, samples, cap);
    free(samples);
    free(sbuf);
    free(rbuf);
    MPI_Finalize();
    return 0;
}
