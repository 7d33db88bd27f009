/* The cost of an empty progress call: what `fi_cq_read` costs on an endpoint
 * with nothing to do, as MPICH makes one per MPI_Isend and every busy-polling
 * application makes many per message. One process, two endpoints of one
 * domain that know each other and exchanged one tagged message each way (the
 * state of a job between messages), then POLLS reads of the first
 * endpoint's CQ, each of which finds nothing.
 *
 * benches/src/bin/harness.rs (stage `callgrind`) runs it under
 * `valgrind --tool=callgrind --toggle-collect=<the provider's cq read>` with
 * two poll counts and takes the difference per read (set-up cancels out).
 *
 *   idle_poll -p <provider> [-d <domain>] POLLS
 * Prints: idle_poll <polls> empty <reads that returned -FI_EAGAIN> */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PROG "idle_poll"
#include "check.h"

struct side {
    struct fid_ep *ep;
    struct fid_cq *cq;
    struct fid_av *av;
    fi_addr_t peer;
};

static void open_side(struct fi_info *fi, struct fid_domain *domain, struct side *s) {
    struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_TAGGED, .wait_obj = FI_WAIT_NONE};
    struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
    CHECK(fi_endpoint(domain, fi, &s->ep, NULL));
    CHECK(fi_cq_open(domain, &cq_attr, &s->cq, NULL));
    CHECK(fi_av_open(domain, &av_attr, &s->av, NULL));
    CHECK(fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV));
    CHECK(fi_ep_bind(s->ep, &s->av->fid, 0));
    CHECK(fi_enable(s->ep));
}

/* Busy-polls one CQ until it yields one completion, progressing the other
 * side meanwhile (one process drives both). */
static void reap(struct side *s, struct side *other) {
    struct fi_cq_tagged_entry e;
    for (;;) {
        ssize_t r = fi_cq_read(s->cq, &e, 1);
        if (r == 1)
            return;
        if (r != -FI_EAGAIN) {
            fprintf(stderr, "idle_poll: fi_cq_read: %s\n", fi_strerror((int)-r));
            exit(1);
        }
        (void)fi_cq_read(other->cq, &e, 0);
    }
}

static void exchange(struct side *from, struct side *to) {
    char out = 1, in = 0;
    ssize_t r;
    CHECK(fi_trecv(to->ep, &in, 1, NULL, to->peer, 7, 0, NULL));
    while ((r = fi_tsend(from->ep, &out, 1, NULL, from->peer, 7, NULL)) == -FI_EAGAIN)
        reap(to, from);
    CHECK(r);
    reap(from, to);
    reap(to, from);
}

int main(int argc, char **argv) {
    const char *prov = NULL, *dom = NULL;
    int c;
    while ((c = getopt(argc, argv, "p:d:")) != -1) {
        if (c == 'p')
            prov = optarg;
        else if (c == 'd')
            dom = optarg;
    }
    if (!prov || optind >= argc) {
        fprintf(stderr, "usage: idle_poll -p <provider> [-d <domain>] POLLS\n");
        return 2;
    }
    long polls = atol(argv[optind]);
    struct fi_info *hints = fi_allocinfo(), *fi;
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_TAGGED;
    hints->mode = FI_CONTEXT;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->fabric_attr->prov_name = strdup(prov);
    if (dom)
        hints->domain_attr->name = strdup(dom);
    CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &fi));
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    CHECK(fi_fabric(fi->fabric_attr, &fabric, NULL));
    CHECK(fi_domain(fabric, fi, &domain, NULL));
    struct side a, b;
    open_side(fi, domain, &a);
    open_side(fi, domain, &b);
    char name_a[256], name_b[256];
    size_t la = sizeof name_a, lb = sizeof name_b;
    CHECK(fi_getname(&a.ep->fid, name_a, &la));
    CHECK(fi_getname(&b.ep->fid, name_b, &lb));
    if (fi_av_insert(a.av, name_b, 1, &a.peer, 0, NULL) != 1 || fi_av_insert(b.av, name_a, 1, &b.peer, 0, NULL) != 1) {
        fprintf(stderr, "idle_poll: fi_av_insert failed\n");
        return 1;
    }
    exchange(&a, &b);
    exchange(&b, &a);
    /* Let any delayed ack and the peers' timers run out, so what follows is
     * idle (a real job's gap between messages). */
    for (int i = 0; i < 100; i++) {
        struct fi_cq_tagged_entry e;
        (void)fi_cq_read(a.cq, &e, 1);
        (void)fi_cq_read(b.cq, &e, 1);
        usleep(1000);
    }
    long empty = 0;
    struct fi_cq_tagged_entry e;
    for (long i = 0; i < polls; i++)
        empty += fi_cq_read(a.cq, &e, 1) == -FI_EAGAIN;
    printf("idle_poll %ld empty %ld\n", polls, empty);
    fi_close(&a.ep->fid);
    fi_close(&b.ep->fid);
    fi_close(&a.cq->fid);
    fi_close(&b.cq->fid);
    fi_close(&a.av->fid);
    fi_close(&b.av->fid);
    fi_close(&domain->fid);
    fi_close(&fabric->fid);
    fi_freeinfo(fi);
    return 0;
}
