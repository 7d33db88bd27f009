/* ODP probe: one process, RC QP on rxe1 reads (RDMA READ) from an MR on rxe0.
 * usage: odp_probe pin|odp   (memory registration with or without IBV_ACCESS_ON_DEMAND) */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#define DIE(...) do { fprintf(stderr, __VA_ARGS__); fprintf(stderr, " (errno %d %s)\n", errno, strerror(errno)); exit(1); } while (0)

struct side { struct ibv_context *ctx; struct ibv_pd *pd; struct ibv_cq *cq; struct ibv_qp *qp; union ibv_gid gid; };

static void open_side(struct side *s, const char *name) {
  int n; struct ibv_device **l = ibv_get_device_list(&n);
  for (int i = 0; i < n; i++) if (!strcmp(ibv_get_device_name(l[i]), name)) s->ctx = ibv_open_device(l[i]);
  if (!s->ctx) DIE("open %s", name);
  s->pd = ibv_alloc_pd(s->ctx); s->cq = ibv_create_cq(s->ctx, 16, NULL, NULL, 0);
  struct ibv_qp_init_attr a = { .send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
    .cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 } };
  s->qp = ibv_create_qp(s->pd, &a); if (!s->qp) DIE("create_qp %s", name);
  if (ibv_query_gid(s->ctx, 1, 1, &s->gid)) DIE("query_gid");
  struct ibv_qp_attr m = { .qp_state = IBV_QPS_INIT, .port_num = 1,
    .qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE };
  if (ibv_modify_qp(s->qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) DIE("INIT");
}
static void connect_side(struct side *s, struct side *p) {
  struct ibv_qp_attr m = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_4096, .dest_qp_num = p->qp->qp_num,
    .max_dest_rd_atomic = 16, .min_rnr_timer = 12,
    .ah_attr = { .is_global = 1, .port_num = 1, .grh = { .dgid = p->gid, .sgid_index = 1, .hop_limit = 1 } } };
  if (ibv_modify_qp(s->qp, &m, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) DIE("RTR");
  m.qp_state = IBV_QPS_RTS; m.timeout = 14; m.retry_cnt = 7; m.rnr_retry = 7; m.max_rd_atomic = 16;
  if (ibv_modify_qp(s->qp, &m, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
      IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC)) DIE("RTS");
}
static int rdma_read(struct side *s, void *dst, struct ibv_mr *dmr, void *src, struct ibv_mr *smr, size_t len) {
  struct ibv_sge sg = { .addr = (uintptr_t)dst, .length = len, .lkey = dmr->lkey };
  struct ibv_send_wr wr = { .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED,
    .wr.rdma = { .remote_addr = (uintptr_t)src, .rkey = smr->rkey } }, *bad;
  if (ibv_post_send(s->qp, &wr, &bad)) DIE("post_send");
  struct ibv_wc wc; double t0 = now(); int n;
  while ((n = ibv_poll_cq(s->cq, 1, &wc)) == 0) if (now() - t0 > 20) { printf("  read: no completion in 20 s\n"); return -1; }
  printf("  read %zu bytes: wc status %d (%s) in %.3f ms\n", len, wc.status, ibv_wc_status_str(wc.status), (now() - t0) * 1e3);
  return wc.status;
}
static void check(const char *what, unsigned char *b, size_t len) {
  size_t c[256] = {0}; for (size_t i = 0; i < len; i++) c[b[i]]++;
  printf("  %s: ", what);
  for (int i = 0; i < 256; i++) if (c[i]) printf("%zu x '%c'(0x%02x) ", c[i], i >= 32 && i < 127 ? i : '?', i);
  printf("\n");
}

int main(int argc, char **argv) {
  int odp = argc > 1 && !strcmp(argv[1], "odp");
  int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | (odp ? IBV_ACCESS_ON_DEMAND : 0);
  printf("== mode %s (access 0x%x)\n", odp ? "odp (IBV_ACCESS_ON_DEMAND)" : "pin", acc);
  struct side a = {0}, b = {0};
  open_side(&a, "rxe0"); open_side(&b, "rxe1");
  connect_side(&a, &b); connect_side(&b, &a);

  /* 1: registration time of 256 MiB never touched */
  size_t big = 256u << 20;
  void *m = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  double t0 = now(); struct ibv_mr *mr = ibv_reg_mr(a.pd, m, big, acc); double t1 = now();
  if (!mr) { printf("1. ibv_reg_mr 256 MiB untouched: FAILED errno %d (%s)\n", errno, strerror(errno)); return 2; }
  printf("1. ibv_reg_mr 256 MiB untouched: ok in %.1f ms\n", (t1 - t0) * 1e3);
  t0 = now(); ibv_dereg_mr(mr); printf("   ibv_dereg_mr: %.1f ms\n", (now() - t0) * 1e3);
  munmap(m, big);

  /* 2: read from an MR over untouched memory, then from the same range refilled, then unmapped and
   * mapped again (new pages) at the same address, without registering again */
  size_t len = 1u << 20;
  unsigned char *src = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  unsigned char *dst = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  struct ibv_mr *smr = ibv_reg_mr(a.pd, src, len, acc), *dmr = ibv_reg_mr(b.pd, dst, len, acc);
  if (!smr || !dmr) DIE("reg 1 MiB");
  printf("2a. RDMA READ of 1 MiB from never-touched source into never-touched destination\n");
  rdma_read(&b, dst, dmr, src, smr, len); check("dst", dst, len);
  printf("2b. source filled with 'A' after registration, read again\n");
  memset(src, 'A', len); rdma_read(&b, dst, dmr, src, smr, len); check("dst", dst, len);
  printf("2c. source unmapped, new anonymous pages mapped at the same address filled with 'B', read again (same MR)\n");
  munmap(src, len);
  if (mmap(src, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != src) DIE("remap");
  memset(src, 'B', len); rdma_read(&b, dst, dmr, src, smr, len); check("dst", dst, len);
  printf("2d. destination unmapped and mapped again (new pages, zero), read again into it\n");
  munmap(dst, len);
  if (mmap(dst, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != dst) DIE("remap dst");
  rdma_read(&b, dst, dmr, src, smr, len); check("dst (the process's new pages)", dst, len);
  printf("2e. source unmapped, nothing mapped there, read again\n");
  munmap(src, len);
  int st = rdma_read(&b, dst, dmr, src, smr, len);
  printf("   (status %d)\n", st);
  return 0;
}
