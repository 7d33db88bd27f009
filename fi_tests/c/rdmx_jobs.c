/*
 * rdmx_jobs: one endpoint serving two jobs at once through libfabric's
 * FI_AV_AUTH_KEY (API 1.20), driven as an application would, with nothing
 * but the public libfabric API.
 *
 *   rdmx_jobs server DIR
 *     A domain opened with auth_key_size = FI_AV_AUTH_KEY; its AV holds the
 *     keys of job B (a 32-byte secret: sealed traffic) and job C (an 8-byte
 *     key in clear). One endpoint serves both. It registers one buffer
 *     reachable by job B only and one by job C only (fi_mr_regattr with an
 *     fi_mr_auth_key and FI_AUTH_KEY), inserts each client's address under
 *     its job's key, takes one message from each (checking the sender's
 *     fi_addr and the bytes), answers each, and at the end checks that each
 *     buffer holds exactly what its own job wrote and nothing of the other.
 *     A third receive stays posted: the message of job X (which the endpoint
 *     does not serve) must never complete it.
 *
 *   rdmx_jobs client DIR NAME
 *     An ordinary endpoint of job NAME (B, C or X; its auth_key). B and C
 *     send, receive the answer, then write and read their own job's buffer
 *     (must succeed) and the other job's (must fail with FI_EACCES at the
 *     initiator). X only sends.
 *
 * Rendezvous through files in DIR. Every check prints what failed and exits
 * 1; success prints "<role>: OK".
 *
 * Built with -DRDMX_JOBS_MPI (and an MPI's mpicc), the same roles run as the
 * ranks of one MPI job, whose own traffic goes over rdmx too: rank 0 is the
 * server, rank 1 client X, rank 2 client B, rank 3 client C (two ranks per
 * host put B and C across a wire from the server). The rendezvous goes
 * through MPI messages instead of files; rank 0 ends with "rdmx_jobs: all
 * checks passed on 4 ranks, <n> hosts".
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#ifdef RDMX_JOBS_MPI
#include <mpi.h>
#endif

#define API FI_VERSION(1, 20)
#define BUF 64

static const char SECRET_B[] = "job B's secret, 32 bytes long!!!";
static const char KEY_C[] = "jobCkey!";
static const char SECRET_X[] = "job X's secret, 32 bytes long!!!";

#define FAIL(...)                                                                                                   \
	do {                                                                                                            \
		fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                                                             \
		fprintf(stderr, __VA_ARGS__);                                                                               \
		fprintf(stderr, "\n");                                                                                      \
		exit(1);                                                                                                    \
	} while (0)

#define CHK(call)                                                                                                   \
	do {                                                                                                            \
		int ret_ = (int)(call);                                                                                     \
		if (ret_ < 0)                                                                                               \
			FAIL("%s: %d (%s)", #call, ret_, fi_strerror(-ret_));                                                   \
	} while (0)

#ifndef RDMX_JOBS_MPI
static const char *dir;

static void path(char *out, const char *name)
{
	snprintf(out, 512, "%s/%s", dir, name);
}

static void put_file(const char *name, const void *data, size_t len)
{
	char p[512], tmp[600];
	path(p, name);
	snprintf(tmp, sizeof tmp, "%s.tmp", p);
	FILE *f = fopen(tmp, "wb");
	if (!f || fwrite(data, 1, len, f) != len || fclose(f))
		FAIL("writing %s", tmp);
	if (rename(tmp, p))
		FAIL("renaming %s", tmp);
}

/* Waits (30 s at most) for DIR/name and reads up to len bytes of it. */
static size_t get_file(const char *name, void *data, size_t len)
{
	char p[512];
	path(p, name);
	for (int i = 0; i < 3000; i++) {
		FILE *f = fopen(p, "rb");
		if (f) {
			size_t n = fread(data, 1, len, f);
			fclose(f);
			return n;
		}
		usleep(10000);
	}
	FAIL("no %s after 30 s", p);
}
#else
/* The same rendezvous as MPI messages: each "file" is written by one role
 * and read by the roles listed (S = the server). */
static const struct meeting {
	const char *name;
	char from;
	const char *to;
} meetings[] = {
	{ "server", 'S', "BCX" }, { "ready", 'S', "BCX" }, { "client-B", 'B', "S" }, { "client-C", 'C', "S" },
	{ "client-X", 'X', "" },  { "done-B", 'B', "S" },  { "done-C", 'C', "S" },   { "done-X", 'X', "S" },
};

#define MPI_CHK(call)                                                                                               \
	do {                                                                                                            \
		int rc_ = (call);                                                                                           \
		if (rc_ != MPI_SUCCESS)                                                                                     \
			FAIL("%s: MPI error %d", #call, rc_);                                                                   \
	} while (0)

static int rank_of(char role)
{
	return role == 'S' ? 0 : role == 'X' ? 1 : role == 'B' ? 2 : 3;
}

static int meeting(const char *name)
{
	for (size_t i = 0; i < sizeof meetings / sizeof meetings[0]; i++)
		if (!strcmp(meetings[i].name, name))
			return (int)i;
	FAIL("no meeting %s", name);
}

static void put_file(const char *name, const void *data, size_t len)
{
	int m = meeting(name);
	for (const char *to = meetings[m].to; *to; to++)
		MPI_CHK(MPI_Send(data, (int)len, MPI_BYTE, rank_of(*to), m, MPI_COMM_WORLD));
}

static size_t get_file(const char *name, void *data, size_t len)
{
	int m = meeting(name), n;
	MPI_Status st;
	MPI_CHK(MPI_Recv(data, (int)len, MPI_BYTE, rank_of(meetings[m].from), m, MPI_COMM_WORLD, &st));
	MPI_CHK(MPI_Get_count(&st, MPI_BYTE, &n));
	return (size_t)n;
}
#endif

struct stack {
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_av *av;
	struct fid_ep *ep;
	struct fid_cq *cq;
};

/* The stack over rdmx; `keys_in_av` asks for FI_AV_AUTH_KEY, else the
 * endpoint's auth_key is `key`. */
static void open_stack(struct stack *s, int keys_in_av, const void *key, size_t key_len)
{
	struct fi_info *hints = fi_allocinfo();
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_TAGGED | FI_RMA | FI_SOURCE;
	hints->fabric_attr->prov_name = strdup("rdmx");
	hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_PROV_KEY;
	hints->domain_attr->av_type = FI_AV_TABLE;
	if (keys_in_av) {
		hints->domain_attr->auth_key_size = FI_AV_AUTH_KEY;
		hints->domain_attr->max_ep_auth_key = 2;
	} else {
		hints->ep_attr->auth_key = malloc(key_len);
		memcpy(hints->ep_attr->auth_key, key, key_len);
		hints->ep_attr->auth_key_size = key_len;
	}
	CHK(fi_getinfo(API, NULL, NULL, 0, hints, &s->info));
	fi_freeinfo(hints);
	if (keys_in_av && s->info->domain_attr->auth_key_size != FI_AV_AUTH_KEY)
		FAIL("fi_getinfo did not keep FI_AV_AUTH_KEY");
	if (keys_in_av && s->info->domain_attr->max_ep_auth_key < 2)
		FAIL("max_ep_auth_key %zu", s->info->domain_attr->max_ep_auth_key);
	CHK(fi_fabric(s->info->fabric_attr, &s->fabric, NULL));
	CHK(fi_domain(s->fabric, s->info, &s->domain, NULL));
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	CHK(fi_av_open(s->domain, &av_attr, &s->av, NULL));
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_TAGGED };
	CHK(fi_cq_open(s->domain, &cq_attr, &s->cq, NULL));
}

static void enable(struct stack *s)
{
	CHK(fi_endpoint(s->domain, s->info, &s->ep, NULL));
	CHK(fi_ep_bind(s->ep, &s->av->fid, 0));
	CHK(fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV));
	CHK(fi_enable(s->ep));
}

/* One completion (30 s at most): 0, or the negative error of an error entry. */
static int wait_cq(struct stack *s, struct fi_cq_tagged_entry *e, fi_addr_t *src)
{
	for (long i = 0; i < 30L * 1000 * 1000; i++) {
		ssize_t n = src ? fi_cq_readfrom(s->cq, e, 1, src) : fi_cq_read(s->cq, e, 1);
		if (n == 1)
			return 0;
		if (n == -FI_EAVAIL) {
			struct fi_cq_err_entry err = { 0 };
			CHK(fi_cq_readerr(s->cq, &err, 0));
			return -err.err;
		}
		if (n != -FI_EAGAIN)
			FAIL("fi_cq_read: %zd", n);
		if (i % 1000 == 999)
			usleep(1000);
	}
	FAIL("no completion in 30 s");
}

struct server_file {
	char addr[256];
	size_t addr_len;
	uint64_t key[2], base[2]; /* job B's buffer, job C's */
};

static char buf_b[BUF], buf_c[BUF];

static int server(void)
{
	struct stack s;
	open_stack(&s, 1, NULL, 0);
	fi_addr_t key_b, key_c;
	CHK(fi_av_insert_auth_key(s.av, SECRET_B, strlen(SECRET_B), &key_b, 0));
	CHK(fi_av_insert_auth_key(s.av, KEY_C, strlen(KEY_C), &key_c, 0));
	char got[64];
	size_t got_len = sizeof got;
	CHK(fi_av_lookup_auth_key(s.av, key_b, got, &got_len));
	if (got_len != strlen(SECRET_B) || memcmp(got, SECRET_B, got_len))
		FAIL("fi_av_lookup_auth_key(job B's key) gave %zu other bytes", got_len);
	/* Before enable, on a second AV of the domain: two keys whose packets
	 * would carry the same job key are refused (a 1-byte key 01 and a 2-byte
	 * key 01 00), the same key again is the same key, and an insert under
	 * FI_AUTH_KEY fails only the entries whose slot held no key. */
	struct fid_av *scratch;
	struct fi_av_attr scratch_attr = { .type = FI_AV_TABLE };
	CHK(fi_av_open(s.domain, &scratch_attr, &scratch, NULL));
	fi_addr_t one, again, clash;
	CHK(fi_av_insert_auth_key(scratch, "\x01", 1, &one, 0));
	CHK(fi_av_insert_auth_key(scratch, "\x01", 1, &again, 0));
	if (again != one)
		FAIL("the same key inserted twice got two fi_addr_t's");
	if (fi_av_insert_auth_key(scratch, "\x01\x00", 2, &clash, 0) != -FI_EINVAL)
		FAIL("a key carrying the same job key as another was taken");
	CHK(fi_close(&scratch->fid));
	enable(&s);

	/* One buffer per job, each reachable by its job only. */
	memset(buf_b, 'b', BUF);
	memset(buf_c, 'c', BUF);
	struct fid_mr *mr[2];
	char *bufs[2] = { buf_b, buf_c };
	fi_addr_t keys[2] = { key_b, key_c };
	struct fid_mr *plain;
	if (fi_mr_reg(s.domain, buf_b, BUF, FI_REMOTE_WRITE, 0, 0, 0, &plain, NULL) >= 0)
		FAIL("fi_mr_reg in an FI_AV_AUTH_KEY domain succeeded (fi_mr(3): fi_mr_regattr only)");
	struct server_file sf = { .addr_len = sizeof sf.addr };
	for (int j = 0; j < 2; j++) {
		struct iovec iov = { .iov_base = bufs[j], .iov_len = BUF };
		struct fi_mr_auth_key ak = { .av = s.av, .src_addr = keys[j] };
		struct fi_mr_attr attr = {
			.mr_iov = &iov,
			.iov_count = 1,
			.access = FI_REMOTE_READ | FI_REMOTE_WRITE,
			.auth_key_size = sizeof ak,
			.auth_key = (uint8_t *)&ak,
		};
		CHK(fi_mr_regattr(s.domain, &attr, FI_AUTH_KEY, &mr[j]));
		sf.key[j] = fi_mr_key(mr[j]);
		sf.base[j] = (uint64_t)(uintptr_t)bufs[j];
	}
	CHK(fi_getname(&s.ep->fid, sf.addr, &sf.addr_len));
	put_file("server", &sf, sizeof sf);

	/* Each client's address under its job's key. */
	fi_addr_t peer[2];
	const char *names[2] = { "client-B", "client-C" };
	for (int j = 0; j < 2; j++) {
		char a[256];
		size_t n = get_file(names[j], a, sizeof a);
		fi_addr_t plain_addr;
		if (fi_av_insert(s.av, a, 1, &plain_addr, 0, NULL) == 1)
			FAIL("an address inserted without a key in an FI_AV_AUTH_KEY AV");
		/* The address twice: under its job's key, and under a slot that
		 * holds no key (that entry alone fails). */
		char two[512];
		memcpy(two, a, n);
		memcpy(two + n, a, n);
		fi_addr_t out[2] = { keys[j], 12345 };
		int status[2] = { -1, -1 };
		int ret = fi_av_insert(s.av, two, 2, out, FI_AUTH_KEY | FI_SYNC_ERR, status);
		if (ret != 1 || status[0] != 0 || status[1] != FI_EINVAL || out[1] != FI_ADDR_NOTAVAIL)
			FAIL("fi_av_insert of %s under its key and under no key: %d, status %d %d, fi_addr %#llx", names[j],
			     ret, status[0], status[1], (unsigned long long)out[1]);
		peer[j] = out[0];
	}
	got_len = sizeof got;
	CHK(fi_av_lookup_auth_key(s.av, peer[1], got, &got_len));
	if (got_len != strlen(KEY_C) || memcmp(got, KEY_C, got_len))
		FAIL("fi_av_lookup_auth_key(client C's address) is not job C's key");

	/* Three receives: one message of each job served; the third must never
	 * complete (job X is not served). */
	char in[3][32];
	memset(in, 0, sizeof in);
	for (int i = 0; i < 3; i++)
		CHK(fi_trecv(s.ep, in[i], sizeof in[i], NULL, FI_ADDR_UNSPEC, 0, ~0ULL, &in[i]));
	put_file("ready", "", 0);
	int seen[2] = { 0, 0 };
	for (int i = 0; i < 2; i++) {
		struct fi_cq_tagged_entry e;
		fi_addr_t src = FI_ADDR_NOTAVAIL;
		int ret = wait_cq(&s, &e, &src);
		if (ret)
			FAIL("receive failed: %d", ret);
		char *msg = e.op_context;
		int j = src == peer[0] ? 0 : src == peer[1] ? 1 : -1;
		if (j < 0)
			FAIL("message \"%s\" from fi_addr %#llx, which is neither client's", msg, (unsigned long long)src);
		const char *want = j == 0 ? "from B" : "from C";
		if (strcmp(msg, want))
			FAIL("job %c's sender delivered \"%s\"", "BC"[j], msg);
		seen[j]++;
	}
	if (seen[0] != 1 || seen[1] != 1)
		FAIL("messages per job: %d and %d", seen[0], seen[1]);
	const char *reply[2] = { "to B", "to C" };
	for (int j = 0; j < 2; j++) {
		CHK(fi_tsend(s.ep, reply[j], strlen(reply[j]) + 1, NULL, peer[j], 7, NULL));
		struct fi_cq_tagged_entry e;
		int ret = wait_cq(&s, &e, NULL);
		if (ret)
			FAIL("reply to job %c failed: %d", "BC"[j], ret);
	}
	char done[8];
	get_file("done-B", done, sizeof done);
	get_file("done-C", done, sizeof done);
	get_file("done-X", done, sizeof done);
	/* Each buffer: what its job wrote, and nothing else. */
	char want[BUF];
	for (int j = 0; j < 2; j++) {
		memset(want, j == 0 ? 'b' : 'c', BUF);
		const char *w = j == 0 ? "written by B" : "written by C";
		memcpy(want, w, strlen(w));
		if (memcmp(bufs[j], want, BUF))
			FAIL("job %c's buffer holds \"%.*s\"", "BC"[j], BUF, bufs[j]);
	}
	/* Job X's message reached nothing (it had 200 ms and more). */
	usleep(200000);
	struct fi_cq_tagged_entry e;
	ssize_t n = fi_cq_read(s.cq, &e, 1);
	if (n != -FI_EAGAIN)
		FAIL("a completion after both jobs' messages: %zd (\"%s\")", n, n == 1 ? (char *)e.op_context : "");
	/* A key an enabled endpoint serves cannot be removed. */
	int ret = fi_av_remove(s.av, &key_b, 1, FI_AUTH_KEY);
	if (ret != -FI_EBUSY)
		FAIL("fi_av_remove(job B's key) while its endpoint is open: %d", ret);
	CHK(fi_close(&s.ep->fid));
	CHK(fi_av_remove(s.av, &key_b, 1, FI_AUTH_KEY));
	for (int j = 0; j < 2; j++)
		CHK(fi_close(&mr[j]->fid));
	CHK(fi_close(&s.cq->fid));
	CHK(fi_close(&s.av->fid));
	CHK(fi_close(&s.domain->fid));
	CHK(fi_close(&s.fabric->fid));
	fi_freeinfo(s.info);
	printf("server: OK\n");
	return 0;
}

static int client(const char *name)
{
	const char *key = !strcmp(name, "B") ? SECRET_B : !strcmp(name, "C") ? KEY_C : SECRET_X;
	struct stack s;
	open_stack(&s, 0, key, strlen(key));
	enable(&s);
	char a[256];
	size_t len = sizeof a;
	CHK(fi_getname(&s.ep->fid, a, &len));
	char file[32];
	snprintf(file, sizeof file, "client-%s", name);
	put_file(file, a, len);
	struct server_file sf;
	get_file("server", &sf, sizeof sf);
	fi_addr_t server;
	if (fi_av_insert(s.av, sf.addr, 1, &server, 0, NULL) != 1)
		FAIL("fi_av_insert of the server");
	char ready[4];
	get_file("ready", ready, sizeof ready);
	char msg[32];
	snprintf(msg, sizeof msg, "from %s", name);
	snprintf(file, sizeof file, "done-%s", name);
	if (!strcmp(name, "X")) {
		/* Not a job the server serves: nothing it sends may arrive. */
		CHK(fi_tinject(s.ep, msg, strlen(msg) + 1, server, 1));
		for (int i = 0; i < 300; i++) {
			struct fi_cq_tagged_entry e;
			fi_cq_read(s.cq, &e, 1);
			usleep(1000);
		}
		put_file(file, "", 0);
		printf("client X: OK\n");
		return 0;
	}
	struct fi_cq_tagged_entry e;
	char in[32] = { 0 };
	CHK(fi_trecv(s.ep, in, sizeof in, NULL, FI_ADDR_UNSPEC, 0, ~0ULL, in));
	CHK(fi_tsend(s.ep, msg, strlen(msg) + 1, NULL, server, 1, msg));
	for (int i = 0; i < 2; i++) {
		int ret = wait_cq(&s, &e, NULL);
		if (ret)
			FAIL("client %s: %d", name, ret);
	}
	char want[32];
	snprintf(want, sizeof want, "to %s", name);
	if (strcmp(in, want))
		FAIL("client %s got \"%s\"", name, in);

	/* Its own job's buffer: written and read back. The other job's: both
	 * refused at the initiator with FI_EACCES. */
	int own = !strcmp(name, "B") ? 0 : 1, other = 1 - own;
	char w[32];
	snprintf(w, sizeof w, "written by %s", name);
	CHK(fi_write(s.ep, w, strlen(w), NULL, server, sf.base[own], sf.key[own], NULL));
	int ret = wait_cq(&s, &e, NULL);
	if (ret)
		FAIL("client %s: write to its own job's buffer: %d", name, ret);
	char back[32] = { 0 };
	CHK(fi_read(s.ep, back, strlen(w), NULL, server, sf.base[own], sf.key[own], NULL));
	ret = wait_cq(&s, &e, NULL);
	if (ret || memcmp(back, w, strlen(w)))
		FAIL("client %s: read of its own job's buffer: %d \"%s\"", name, ret, back);
	const char *evil = "OVERWRITTEN BY THE OTHER JOB";
	CHK(fi_write(s.ep, evil, strlen(evil), NULL, server, sf.base[other], sf.key[other], NULL));
	ret = wait_cq(&s, &e, NULL);
	if (ret != -FI_EACCES)
		FAIL("client %s: write to the other job's buffer: %d, not -FI_EACCES", name, ret);
	CHK(fi_read(s.ep, back, 16, NULL, server, sf.base[other], sf.key[other], NULL));
	ret = wait_cq(&s, &e, NULL);
	if (ret != -FI_EACCES)
		FAIL("client %s: read of the other job's buffer: %d, not -FI_EACCES", name, ret);
	put_file(file, "", 0);
	CHK(fi_close(&s.ep->fid));
	CHK(fi_close(&s.cq->fid));
	CHK(fi_close(&s.av->fid));
	CHK(fi_close(&s.domain->fid));
	CHK(fi_close(&s.fabric->fid));
	fi_freeinfo(s.info);
	printf("client %s: OK\n", name);
	return 0;
}

#ifndef RDMX_JOBS_MPI
int main(int argc, char **argv)
{
	if (argc >= 3 && !strcmp(argv[1], "server")) {
		dir = argv[2];
		return server();
	}
	if (argc >= 4 && !strcmp(argv[1], "client")) {
		dir = argv[2];
		return client(argv[3]);
	}
	fprintf(stderr, "usage: %s server DIR | client DIR B|C|X\n", argv[0]);
	return 2;
}
#else
int main(int argc, char **argv)
{
	int rank, size;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (size != 4)
		FAIL("4 ranks wanted (server, clients X, B, C), not %d", size);
	if (rank == 0)
		server();
	else
		client(rank == 1 ? "X" : rank == 2 ? "B" : "C");
	/* Every role passed (a failing one exits 1 and ends the job); count the hosts. */
	char names[4][MPI_MAX_PROCESSOR_NAME] = { { 0 } }, mine[MPI_MAX_PROCESSOR_NAME] = { 0 };
	int len;
	MPI_Get_processor_name(mine, &len);
	MPI_Gather(mine, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0, MPI_COMM_WORLD);
	if (rank == 0) {
		int hosts = 0;
		for (int i = 0; i < 4; i++) {
			int seen = 0;
			for (int j = 0; j < i; j++)
				seen |= !strcmp(names[i], names[j]);
			hosts += !seen;
		}
		printf("rdmx_jobs: all checks passed on 4 ranks, %d hosts\n", hosts);
	}
	MPI_Finalize();
	return 0;
}
#endif
