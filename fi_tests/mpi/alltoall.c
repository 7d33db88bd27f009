/* An alltoall loop, every element checked: ITERS rounds of MPI_Alltoall at
 * three sizes per peer (8 B eager, 4 KiB medium, 64 KiB rendezvous on shm),
 * each round with different contents, then MPI_Alltoallv with uneven counts.
 * A second argument K (0, 1 or 2) runs the rounds of the K-th size only.
 * With RDMX_A2A_COUNT_QPS=1 each rank, before it finalizes, counts the RC
 * queue pairs the kernel lists for its process (`rdma resource show qp`)
 * and prints "alltoall: rank R holds N RC queue pairs".
 * Prints "alltoall: all checks passed on N ranks, R rounds, H hosts" from
 * rank 0. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include "hosts.h"

#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)

static int rank, size;

static uint32_t word(int from, int to, int round, size_t i) { return (uint32_t)(from * 2654435761u ^ to * 40503u ^ round * 7919u ^ (uint32_t)i * 31u); }

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int iters = argc > 1 ? atoi(argv[1]) : 20;
    int only = argc > 2 ? atoi(argv[2]) : -1;
    int nhosts;
    free(gather_hosts(size, &nhosts));
    size_t words_per_peer[] = {2, 1024, 16384};
    int rounds = 0;
    for (int k = 0; k < 3; k++) {
        if (only >= 0 && k != only) continue;
        size_t n = words_per_peer[k];
        uint32_t *out = malloc(4 * n * size), *in = malloc(4 * n * size);
        CHECK(out && in, "malloc");
        for (int it = 0; it < iters; it++, rounds++) {
            for (int p = 0; p < size; p++) for (size_t i = 0; i < n; i++) out[p * n + i] = word(rank, p, rounds, i);
            MPI_Alltoall(out, (int)n, MPI_UINT32_T, in, (int)n, MPI_UINT32_T, MPI_COMM_WORLD);
            for (int p = 0; p < size; p++) for (size_t i = 0; i < n; i++)
                CHECK(in[p * n + i] == word(p, rank, rounds, i), "round %d, %zu words: element %zu from %d", rounds, n, i, p);
        }
        free(out);
        free(in);
    }
    /* Uneven counts: rank r sends (r + p) % 7 * 100 words to p. */
    int *sc = malloc(sizeof(int) * size), *rc = malloc(sizeof(int) * size), *sd = malloc(sizeof(int) * size), *rd = malloc(sizeof(int) * size);
    int st = 0, rt = 0;
    for (int p = 0; p < size; p++) {
        sc[p] = (rank + p) % 7 * 100; sd[p] = st; st += sc[p];
        rc[p] = (p + rank) % 7 * 100; rd[p] = rt; rt += rc[p];
    }
    uint32_t *vo = malloc(4 * (st + 1)), *vi = malloc(4 * (rt + 1));
    for (int p = 0; p < size; p++) for (int i = 0; i < sc[p]; i++) vo[sd[p] + i] = word(rank, p, -1, i);
    MPI_Alltoallv(vo, sc, sd, MPI_UINT32_T, vi, rc, rd, MPI_UINT32_T, MPI_COMM_WORLD);
    for (int p = 0; p < size; p++) for (int i = 0; i < rc[p]; i++) CHECK(vi[rd[p] + i] == word(p, rank, -1, i), "alltoallv element %d from %d", i, p);
    MPI_Barrier(MPI_COMM_WORLD);
    const char *count_qps = getenv("RDMX_A2A_COUNT_QPS");
    if (count_qps && count_qps[0] == '1') {
        /* The kernel's view, not rdmx's: RC QPs whose owner is this process. */
        char cmd[128], line[512];
        snprintf(cmd, sizeof cmd, "rdma resource show qp 2>/dev/null");
        FILE *f = popen(cmd, "r");
        CHECK(f != NULL, "popen rdma");
        int qps = 0;
        char pid_s[32];
        snprintf(pid_s, sizeof pid_s, " pid %d ", (int)getpid());
        while (fgets(line, sizeof line, f))
            if (strstr(line, " type RC ") && strstr(line, pid_s)) qps++;
        pclose(f);
        printf("alltoall: rank %d holds %d RC queue pairs\n", rank, qps);
        fflush(stdout);
        MPI_Barrier(MPI_COMM_WORLD);
    }
    if (rank == 0) printf("alltoall: all checks passed on %d ranks, %d rounds, %d hosts\n", size, rounds, nhosts);
    MPI_Finalize();
    return 0;
}
