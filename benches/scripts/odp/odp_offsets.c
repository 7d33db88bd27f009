/* ODP probe: one process, RC QP on rxe1 reads (RDMA READ) from an MR on rxe0.
 * usage: odp_probe pin|odp   (memory registration with or without IBV_ACCESS_ON_DEMAND) */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <stdint.h>

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


static void one(struct side *a, struct side *b, int acc, size_t soff, size_t doff, size_t len) {
  unsigned char *sm = mmap(NULL, len + 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  unsigned char *dm = mmap(NULL, len + 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  unsigned char *s = sm + soff, *d = dm + doff;
  for (size_t i = 0; i < len; i++) s[i] = (unsigned char)(i * 13 + 1);
  memset(d, 0xee, len);
  struct ibv_mr *smr = ibv_reg_mr(a->pd, s, len, acc), *dmr = ibv_reg_mr(b->pd, d, len, acc);
  if (!smr || !dmr) DIE("reg");
  rdma_read(b, d, dmr, s, smr, len);
  size_t bad = len; for (size_t i = 0; i < len; i++) if (d[i] != s[i]) { bad = i; break; }
  if (bad == len) printf("   src+%zu dst+%zu: OK\n", soff, doff);
  else { size_t sh = 0; for (size_t k = 0; k < 64; k++) if (d[0] == s[k] && d[1] == s[k+1]) { sh = k; break; }
    printf("   src+%zu dst+%zu: first bad byte %zu (got 0x%02x want 0x%02x); dst[0] == src[%zu]\n", soff, doff, bad, d[bad], s[bad], sh); }
  ibv_dereg_mr(smr); ibv_dereg_mr(dmr); munmap(sm, len + 8192); munmap(dm, len + 8192);
}
int main(int argc, char **argv) {
  int odp = argc > 1 && !strcmp(argv[1], "odp");
  int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | (odp ? IBV_ACCESS_ON_DEMAND : 0);
  printf("== mode %s\n", odp ? "odp" : "pin");
  struct side a = {0}, b = {0};
  open_side(&a, "rxe0"); open_side(&b, "rxe1");
  connect_side(&a, &b); connect_side(&b, &a);
  size_t offs[][2] = {{0,0},{0,16},{16,0},{16,16},{0,4000},{100,0}};
  for (int i = 0; i < 6; i++) one(&a, &b, acc, offs[i][0], offs[i][1], 1 << 20);
  return 0;
}
