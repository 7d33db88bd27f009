/* The work of small messages, for instruction counts (callgrind): rank 0
 * sends WINDOWS windows of 64 messages of SIZE bytes (MPI_Isend, then
 * MPI_Waitall) to rank 1, which pre-posts each window's 64 MPI_Irecv and
 * then tells rank 0 to go (a 4-byte message the other way), so that every
 * data message finds its receive posted. Rank 0 only sends data and receives
 * the go-aheads; rank 1 only receives data and sends them: the provider's
 * send entry on rank 0 and its receive entry on rank 1 each see exactly
 * WINDOWS * 64 data messages.
 *
 * benches/src/bin/harness.rs (stage `callgrind`) runs it twice, with two
 * window counts, under `valgrind --tool=callgrind --toggle-collect=...`
 * and takes the difference per message (start-up cancels out).
 *
 * Usage: msg_cost WINDOWS [SIZE]   (SIZE default 8). Run with np 2. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define WINDOW 64

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 2 || size != 2) {
        if (rank == 0)
            fprintf(stderr, "usage: mpirun -np 2 msg_cost WINDOWS [SIZE]\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    long windows = atol(argv[1]);
    size_t n = argc > 2 ? (size_t)atol(argv[2]) : 8;
    char *buf = calloc(WINDOW, n ? n : 1);
    MPI_Request req[WINDOW];
    int go = 0;
    for (long w = 0; w < windows; w++) {
        if (rank == 0) {
            MPI_Recv(&go, 1, MPI_INT, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            for (int i = 0; i < WINDOW; i++)
                MPI_Isend(buf + i * n, (int)n, MPI_CHAR, 1, 0, MPI_COMM_WORLD, &req[i]);
        } else {
            for (int i = 0; i < WINDOW; i++)
                MPI_Irecv(buf + i * n, (int)n, MPI_CHAR, 0, 0, MPI_COMM_WORLD, &req[i]);
            MPI_Send(&go, 1, MPI_INT, 0, 1, MPI_COMM_WORLD);
        }
        MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
    }
    if (rank == 0)
        printf("msg_cost windows %ld messages %ld size %zu\n", windows, windows * WINDOW, n);
    free(buf);
    MPI_Finalize();
    return 0;
}
