/* Which host each rank runs on, for the MPI programs that span hosts. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Every rank's host name (256 bytes each, by rank, freed by the caller);
 * *nhosts receives how many distinct hosts the job spans. Collective. */
static char *gather_hosts(int size, int *nhosts) {
    char host[256] = {0}, *hosts = malloc(256 * (size_t)size);
    gethostname(host, sizeof host - 1);
    MPI_Allgather(host, 256, MPI_CHAR, hosts, 256, MPI_CHAR, MPI_COMM_WORLD);
    *nhosts = 0;
    for (int i = 0; i < size; i++) {
        int seen = 0;
        for (int j = 0; j < i; j++) seen |= !strcmp(hosts + 256 * i, hosts + 256 * j);
        *nhosts += !seen;
    }
    return hosts;
}
