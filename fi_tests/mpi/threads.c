/* MPI_THREAD_MULTIPLE: 4 threads per rank exchange tagged messages concurrently. */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define NTHREADS 4
#define ITERS 200
static int rank, size;

static void *worker(void *arg) {
    int t = (int)(long)arg, peer = rank ^ 1;
    for (int i = 0; i < ITERS; i++) {
        int out = rank * 100000 + t * 1000 + i, in = -1;
        MPI_Sendrecv(&out, 1, MPI_INT, peer, t, &in, 1, MPI_INT, peer, t, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (in != peer * 100000 + t * 1000 + i) {
            fprintf(stderr, "rank %d thread %d: got %d\n", rank, t, in);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (provided != MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "MPI_THREAD_MULTIPLE not provided (%d)\n", provided);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    pthread_t th[NTHREADS];
    for (long t = 0; t < NTHREADS; t++) pthread_create(&th[t], NULL, worker, (void *)t);
    for (int t = 0; t < NTHREADS; t++) pthread_join(th[t], NULL);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) printf("threads: %d threads x %d exchanges passed on %d ranks\n", NTHREADS, ITERS, size);
    MPI_Finalize();
    return 0;
}
