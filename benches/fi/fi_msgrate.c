/* Tagged message rate over one libfabric provider: two processes (this one and a
 * forked child, names exchanged over a socketpair), the parent streams windows
 * of WINDOW tagged messages of SIZE bytes, the child receives them into
 * pre-posted buffers and answers each window with a 1-byte ack. Needed because
 * fi_pingpong has no window, and OpenMPI 4.1's mtl ofi cannot run over
 * libfabric's shm (it asks for FI_REMOTE_COMM, which shm lacks).
 *   fi_msgrate -p <provider> [-d <domain>] [-w window] [-s size] [-n rounds]
 * Prints: msgrate_Mps <size> <million messages/s>
 *
 * With -W instead (benches/warmup.sh): the start-up of a fresh process pair.
 * The two ping-pong tagged messages of SIZE bytes, ROUNDS times, and the
 * parent times every round trip from the first (no warm-up), so that a
 * start-up cost (first contact, fresh rings, pools, sleeping progress
 * threads) shows. Needs ROUNDS >= 11000. Prints the mean round trip by ranges
 * of iterations, then
 *   warmup <size> first1000_us <mean of rounds 0-999> steady_us <mean of
 *   rounds 10000-end> ratio <first1000 / steady> */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PROG "fi_msgrate"
#include "check.h"

static struct fid_ep *ep;
static struct fid_cq *cq;
static fi_addr_t peer;
static void *desc;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Reaps n completions, busy polling. */
static void reap(int n) {
    struct fi_cq_entry e[64];
    while (n > 0) {
        ssize_t r = fi_cq_read(cq, e, n < 64 ? n : 64);
        if (r > 0) {
            n -= (int)r;
        } else if (r != -FI_EAGAIN) {
            struct fi_cq_err_entry err = {0};
            fi_cq_readerr(cq, &err, 0);
            fprintf(stderr, "fi_msgrate: cq error %zd: %s\n", r, fi_strerror(err.err));
            exit(1);
        }
    }
}

static void tsend(void *buf, size_t len, uint64_t tag, struct fi_context2 *ctx) {
    ssize_t r;
    while ((r = fi_tsend(ep, buf, len, desc, peer, tag, ctx)) == -FI_EAGAIN) fi_cq_read(cq, NULL, 0);
    CHECK(r);
}

static void trecv(void *buf, size_t len, uint64_t tag, struct fi_context2 *ctx) {
    ssize_t r;
    while ((r = fi_trecv(ep, buf, len, desc, peer, tag, 0, ctx)) == -FI_EAGAIN) fi_cq_read(cq, NULL, 0);
    CHECK(r);
}

int main(int argc, char **argv) {
    const char *prov = NULL, *dom = NULL;
    int window = 64, rounds = 20000, opt, startup = 0;
    size_t size = 8;
    while ((opt = getopt(argc, argv, "p:d:w:s:n:W")) != -1) {
        switch (opt) {
        case 'p': prov = optarg; break;
        case 'd': dom = optarg; break;
        case 'w': window = atoi(optarg); break;
        case 'W': startup = 1; break;
        case 's': size = (size_t)atol(optarg); break;
        case 'n': rounds = atoi(optarg); break;
        default: fprintf(stderr, "usage: fi_msgrate -p prov [-d domain] [-w window | -W] [-s size] [-n rounds]\n"); return 2;
        }
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return 1;
    pid_t child = fork();
    int sender = child != 0, sock = sender ? sv[0] : sv[1];

    struct fi_info *hints = fi_allocinfo(), *info;
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_TAGGED;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    if (prov) hints->fabric_attr->prov_name = strdup(prov);
    if (dom) hints->domain_attr->name = strdup(dom);
    CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info));
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_av *av;
    CHECK(fi_fabric(info->fabric_attr, &fabric, NULL));
    CHECK(fi_domain(fabric, info, &domain, NULL));
    struct fi_cq_attr cqa = {.format = FI_CQ_FORMAT_CONTEXT, .size = 1024};
    CHECK(fi_cq_open(domain, &cqa, &cq, NULL));
    struct fi_av_attr ava = {.type = FI_AV_TABLE};
    CHECK(fi_av_open(domain, &ava, &av, NULL));
    CHECK(fi_endpoint(domain, info, &ep, NULL));
    CHECK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
    CHECK(fi_ep_bind(ep, &av->fid, 0));
    CHECK(fi_enable(ep));

    if (startup && window < 2) window = 2;
    size_t buflen = size * (size_t)window + 64;
    char *buf = calloc(1, buflen);
    struct fid_mr *mr = NULL;
    if (info->domain_attr->mr_mode & FI_MR_LOCAL) {
        CHECK(fi_mr_reg(domain, buf, buflen, FI_SEND | FI_RECV, 0, 0, 0, &mr, NULL));
        desc = fi_mr_desc(mr);
    }
    char name[256], pname[256];
    size_t nlen = sizeof name;
    CHECK(fi_getname(&ep->fid, name, &nlen));
    if (write(sock, &nlen, sizeof nlen) != sizeof nlen || write(sock, name, nlen) != (ssize_t)nlen) return 1;
    size_t plen;
    if (read(sock, &plen, sizeof plen) != sizeof plen || plen > sizeof pname || read(sock, pname, plen) != (ssize_t)plen) return 1;
    if (fi_av_insert(av, pname, 1, &peer, 0, NULL) != 1) {
        fprintf(stderr, "fi_msgrate: fi_av_insert failed\n");
        return 1;
    }
    struct fi_context2 *ctx = calloc((size_t)window + 1, sizeof *ctx);
    char *ack = buf + size * (size_t)window;
    if (startup) {
        double *rtt = calloc((size_t)rounds, sizeof *rtt);
        /* ping-pong of `size` bytes, each round trip timed on the sender */
        for (int r = 0; r < rounds; r++) {
            double t = now();
            if (sender) {
                trecv(buf + size, size, 2, &ctx[1]);
                tsend(buf, size, 1, &ctx[0]);
                reap(2);
                rtt[r] = (now() - t) * 1e6;
            } else {
                trecv(buf, size, 1, &ctx[0]);
                reap(1);
                tsend(buf, size, 2, &ctx[1]);
                reap(1);
            }
        }
        if (sender) {
            int edges[] = {0, 1, 10, 100, 300, 1000, 3000, 10000, rounds};
            for (int k = 0; k + 1 < 9; k++) {
                int lo = edges[k], hi = edges[k + 1] < rounds ? edges[k + 1] : rounds;
                if (lo >= hi) continue;
                double sum = 0, mx = 0; for (int i = lo; i < hi; i++) { sum += rtt[i]; if (rtt[i] > mx) mx = rtt[i]; }
                printf("iters %5d-%5d: mean %8.2f us  max %8.2f us  total %8.1f us\n", lo, hi, sum / (hi - lo), mx, sum);
            }
            double first = 0, steady = 0;
            for (int i = 0; i < 1000 && i < rounds; i++) first += rtt[i];
            for (int i = 10000; i < rounds; i++) steady += rtt[i];
            if (rounds > 10000) {
                first /= 1000; steady /= rounds - 10000;
                printf("warmup %zu first1000_us %.3f steady_us %.3f ratio %.3f\n", size, first, steady, first / steady);
            }
        }
        fflush(stdout);
    } else {
        int warmup = rounds / 10 + 10;
        double t0 = 0;
        for (int r = -warmup; r < rounds; r++) {
            if (r == 0) t0 = now();
            if (sender) {
                trecv(ack, 1, 2, &ctx[window]);
                for (int w = 0; w < window; w++) tsend(buf, size, 1, &ctx[w]);
                reap(window + 1);
            } else {
                for (int w = 0; w < window; w++) trecv(buf + size * w, size, 1, &ctx[w]);
                reap(window);
                tsend(ack, 1, 2, &ctx[window]);
                reap(1);
            }
        }
        double secs = now() - t0;
        if (sender) printf("msgrate_Mps %zu %.3f\n", size, (double)window * rounds / secs / 1e6);
        fflush(stdout);
    }
    /* Let the last ack's sender finish before tearing down. */
    char c = 0;
    if (write(sock, &c, 1) != 1 || read(sock, &c, 1) != 1) return 1;
    if (mr) fi_close(&mr->fid);
    fi_close(&ep->fid);
    fi_close(&av->fid);
    fi_close(&cq->fid);
    fi_close(&domain->fid);
    fi_close(&fabric->fid);
    fi_freeinfo(info);
    fi_freeinfo(hints);
    if (sender) {
        int st;
        waitpid(child, &st, 0);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
    }
    return 0;
}
