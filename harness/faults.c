/*
 * faults.c: `ncclnet-harness faults SCENARIO`, the fault-injection driver of
 * the reliability lane (docs/reliability.md, scripts/faults/run.sh).
 *
 * Each scenario runs the two ranks as the other commands do (forked before
 * the plugin is loaded, watched by the parent), drives the plugin only
 * through the C ABI, and injects the fault from outside the ranks the way
 * the world does: a third process forked from the parent (never loads the
 * plugin) SIGKILLs or SIGSTOPs a rank, or runs a command (the lane's
 * `ip link set ... down`), when the transfer is under way. The ranks record
 * facts (when each saw its first error, which call, what result, whether
 * every byte arrived); the parent judges them against the scenario's bound
 * and prints every figure. Nothing here depends on the transport or on
 * network namespaces: --netns puts rank 0 / rank 1 into named namespaces
 * when a lane provides them, and listen ports are found through /proc, not by
 * reading a transport's handle.
 *
 * Rank 0 receives (and listens), rank 1 sends (and connects).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define RECV 0
#define SEND 1
#define MAX_LISTEN 8
#define MAX_TCP_STREAMS 16
#define FWINDOW 8

/* ------------------------------------------------------------ options */

enum { SC_SLOW_RECV, SC_KILL, SC_CONNECT_REFUSED, SC_CONNECT_BLACKHOLE, SC_TRANSFER, SC_STRAY, SC_ABORT, SC_N };
static const char* const SC_NAMES[SC_N] = {"slow-recv", "kill", "connect-refused", "connect-blackhole",
                                           "transfer", "stray", "abort"};

enum { FAULT_NONE, FAULT_KILL, FAULT_STOP, FAULT_CMD };

typedef struct {
  int scenario;
  opts_t base;          /* plugin, version (pick_version reads these) */
  const char* netns[2];
  double peer_timeout;  /* NCCL_GO_TIMEOUT as the plugin will read it, seconds (<= 0: off) */
  size_t size;
  int iters;
  int trials;
  int rounds;
  double hold;          /* slow-recv: receiver's delay before posting; --fault stop: how long */
  double within;        /* bound on detecting a failure (kill, connect, transfer --expect error) */
  int fault;            /* transfer / kill: what the injector does */
  int victim;           /* RECV, SEND, or -1: alternate per trial */
  const char* cmd;      /* --fault cmd: shell command */
  int fault_after;      /* inject once the receiver completed this many messages (transfer) */
  double kill_spread;   /* kill: inject at a random point in [0, spread] s after the transfer starts */
  double fork_child;    /* > 0: once connected, each rank forks a child that lives this long (a DataLoader worker) */
  bool expect_error;    /* transfer: the fault must end the transfer on both ranks within --within */
  int tcp_streams;      /* transfer: plain-TCP baseline over the same path (0: none, -1: as many as the plugin opened) */
  double tcp_secs;      /* transfer: the baseline runs this long at most */
  int strays;           /* stray: connections of each kind, per phase */
  uint64_t seed;
  double limit;         /* watchdog: one run (one trial) may take this long */
} fopts_t;

/* ------------------------------------------------- shared fault record */

enum { PH_START, PH_OPEN, PH_LINKED, PH_XFER, PH_DONE };

/* Facts the ranks and the injector record; the parent judges them. Lives in
 * a MAP_SHARED mapping made before any fork. */
typedef struct {
  atomic_int pid[2];
  atomic_int phase[2];
  atomic_int msgs_done[2];
  atomic_ullong xfer_start_ns[2];
  atomic_ullong done_ns[2];      /* rank finished its transfer (success) */
  atomic_int verified[2];        /* receiver: every byte checked; sender: every send completed */
  atomic_ullong err_ns[2];       /* first error a rank saw, 0 = none */
  atomic_int err_res[2];
  char err_call[2][48];
  char err_warn[2][320];
  atomic_ullong fault_ns;        /* injection started */
  atomic_ullong fault_end_ns;    /* injection over (SIGCONT sent, command returned) */
  atomic_int fault_rc;           /* command exit status, or -1 */
  atomic_int injected;
  /* transfer */
  atomic_ullong xfer_ns[2];        /* the transfer (after a hold), as the rank timed it */
  atomic_ullong pending_max_ns[2]; /* longest a request stayed pending */
  atomic_int tcp_streams;          /* plain-TCP baseline, as the receiver saw it */
  atomic_ullong tcp_ns, tcp_bytes;
  /* connect */
  atomic_int connect_outcome;      /* 0: still pending when given up, 1: error, 2: connected */
  atomic_ullong connect_ns, finalize_ns;
  /* stray */
  atomic_int strays_made, strays_refused, hanging_at_connect, hanging_at_close;
  atomic_ullong setup_ns[2];       /* connect / accept of the real connection */
  atomic_int warns[2];
  /* stray, abort: -1 until measured */
  atomic_int fds_base[2], fds_after[2], fds_settled[2];
  atomic_int threads_base[2], threads_end[2], threads_max[2];
  /* abort */
  atomic_int rounds_done[2], late_rounds[2], plugin_errors[2], abandoned[2], worst_round[2];
  atomic_ullong worst_round_ns[2];
  char note[2][1024];
} fshm_t;

typedef struct {
  const fopts_t* o;
  int version;
  fshm_t* f;
  int trial;
  int victim;
  uint64_t rng;
} fctx_t;

/* ---------------------------------------------------------------- small */

static uint64_t rng_next(uint64_t* s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static double rng_unit(uint64_t* s) { return (double)(rng_next(s) >> 11) / (double)(1ull << 53); }

static double secs_since(uint64_t t0) { return t0 ? (double)(now_ns() - t0) / 1e9 : 0; }
static double secs_between(uint64_t a, uint64_t b) { return (double)((int64_t)(b - a)) / 1e9; }

static int count_fds(void) {
  DIR* d = opendir("/proc/self/fd");
  if (d == NULL) return -1;
  int n = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n - 1; /* the directory's own descriptor */
}

/* NCCL_GO_TIMEOUT as seconds: a number, or a number with s / ms / m, as the
 * plugin accepts; 300 when unset. NAN when this driver cannot read it. */
static double env_peer_timeout(void) {
  const char* v = getenv("NCCL_GO_TIMEOUT");
  if (v == NULL || *v == 0) return 300;
  char* end;
  double x = strtod(v, &end);
  if (end == v) return NAN;
  if (*end == 0 || !strcmp(end, "s")) return x;
  if (!strcmp(end, "ms")) return x / 1000;
  if (!strcmp(end, "m")) return x * 60;
  return NAN;
}

static int enter_netns(const char* name, char* why, size_t wl) {
  char path[300];
  if (strchr(name, '/')) snprintf(path, sizeof path, "%s", name);
  else snprintf(path, sizeof path, "/run/netns/%s", name);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    snprintf(why, wl, "cannot open network namespace %s: %s", path, strerror(errno));
    return -1;
  }
  int rc = setns(fd, CLONE_NEWNET);
  int e = errno;
  close(fd);
  if (rc != 0) {
    snprintf(why, wl, "setns(%s): %s (needs CAP_SYS_ADMIN)", path, strerror(e));
    return -1;
  }
  return 0;
}

/* ------------------------------------------------------ /proc/net/tcp */

typedef struct {
  int family;
  uint8_t addr[16];
  uint16_t port;
  int state;
  unsigned long inode;
} sockent_t;

#define TCP_ST_ESTABLISHED 1
#define TCP_ST_LISTEN 10

static int my_socket_inodes(unsigned long* out, int max) {
  DIR* d = opendir("/proc/self/fd");
  if (d == NULL) return 0;
  int n = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL && n < max) {
    char p[300], l[64];
    snprintf(p, sizeof p, "/proc/self/fd/%s", e->d_name);
    ssize_t k = readlink(p, l, sizeof l - 1);
    if (k <= 0) continue;
    l[k] = 0;
    unsigned long ino;
    if (sscanf(l, "socket:[%lu]", &ino) == 1) out[n++] = ino;
  }
  closedir(d);
  return n;
}

/* This process's TCP sockets in state (0 = any), from the namespace's tables. */
static int my_tcp_sockets(int state, sockent_t* out, int max) {
  unsigned long ino[1024];
  int nino = my_socket_inodes(ino, 1024);
  int n = 0;
  const char* files[2] = {"/proc/self/net/tcp", "/proc/self/net/tcp6"};
  for (int fi = 0; fi < 2; fi++) {
    FILE* f = fopen(files[fi], "r");
    if (f == NULL) continue;
    char line[512];
    if (fgets(line, sizeof line, f) == NULL) { /* header */
      fclose(f);
      continue;
    }
    while (fgets(line, sizeof line, f) && n < max) {
      char la[64];
      unsigned port, st;
      unsigned long inode;
      if (sscanf(line, " %*d: %63[0-9A-Fa-f]:%x %*64[0-9A-Fa-f]:%*x %x %*x:%*x %*x:%*x %*x %*u %*u %lu", la, &port, &st,
                 &inode) != 4)
        continue;
      if (state && (int)st != state) continue;
      bool mine = false;
      for (int i = 0; i < nino && !mine; i++) mine = ino[i] == inode;
      if (!mine) continue;
      sockent_t* s = &out[n];
      memset(s, 0, sizeof *s);
      s->port = (uint16_t)port;
      s->state = (int)st;
      s->inode = inode;
      int words = fi == 0 ? 1 : 4;
      s->family = fi == 0 ? AF_INET : AF_INET6;
      for (int w = 0; w < words; w++) {
        char h[9];
        memcpy(h, la + 8 * w, 8);
        h[8] = 0;
        uint32_t x = (uint32_t)strtoul(h, NULL, 16);
        memcpy(s->addr + 4 * w, &x, 4); /* the kernel prints each 32-bit word as it sits in memory */
      }
      n++;
    }
    fclose(f);
  }
  return n;
}

static bool sockent_wildcard(const sockent_t* s) {
  static const uint8_t zero[16];
  return memcmp(s->addr, zero, s->family == AF_INET ? 4 : 16) == 0;
}

static socklen_t sockent_addr(const sockent_t* s, uint16_t port, struct sockaddr_storage* ss) {
  memset(ss, 0, sizeof *ss);
  if (s->family == AF_INET) {
    struct sockaddr_in* a = (struct sockaddr_in*)ss;
    a->sin_family = AF_INET;
    a->sin_port = htons(port);
    if (sockent_wildcard(s)) a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    else memcpy(&a->sin_addr, s->addr, 4);
    return sizeof *a;
  }
  struct sockaddr_in6* a = (struct sockaddr_in6*)ss;
  a->sin6_family = AF_INET6;
  a->sin6_port = htons(port);
  if (sockent_wildcard(s)) a->sin6_addr = in6addr_loopback;
  else memcpy(&a->sin6_addr, s->addr, 16);
  return sizeof *a;
}

/* ------------------------------------------------------------- records */

static void note(rank_t* r, fctx_t* c, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static void note(rank_t* r, fctx_t* c, const char* fmt, ...) {
  char* out = c->f->note[r->rank];
  size_t used = strnlen(out, sizeof c->f->note[0]);
  if (used >= sizeof c->f->note[0] - 1) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(out + used, sizeof c->f->note[0] - used, fmt, ap);
  va_end(ap);
}

/* The first error a rank sees is the fact scenarios are judged on. */
static void record_error(rank_t* r, fctx_t* c, const char* call, ncclResult_t res) {
  fshm_t* f = c->f;
  if (atomic_load(&f->err_ns[r->rank]) != 0) return;
  snprintf(f->err_call[r->rank], sizeof f->err_call[0], "%s", call);
  harness_last_warn(f->err_warn[r->rank], sizeof f->err_warn[0]);
  atomic_store(&f->err_res[r->rank], (int)res);
  atomic_store(&f->err_ns[r->rank], now_ns());
}

static void set_phase(rank_t* r, fctx_t* c, int ph) { atomic_store(&c->f->phase[r->rank], ph); }

/* ------------------------------------------------------- rank set-up */

static int rank_begin(rank_t* r, fctx_t* c, net_t* n, hprops_t* p, char* why, size_t wl) {
  fshm_t* f = c->f;
  atomic_store(&f->pid[r->rank], (int)getpid());
  atomic_store(&r->shm->cur_start_ns[r->rank], now_ns());
  atomic_store(&r->shm->cur[r->rank], 0);
  r->deadline_ns = now_ns() + (uint64_t)(rank_budget(r->timeout) * 1e9);
  const char* ns = c->o->netns[r->rank];
  if (ns && *ns) {
    set_where(r, "entering network namespace %s", ns);
    if (enter_netns(ns, why, wl) != 0) return -1;
  }
  if (rank_open(r, n, c->o->base.plugin, c->version, p, why, wl) != 0) return -1;
  set_phase(r, c, PH_OPEN);
  return 0;
}

/* One direction, as NCCL's p2p connections are: rank 0 listens and accepts,
 * rank 1 connects; both poll without blocking. The listener's port is found
 * by comparing this process's listening sockets before and after listen. */
typedef struct {
  void* lc;
  void* comm; /* rank 0: recvComm, rank 1: sendComm */
  char handle[NCCL_NET_HANDLE_MAXSIZE];
  sockent_t listen[MAX_LISTEN];
  int nlisten;
} flink_t;

static int flisten(rank_t* r, net_t* n, flink_t* l, char* why, size_t wl) {
  sockent_t before[64];
  int nb = my_tcp_sockets(TCP_ST_LISTEN, before, 64);
  set_where(r, "listen");
  ncclResult_t res = net_listen(n, 0, l->handle, &l->lc);
  if (res != ncclSuccess || l->lc == NULL) {
    snprintf(why, wl, "listen returned %s with listenComm %p", result_str(res), l->lc);
    return -1;
  }
  sockent_t after[64];
  int na = my_tcp_sockets(TCP_ST_LISTEN, after, 64);
  l->nlisten = 0;
  for (int i = 0; i < na && l->nlisten < MAX_LISTEN; i++) {
    bool old = false;
    for (int j = 0; j < nb && !old; j++) old = before[j].inode == after[i].inode;
    if (!old) l->listen[l->nlisten++] = after[i];
  }
  return 0;
}

static int send_handle(rank_t* r, const flink_t* l) {
  return ctl_send(r, l->handle, sizeof l->handle) != 0 || ctl_send(r, l->listen, sizeof l->listen) != 0 ||
                 ctl_send(r, &l->nlisten, sizeof l->nlisten) != 0
             ? -1
             : 0;
}

static int recv_handle(rank_t* r, flink_t* l, double timeout_s) {
  set_where(r, "waiting for the listen handle");
  return ctl_recv(r, l->handle, sizeof l->handle, timeout_s) != 0 || ctl_recv(r, l->listen, sizeof l->listen, timeout_s) != 0 ||
                 ctl_recv(r, &l->nlisten, sizeof l->nlisten, timeout_s) != 0
             ? -1
             : 0;
}

/* Polls accept (rank 0) or connect (rank 1) until the comm exists. */
static int flink_poll(rank_t* r, fctx_t* c, net_t* n, flink_t* l, double timeout_s, char* why, size_t wl) {
  ncclNetDeviceHandle_v8_t* dh = NULL;
  ncclNetCommConfig_v10_t cfg = {NCCL_NET_TRAFFIC_CLASS_UNDEF};
  const char* call = r->rank == RECV ? "accept" : "connect";
  uint64_t until = now_ns() + (uint64_t)(timeout_s * 1e9);
  set_where(r, "%s loop", call);
  while (l->comm == NULL) {
    ncclResult_t res = r->rank == RECV ? net_accept(n, l->lc, &l->comm, &dh)
                                       : net_connect(n, 0, &cfg, l->handle, &l->comm, &dh);
    if (res != ncclSuccess) {
      record_error(r, c, call, res);
      snprintf(why, wl, "%s returned %s", call, result_str(res));
      return -1;
    }
    if (l->comm) break;
    if (now_ns() > until) {
      snprintf(why, wl, "%s not done after %.0f s", call, timeout_s);
      return -1;
    }
    if (peer_failed(r)) {
      snprintf(why, wl, "the other rank failed during connection set-up");
      return -1;
    }
    sched_yield();
  }
  set_phase(r, c, PH_LINKED);
  return 0;
}

static int flink_up(rank_t* r, fctx_t* c, net_t* n, flink_t* l, double timeout_s, char* why, size_t wl) {
  memset(l, 0, sizeof *l);
  if (r->rank == RECV ? flisten(r, n, l, why, wl) != 0 || send_handle(r, l) != 0 : recv_handle(r, l, timeout_s) != 0) {
    if (!why[0]) snprintf(why, wl, "could not exchange the listen handle with the other rank");
    return -1;
  }
  return flink_poll(r, c, n, l, timeout_s, why, wl);
}

static void flink_down(net_t* n, flink_t* l, int rank) {
  if (l->comm) {
    if (rank == RECV) net_close_recv(n, l->comm);
    else net_close_send(n, l->comm);
  }
  if (l->lc) net_close_listen(n, l->lc);
  l->comm = l->lc = NULL;
}

/* ------------------------------------------------------------ transfer */

typedef struct {
  size_t size;
  int iters;
  double hold;       /* receiver: wait this long after the start barrier before posting anything */
  bool until_error;  /* post forever (kill): stop at the first error or the deadline */
  uint8_t* arena;
  size_t slot;
  int nbuf;
  void* mh;
  double give_up;    /* > 0: stop waiting this long after the injected fault (the error never came) */
  double secs;       /* result: transfer time */
  double pending_max;/* result: longest a request stayed pending (s) */
} xfer_t;

/* A ring of up to FWINDOW buffers, filled once (sender) with the pattern of
 * the slot; each message also carries its own index in its first word and
 * every 4 KiB after it (ring_stamp), so a buffer left holding an earlier
 * message, a message delivered twice or only in part, is caught as surely as
 * a wrong byte (until 2026-11-28 only the first 8 bytes were stamped). The receiver checks every byte of each
 * message before its buffer is posted again (inside the timing: GB/s figures
 * include it). Memory stays at FWINDOW x size per rank whatever the count. */
static int xfer_prepare(rank_t* r, net_t* n, void* comm, xfer_t* x, char* why, size_t wl) {
  x->slot = (x->size + 4095) & ~(size_t)4095;
  if (x->slot == 0) x->slot = 4096;
  x->nbuf = x->until_error || x->iters > FWINDOW ? FWINDOW : x->iters;
  size_t len = x->slot * (size_t)x->nbuf;
  x->arena = buf_alloc(len);
  if (x->arena == NULL) {
    snprintf(why, wl, "cannot allocate %zu bytes", len);
    return -1;
  }
  ncclResult_t res = net_regmr(n, comm, x->arena, len, NCCL_PTR_HOST, &x->mh);
  if (res != ncclSuccess) {
    snprintf(why, wl, "regMr of %zu bytes returned %s", len, result_str(res));
    return -1;
  }
  set_where(r, "preparing buffers");
  for (int k = 0; k < x->nbuf; k++) {
    if (r->rank == SEND) pattern_fill(x->arena + (size_t)k * x->slot, x->size, (uint64_t)k);
    else memset(x->arena + (size_t)k * x->slot, 0, x->size);
  }
  return 0;
}


static void xfer_release(net_t* n, void* comm, xfer_t* x) {
  if (x->mh) net_deregmr(n, comm, x->mh);
  buf_free(x->arena, x->slot * (size_t)x->nbuf);
  x->arena = NULL;
  x->mh = NULL;
}

/* Hold without calling the plugin, as a rank busy elsewhere (a checkpoint)
 * would; keeps the watchdog informed that the harness itself is alive. */
static void hold_off(rank_t* r, double secs) {
  uint64_t until = now_ns() + (uint64_t)(secs * 1e9);
  while (now_ns() < until) {
    set_where(r, "not posting for %.1f s (%.1f s left)", secs, (double)(until - now_ns()) / 1e9);
    sleep_ms(50);
  }
}

/* One isend, or a one-buffer irecv, with tag 1 and no profiler handle. */
static ncclResult_t post_req(net_t* n, bool send, void* comm, void* buf, size_t size, void* mh, void** req) {
  if (send) return net_isend(n, comm, buf, size, 1, mh, NULL, req);
  void* data[1] = {buf};
  size_t sz[1] = {size};
  int tags[1] = {1};
  void* mhs[1] = {mh};
  return net_irecv(n, comm, 1, data, sz, tags, mhs, NULL, req);
}

/* Moves x->iters messages (or, with until_error, as many as it takes to see
 * an error). 0: completed and verified; 1: the plugin returned an error
 * (recorded); -1: the harness gave up (deadline, wrong bytes; why says). */
static int xfer_run(rank_t* r, fctx_t* c, net_t* n, void* comm, xfer_t* x, char* why, size_t wl) {
  bool sender = r->rank == SEND;
  fshm_t* f = c->f;
  void* reqs[FWINDOW];
  uint64_t posted_at[FWINDOW];
  int posted = 0, completed = 0;
  int total = x->until_error ? 1 << 30 : x->iters;
  atomic_store(&f->xfer_start_ns[r->rank], now_ns()); /* a hold counts: the peer's clock runs through it */
  if (!sender && x->hold > 0) hold_off(r, x->hold);
  set_where(r, sender ? "sending" : "receiving");
  set_phase(r, c, PH_XFER);
  uint64_t t0 = now_ns();
  while (completed < total) {
    while (posted < total && posted - completed < FWINDOW) {
      int b = posted % x->nbuf;
      uint8_t* buf = x->arena + (size_t)b * x->slot;
      if (sender) ring_stamp(buf, x->size, (uint64_t)posted);
      void* req = (void*)0x1;
      ncclResult_t res = post_req(n, sender, comm, buf, x->size, x->mh, &req);
      if (res != ncclSuccess) {
        record_error(r, c, sender ? "isend" : "irecv", res);
        snprintf(why, wl, "%s #%d returned %s", sender ? "isend" : "irecv", posted, result_str(res));
        return 1;
      }
      if (req == (void*)0x1) {
        snprintf(why, wl, "%s #%d left *request untouched", sender ? "isend" : "irecv", posted);
        return -1;
      }
      if (req == NULL) break; /* no request free: NCCL retries later */
      reqs[posted % FWINDOW] = req;
      posted_at[posted % FWINDOW] = now_ns();
      posted++;
    }
    if (posted == completed) {
      uint64_t fault = atomic_load(&f->fault_ns);
      if (x->give_up > 0 && fault && now_ns() > fault + (uint64_t)(x->give_up * 1e9)) {
        snprintf(why, wl, "no error %.1f s after the fault: %s #%d could not even be posted", x->give_up,
                 sender ? "isend" : "irecv", posted);
        return -1;
      }
      if (past_deadline(r)) {
        snprintf(why, wl, "%s could not post #%d before the deadline", sender ? "isend" : "irecv", posted);
        return -1;
      }
      sched_yield();
      continue;
    }
    int done = 0, got[1] = {-1};
    ncclResult_t res = net_test(n, reqs[completed % FWINDOW], &done, got);
    if (res != ncclSuccess) {
      record_error(r, c, sender ? "test(send)" : "test(recv)", res);
      snprintf(why, wl, "test on %s #%d returned %s", sender ? "send" : "recv", completed, result_str(res));
      return 1;
    }
    if (!done) {
      uint64_t fault = atomic_load(&f->fault_ns);
      if (x->give_up > 0 && fault && now_ns() > fault + (uint64_t)(x->give_up * 1e9)) {
        snprintf(why, wl, "no error %.1f s after the fault: %s #%d still pending", x->give_up, sender ? "send" : "recv",
                 completed);
        return -1;
      }
      if (past_deadline(r)) {
        snprintf(why, wl, "%s #%d still pending at the deadline (%.1f s after it was posted)", sender ? "send" : "recv",
                 completed, secs_since(posted_at[completed % FWINDOW]));
        return -1;
      }
      continue;
    }
    double pend = secs_since(posted_at[completed % FWINDOW]);
    if (pend > x->pending_max) x->pending_max = pend;
    if (!sender) {
      if (got[0] != (int)x->size) {
        snprintf(why, wl, "recv #%d reported %d bytes, expected %zu", completed, got[0], x->size);
        return -1;
      }
      uint8_t* buf = x->arena + (size_t)(completed % x->nbuf) * x->slot;
      long long bad = ring_check(buf, x->size, (uint64_t)(completed % x->nbuf), (uint64_t)completed);
      if (bad >= 0) {
        uint64_t got = ring_msg(buf, x->size);
        if (bad < 8 && got < (uint64_t)completed)
          snprintf(why, wl, "recv #%d holds message #%llu (a stale or repeated message)", completed, (unsigned long long)got);
        else
          snprintf(why, wl, "recv #%d: byte %lld of %zu is wrong (corrupted data)", completed, bad, x->size);
        return -1;
      }
    }
    completed++;
    atomic_store(&f->msgs_done[r->rank], completed);
  }
  x->secs = secs_since(t0);
  atomic_store(&f->verified[r->rank], 1);
  atomic_store(&f->done_ns[r->rank], now_ns());
  return 0;
}

/* ------------------------------------------------------------ injector */

static int run_cmd(const char* cmd, double limit_s) {
  pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd, (char*)NULL);
    _exit(127);
  }
  if (pid < 0) return -1;
  uint64_t until = now_ns() + (uint64_t)(limit_s * 1e9);
  for (;;) {
    int st;
    pid_t w = waitpid_r(pid, &st, WNOHANG);
    if (w == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    if (now_ns() > until) {
      kill(pid, SIGKILL);
      waitpid_r(pid, &st, 0);
      return 124;
    }
    sleep_ms(5);
  }
}

/* The injector: a plain process (it never loads the plugin, so it may fork
 * and exec freely) that waits for the transfer to be under way and then does
 * to a rank what the world would. */
static pid_t start_injector(fctx_t* c, shm_t* s, double limit_s) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid != 0) return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  const fopts_t* o = c->o;
  fshm_t* f = c->f;
  uint64_t until = now_ns() + (uint64_t)(limit_s * 1e9);
  uint64_t rng = c->rng ^ 0xfeedull;
  double spread = o->scenario == SC_KILL ? rng_unit(&rng) * o->kill_spread : 0;
  uint64_t go_at = 0;
  for (;;) {
    if (now_ns() > until) _exit(3);
    bool both = atomic_load(&f->phase[RECV]) >= PH_XFER && atomic_load(&f->phase[SEND]) >= PH_XFER;
    if (atomic_load(&f->phase[RECV]) >= PH_DONE || atomic_load(&f->phase[SEND]) >= PH_DONE ||
        atomic_load(&f->err_ns[RECV]) || atomic_load(&f->err_ns[SEND]))
      _exit(2); /* over (or failed) before the fault: the parent reports it */
    if (both && go_at == 0) go_at = now_ns() + (uint64_t)(spread * 1e9);
    if (both && now_ns() >= go_at && atomic_load(&f->msgs_done[RECV]) >= o->fault_after) break;
    sleep_ms(1);
  }
  int v = c->victim;
  pid_t vp = (pid_t)atomic_load(&f->pid[v]);
  switch (o->fault) {
    case FAULT_KILL:
      atomic_store(&s->expect_death[v], 1);
      atomic_store(&f->fault_ns, now_ns());
      kill(vp, SIGKILL);
      atomic_store(&f->fault_end_ns, now_ns());
      break;
    case FAULT_STOP:
      atomic_store(&f->fault_ns, now_ns());
      kill(vp, SIGSTOP);
      sleep_ms((int)(o->hold * 1000));
      kill(vp, SIGCONT);
      atomic_store(&f->fault_end_ns, now_ns());
      break;
    case FAULT_CMD: {
      atomic_store(&f->fault_ns, now_ns());
      int rc = run_cmd(o->cmd, (double)(until - now_ns()) / 1e9);
      atomic_store(&f->fault_rc, rc);
      atomic_store(&f->fault_end_ns, now_ns());
      break;
    }
  }
  atomic_store(&f->injected, 1);
  _exit(0);
}

static int stop_injector(pid_t pid, double wait_s) {
  if (pid <= 0) return -1;
  uint64_t until = now_ns() + (uint64_t)(wait_s * 1e9);
  int st = 0;
  for (;;) {
    pid_t w = waitpid_r(pid, &st, WNOHANG);
    if (w == pid) break;
    if (now_ns() > until) {
      kill(pid, SIGKILL);
      waitpid_r(pid, &st, 0);
      return -1;
    }
    sleep_ms(10);
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ------------------------------------------------- plain TCP baseline */

typedef struct {
  int fd;
  uint8_t* buf;
  size_t len;
  uint64_t budget;
  uint64_t until_ns;
  uint64_t moved;
} tcp_job_t;

static void* tcp_sink(void* p) {
  tcp_job_t* j = p;
  for (;;) {
    ssize_t k = recv(j->fd, j->buf, j->len, 0);
    if (k > 0) {
      j->moved += (uint64_t)k;
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    return NULL;
  }
}

static void* tcp_source(void* p) {
  tcp_job_t* j = p;
  while (j->moved < j->budget && now_ns() < j->until_ns) {
    size_t k = j->len;
    if (j->budget - j->moved < k) k = (size_t)(j->budget - j->moved);
    if (tcp_send_all(j->fd, j->buf, k) != 0) break;
    j->moved += k;
  }
  shutdown(j->fd, SHUT_WR);
  return NULL;
}

/* Plain TCP between the same two processes over the same path (the address
 * the plugin listened on), K streams, blocking sockets: the baseline the
 * plugin's GB/s is printed next to. The receiver's clock decides. */
static int tcp_baseline(rank_t* r, fctx_t* c, flink_t* l, uint64_t bytes, char* why, size_t wl) {
  fshm_t* f = c->f;
  int k = 0;
  int fds[MAX_TCP_STREAMS];
  int nfd = 0;
  int lfd = -1;
  int rc = -1;
  pthread_t th[MAX_TCP_STREAMS];
  tcp_job_t jobs[MAX_TCP_STREAMS];
  memset(jobs, 0, sizeof jobs);
  set_where(r, "plain TCP baseline");
  if (r->rank == RECV) {
    const sockent_t* at = NULL;
    for (int i = 0; i < l->nlisten && !at; i++)
      if (!sockent_wildcard(&l->listen[i])) at = &l->listen[i];
    if (at == NULL) {
      snprintf(why, wl, "the plugin listened on no specific address, so the plain-TCP baseline cannot take its path");
      return -1;
    }
    k = c->o->tcp_streams;
    if (k < 0) { /* as many TCP connections as the plugin's listener accepted */
      sockent_t est[256];
      int ne = my_tcp_sockets(TCP_ST_ESTABLISHED, est, 256);
      k = 0;
      for (int i = 0; i < ne; i++) k += est[i].port == at->port;
      if (k < 1) k = 1;
    }
    if (k > MAX_TCP_STREAMS) k = MAX_TCP_STREAMS;
    struct sockaddr_storage ss;
    socklen_t sl = sockent_addr(at, 0, &ss);
    lfd = socket(at->family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr*)&ss, sl) != 0 || listen(lfd, MAX_TCP_STREAMS) != 0 ||
        getsockname(lfd, (struct sockaddr*)&ss, &sl) != 0) {
      snprintf(why, wl, "plain TCP listen: %s", strerror(errno));
      goto out;
    }
    uint16_t port = ntohs(at->family == AF_INET ? ((struct sockaddr_in*)&ss)->sin_port
                                                : ((struct sockaddr_in6*)&ss)->sin6_port);
    sockent_t dst = *at;
    dst.port = port;
    if (ctl_send(r, &dst, sizeof dst) != 0 || ctl_send(r, &k, sizeof k) != 0) goto ctl;
    for (nfd = 0; nfd < k; nfd++) {
      struct pollfd p = {lfd, POLLIN, 0};
      if (poll(&p, 1, 30000) != 1 || (fds[nfd] = accept4(lfd, NULL, NULL, SOCK_CLOEXEC)) < 0) {
        snprintf(why, wl, "plain TCP: stream %d of %d never arrived", nfd, k);
        goto out;
      }
    }
    if (ctl_barrier(r, 60) != 0) goto ctl;
    uint64_t t0 = now_ns();
    for (int i = 0; i < k; i++) {
      jobs[i].fd = fds[i];
      jobs[i].len = 4 << 20;
      jobs[i].buf = malloc(jobs[i].len);
      if (jobs[i].buf == NULL || pthread_create(&th[i], NULL, tcp_sink, &jobs[i]) != 0) {
        snprintf(why, wl, "plain TCP: cannot start a reader");
        goto out;
      }
    }
    uint64_t moved = 0;
    for (int i = 0; i < k; i++) {
      pthread_join(th[i], NULL);
      moved += jobs[i].moved;
    }
    double secs = secs_since(t0);
    atomic_store(&f->tcp_streams, k);
    atomic_store(&f->tcp_ns, (unsigned long long)(secs * 1e9));
    atomic_store(&f->tcp_bytes, moved);
    rc = 0;
  } else {
    sockent_t dst;
    if (ctl_recv(r, &dst, sizeof dst, 60) != 0 || ctl_recv(r, &k, sizeof k, 60) != 0) goto ctl;
    if (k < 1 || k > MAX_TCP_STREAMS) goto ctl;
    struct sockaddr_storage ss;
    socklen_t sl = sockent_addr(&dst, dst.port, &ss);
    for (nfd = 0; nfd < k; nfd++) {
      fds[nfd] = socket(dst.family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fds[nfd] < 0 || connect(fds[nfd], (struct sockaddr*)&ss, sl) != 0) {
        snprintf(why, wl, "plain TCP connect: %s", strerror(errno));
        if (fds[nfd] >= 0) close(fds[nfd]);
        goto out;
      }
    }
    if (ctl_barrier(r, 60) != 0) goto ctl;
    uint64_t until = now_ns() + (uint64_t)(c->o->tcp_secs * 1e9);
    for (int i = 0; i < k; i++) {
      jobs[i].fd = fds[i];
      jobs[i].len = 4 << 20;
      jobs[i].buf = malloc(jobs[i].len);
      jobs[i].budget = bytes / (uint64_t)k;
      jobs[i].until_ns = until;
      if (jobs[i].buf == NULL || pthread_create(&th[i], NULL, tcp_source, &jobs[i]) != 0) {
        snprintf(why, wl, "plain TCP: cannot start a writer");
        goto out;
      }
      memset(jobs[i].buf, 0x5a, jobs[i].len);
    }
    for (int i = 0; i < k; i++) pthread_join(th[i], NULL);
    rc = 0;
  }
  goto out;
ctl:
  snprintf(why, wl, "plain TCP baseline: the other rank did not follow");
out:
  for (int i = 0; i < nfd; i++) close(fds[i]);
  for (int i = 0; i < MAX_TCP_STREAMS; i++) free(jobs[i].buf);
  if (lfd >= 0) close(lfd);
  return rc;
}

/* ------------------------------------------------------- rank state */

/* What a rank holds, so that every scenario ends the same way. */
typedef struct {
  net_t n;
  hprops_t p;
  flink_t l;
  xfer_t x;
  char why[WHY_LEN];
  atomic_ullong* end_ns; /* set by a scenario that reports how long rank_end took */
} rstate_t;

/* Closes whatever is still open (requests may be pending: closing them is
 * part of every scenario), finalizes, and tells the parent this rank is done. */
static int rank_end(rank_t* r, fctx_t* c, rstate_t* st, int rc) {
  uint64_t t0 = now_ns();
  if (st->why[0]) note(r, c, "%s", st->why);
  set_where(r, "closing");
  xfer_release(&st->n, st->l.comm, &st->x);
  flink_down(&st->n, &st->l, r->rank);
  set_where(r, "finalize");
  if (st->n.table && (c->version < 11 || st->n.ctx)) rank_close(&st->n);
  st->n.table = NULL;
  set_phase(r, c, PH_DONE);
  atomic_store(&r->shm->cur[r->rank], -1);
  if (st->end_ns) atomic_store(st->end_ns, now_ns() - t0);
  return rc;
}

/* A scenario's part on one rank, between rank_begin and rank_end: returns the
 * rank's exit status (0 where an error from the plugin is the parent's to judge). */
typedef int (*scenario_fn)(rank_t* r, fctx_t* c, rstate_t* st);

typedef struct {
  fctx_t* c;
  scenario_fn fn;
} scenario_arg_t;

/* Every scenario's rank: load and initialize, run its part, and end the same way. */
static int scenario_rank(rank_t* r, void* arg) {
  const scenario_arg_t* a = arg;
  rstate_t st;
  memset(&st, 0, sizeof st);
  int rc = rank_begin(r, a->c, &st.n, &st.p, st.why, sizeof st.why) != 0 ? 1 : a->fn(r, a->c, &st);
  return rank_end(r, a->c, &st, rc);
}

/* ------------------------------------------------ transfer-like ranks */

/* slow-recv, kill and transfer: connect, move data, let the injector do its
 * work, record what each side saw. */
static int xfer_rank(rank_t* r, fctx_t* c, rstate_t* st) {
  const fopts_t* o = c->o;
  fshm_t* f = c->f;
  xfer_t* x = &st->x;
  if (flink_up(r, c, &st->n, &st->l, 30, st->why, sizeof st->why) != 0) return 1;
  if (r->rank == RECV) { /* NCCL closes the listener once accept succeeded */
    net_close_listen(&st->n, st->l.lc);
    st->l.lc = NULL;
  }
  if (o->fork_child > 0) fork_lingering_child(o->fork_child, NULL, 0);
  x->size = o->size;
  x->iters = o->iters;
  x->until_error = o->scenario == SC_KILL;
  x->hold = o->scenario == SC_SLOW_RECV && r->rank == RECV ? o->hold : 0;
  if (o->scenario == SC_KILL || o->expect_error) x->give_up = o->within + 5;
  if (xfer_prepare(r, &st->n, st->l.comm, x, st->why, sizeof st->why) != 0) return 1;
  set_where(r, "barrier before the transfer");
  if (ctl_barrier(r, 60) != 0) {
    snprintf(st->why, sizeof st->why, "the other rank did not reach the start barrier");
    return 1;
  }
  int k = xfer_run(r, c, &st->n, st->l.comm, x, st->why, sizeof st->why);
  /* An error from the plugin is a fact for the parent to judge, not this rank's failure. */
  if (k != 0) return k == 1 ? 0 : 1;
  atomic_store(&f->xfer_ns[r->rank], (unsigned long long)(x->secs * 1e9));
  atomic_store(&f->pending_max_ns[r->rank], (unsigned long long)(x->pending_max * 1e9));
  if (o->scenario == SC_TRANSFER && o->tcp_streams != 0) {
    xfer_release(&st->n, st->l.comm, x);
    if (tcp_baseline(r, c, &st->l, (uint64_t)o->size * (uint64_t)o->iters, st->why, sizeof st->why) != 0)
      return 1;
  }
  return 0;
}

/* ----------------------------------------------------------- connect */

static int connect_rank(rank_t* r, fctx_t* c, rstate_t* st) {
  const fopts_t* o = c->o;
  fshm_t* f = c->f;
  flink_t* l = &st->l;
  int verdict = 0;
  if (r->rank == RECV) {
    if (flisten(r, &st->n, l, st->why, sizeof st->why) != 0) return 1;
    if (o->scenario == SC_CONNECT_REFUSED) {
      set_where(r, "closing the listener before the peer connects");
      net_close_listen(&st->n, l->lc);
      l->lc = NULL;
    }
    if (send_handle(r, l) != 0) return 1;
    set_where(r, "waiting for the connector's outcome");
    if (ctl_recv(r, &verdict, sizeof verdict, o->within + 60) != 0) {
      snprintf(st->why, sizeof st->why, "no outcome from the connecting rank");
      return 1;
    }
    return 0;
  }
  if (recv_handle(r, l, 60) != 0) {
    snprintf(st->why, sizeof st->why, "no listen handle from the other rank");
    return 1;
  }
  ncclNetDeviceHandle_v8_t* dh = NULL;
  ncclNetCommConfig_v10_t cfg = {NCCL_NET_TRAFFIC_CLASS_UNDEF};
  double give_up = o->within + 4;
  uint64_t t0 = now_ns();
  for (;;) {
    set_where(r, "polling connect (%.1f s; gives up after %.0f s)", secs_since(t0), give_up);
    ncclResult_t res = net_connect(&st->n, 0, &cfg, l->handle, &l->comm, &dh);
    if (res != ncclSuccess) {
      record_error(r, c, "connect", res);
      verdict = 1;
      break;
    }
    if (l->comm) {
      verdict = 2;
      break;
    }
    if (secs_since(t0) > give_up) break;
    sched_yield();
  }
  atomic_store(&f->connect_ns, now_ns() - t0);
  atomic_store(&f->connect_outcome, verdict);
  ctl_send(r, &verdict, sizeof verdict);
  /* A still-pending connect is abandoned as NCCL abandons it on abort: finalize. */
  st->end_ns = &f->finalize_ns;
  return 0;
}

/* ------------------------------------------------------------- stray */

enum { ST_CLOSE, ST_RST, ST_GARBAGE, ST_GARBAGE_HANG, ST_SILENT_HANG, ST_HALF_HANDLE, ST_WRONG_MAGIC, ST_FLOOD, ST_KINDS };
static const char* const ST_NAMES[ST_KINDS] = {"connect+close", "connect+RST", "garbage+close", "garbage+hang",
                                               "silent hang", "half handshake", "wrong magic", "1 MiB flood"};

#define MAX_HANG 256

typedef struct {
  int fds[MAX_HANG];
  int n;
  int made, refused;
} strays_t;

static int stray_connect(const sockent_t* to, double timeout_s) {
  struct sockaddr_storage ss;
  socklen_t sl = sockent_addr(to, to->port, &ss);
  int fd = socket(to->family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  if (connect(fd, (struct sockaddr*)&ss, sl) != 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  struct pollfd p = {fd, POLLOUT, 0};
  int err = 0;
  socklen_t el = sizeof err;
  if (poll(&p, 1, (int)(timeout_s * 1000)) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static void send_some(int fd, const void* buf, size_t len) {
  const char* p = buf;
  uint64_t until = now_ns() + 2000000000ull;
  while (len > 0 && now_ns() < until) {
    ssize_t k = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      len -= (size_t)k;
    } else if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
      struct pollfd q = {fd, POLLOUT, 0};
      poll(&q, 1, 20);
    } else {
      return; /* the plugin closed it: fine */
    }
  }
}

/* One round of every kind of stray at every port the plugin listens on. */
static void throw_strays(rank_t* r, fctx_t* c, const flink_t* l, strays_t* st, const char* when) {
  static uint8_t junk[1 << 20];
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)rng_next(&c->rng);
  for (int pi = 0; pi < l->nlisten; pi++) {
    for (int kind = 0; kind < ST_KINDS; kind++) {
      for (int j = 0; j < c->o->strays; j++) {
        set_where(r, "stray %s (%s)", ST_NAMES[kind], when);
        int fd = stray_connect(&l->listen[pi], 5);
        if (fd < 0) {
          st->refused++;
          continue;
        }
        st->made++;
        bool hang = false;
        switch (kind) {
          case ST_CLOSE: break;
          case ST_RST: {
            struct linger lg = {1, 0};
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
            break;
          }
          case ST_GARBAGE: send_some(fd, junk, 1 + rng_next(&c->rng) % 4096); break;
          case ST_GARBAGE_HANG:
            send_some(fd, junk, 1 + rng_next(&c->rng) % 4096);
            hang = true;
            break;
          case ST_SILENT_HANG: hang = true; break;
          case ST_HALF_HANDLE: /* the start of what a peer holding the handle might send */
            send_some(fd, l->handle, 1 + rng_next(&c->rng) % (sizeof l->handle / 2));
            hang = true;
            break;
          case ST_WRONG_MAGIC: {
            char h[NCCL_NET_HANDLE_MAXSIZE];
            memcpy(h, l->handle, sizeof h);
            for (int b = 0; b < 8; b++) h[b] ^= (char)0x5a;
            send_some(fd, h, sizeof h);
            hang = true;
            break;
          }
          case ST_FLOOD: send_some(fd, junk, sizeof junk); break;
        }
        if (hang && st->n < MAX_HANG) st->fds[st->n++] = fd;
        else close(fd);
      }
    }
  }
}

static void close_strays(strays_t* st) {
  for (int i = 0; i < st->n; i++) close(st->fds[i]);
  st->n = 0;
}

/* fds right after the calls that must release them, and after up to 2 s. */
static void fd_check(rank_t* r, fctx_t* c, int base) {
  fshm_t* f = c->f;
  int now = count_fds();
  atomic_store(&f->fds_after[r->rank], now);
  uint64_t until = now_ns() + 2000000000ull;
  while (now > base && now_ns() < until) {
    sleep_ms(20);
    now = count_fds();
  }
  atomic_store(&f->fds_settled[r->rank], now);
}

/* A listen and close before the baseline: the first network call makes the
 * Go runtime open its poller's descriptors, which stay for the process. */
static int warm_up(rank_t* r, net_t* n, char* why, size_t wl) {
  char h[NCCL_NET_HANDLE_MAXSIZE];
  void* lc = NULL;
  set_where(r, "warm-up listen");
  ncclResult_t res = net_listen(n, 0, h, &lc);
  if (res != ncclSuccess || lc == NULL) {
    snprintf(why, wl, "warm-up listen returned %s", result_str(res));
    return -1;
  }
  net_close_listen(n, lc);
  return 0;
}

static int stray_rank(rank_t* r, fctx_t* c, rstate_t* st) {
  const fopts_t* o = c->o;
  fshm_t* f = c->f;
  flink_t* l = &st->l;
  strays_t strays;
  memset(&strays, 0, sizeof strays);
  int rc = 1;
  if (warm_up(r, &st->n, st->why, sizeof st->why) != 0) goto out;
  int base = count_fds();
  atomic_store(&f->fds_base[r->rank], base);
  int warns0 = atomic_load(&g_warns);
  if (r->rank == RECV) {
    if (flisten(r, &st->n, l, st->why, sizeof st->why) != 0) goto out;
    if (l->nlisten == 0) {
      snprintf(st->why, sizeof st->why, "listen opened no TCP listening socket this harness can see in /proc/self/net/tcp*");
      goto out;
    }
    if (send_handle(r, l) != 0) goto out;
  } else {
    if (recv_handle(r, l, 60) != 0) {
      snprintf(st->why, sizeof st->why, "no listen handle from the other rank");
      goto out;
    }
    throw_strays(r, c, l, &strays, "before connect");
    atomic_store(&f->hanging_at_connect, strays.n);
    atomic_store(&f->strays_made, strays.made);
    atomic_store(&f->strays_refused, strays.refused);
  }
  uint64_t t0 = now_ns();
  if (flink_poll(r, c, &st->n, l, 60, st->why, sizeof st->why) != 0) goto out;
  atomic_store(&f->setup_ns[r->rank], now_ns() - t0);
  /* The listener stays open: more strays come after set-up, while data moves. */
  if (ctl_barrier(r, 60) != 0) goto out;
  if (r->rank == SEND) {
    throw_strays(r, c, l, &strays, "after set-up");
    atomic_store(&f->hanging_at_close, strays.n);
    atomic_store(&f->strays_made, strays.made);
    atomic_store(&f->strays_refused, strays.refused);
  }
  st->x.size = o->size;
  st->x.iters = o->iters;
  if (xfer_prepare(r, &st->n, l->comm, &st->x, st->why, sizeof st->why) != 0 || ctl_barrier(r, 60) != 0 ||
      xfer_run(r, c, &st->n, l->comm, &st->x, st->why, sizeof st->why) != 0)
    goto out;
  xfer_release(&st->n, l->comm, &st->x);
  if (ctl_barrier(r, 60) != 0) goto out; /* data done on both sides */
  set_where(r, "closing with strays still connected");
  flink_down(&st->n, l, r->rank);
  close_strays(&strays);
  fd_check(r, c, base);
  atomic_store(&f->warns[r->rank], atomic_load(&g_warns) - warns0);
  rc = 0;
out:
  close_strays(&strays);
  return rc;
}

/* ------------------------------------------------------------- abort */

/* Rounds of set-up and tear-down at random moments, as ncclCommAbort and
 * communicator churn do: close/finalize while connect or accept is pending,
 * and with requests in flight. After every round this process's descriptors
 * must be back at the baseline; no round may take longer than --within. */
static int abort_rank(rank_t* r, fctx_t* c, rstate_t* st) {
  const fopts_t* o = c->o;
  fshm_t* f = c->f;
  int rc = 1;
  bool per_comm = c->version >= 11;
  if (warm_up(r, &st->n, st->why, sizeof st->why) != 0) return 1;
  int base = -1, tbase = -1, tmax = 0, late = 0, errors = 0, pending_closed = 0;
  double worst = 0;
  int worst_round = -1;
  uint64_t rng = c->rng + (uint64_t)r->rank * 7919;
  ncclNetDeviceHandle_v8_t* dh = NULL;
  ncclNetCommConfig_v10_t cfg = {NCCL_NET_TRAFFIC_CLASS_UNDEF};
  for (int k = 0; k < o->rounds; k++) {
    set_where(r, "round %d: barrier", k);
    if (ctl_barrier(r, 60) != 0) {
      snprintf(st->why, sizeof st->why, "round %d: the other rank did not reach the barrier", k);
      goto done;
    }
    atomic_store(&r->shm->cur_start_ns[r->rank], now_ns());
    r->deadline_ns = now_ns() + (uint64_t)(o->within * 1e9);
    uint64_t t0 = now_ns();
    if (per_comm && k > 0) {
      set_where(r, "round %d: init", k);
      ncclResult_t res = net_init(&st->n, &st->n.ctx, 0x5000 + (uint64_t)k * 2 + (uint64_t)r->rank, false);
      if (res != ncclSuccess) {
        snprintf(st->why, sizeof st->why, "round %d: init returned %s", k, result_str(res));
        goto done;
      }
    }
    int kind = per_comm ? k % 2 : 1;
    memset(&st->l, 0, sizeof st->l);
    if (kind == 0) {
      /* Abort during set-up: each side polls for a random while, then closes
       * whatever it has and finalizes with the other half maybe pending. */
      double stop = rng_unit(&rng) * 0.02;
      uint64_t t1 = now_ns();
      if (r->rank == RECV) {
        if (flisten(r, &st->n, &st->l, st->why, sizeof st->why) != 0 || send_handle(r, &st->l) != 0) goto done;
        set_where(r, "round %d: accept for %.1f ms, then abort", k, stop * 1e3);
        while (st->l.comm == NULL && secs_since(t1) < stop) {
          if (net_accept(&st->n, st->l.lc, &st->l.comm, &dh) != ncclSuccess) {
            errors++;
            break;
          }
        }
      } else {
        if (recv_handle(r, &st->l, 60) != 0) goto done;
        set_where(r, "round %d: connect for %.1f ms, then abort", k, stop * 1e3);
        do {
          if (net_connect(&st->n, 0, &cfg, st->l.handle, &st->l.comm, &dh) != ncclSuccess) {
            errors++;
            break;
          }
        } while (st->l.comm == NULL && secs_since(t1) < stop);
      }
      if (st->l.comm == NULL) pending_closed++;
    } else {
      /* Abort with requests in flight. */
      if (flink_up(r, c, &st->n, &st->l, o->within, st->why, sizeof st->why) != 0) goto done;
      if (r->rank == RECV && st->l.lc) {
        net_close_listen(&st->n, st->l.lc);
        st->l.lc = NULL;
      }
      st->x.size = o->size;
      st->x.iters = FWINDOW;
      st->x.until_error = true; /* no prefill of every buffer: a ring */
      if (xfer_prepare(r, &st->n, st->l.comm, &st->x, st->why, sizeof st->why) != 0) goto done;
      void* reqs[FWINDOW];
      int nr = 0;
      for (int i = 0; i < FWINDOW; i++) {
        void* req = NULL;
        uint8_t* buf = st->x.arena + (size_t)i * st->x.slot;
        ncclResult_t res = post_req(&st->n, r->rank == SEND, st->l.comm, buf, st->x.size, st->x.mh, &req);
        if (res != ncclSuccess) {
          errors++;
          break;
        }
        if (req) reqs[nr++] = req;
      }
      double stop = rng_unit(&rng) * 0.05;
      uint64_t t1 = now_ns();
      int open = nr;
      set_where(r, "round %d: %d requests, testing for %.1f ms, then abort", k, nr, stop * 1e3);
      while (open > 0 && secs_since(t1) < stop) {
        open = 0;
        for (int i = 0; i < nr; i++) {
          if (reqs[i] == NULL) continue;
          int done = 0, sz = 0;
          ncclResult_t res = net_test(&st->n, reqs[i], &done, &sz);
          if (res != ncclSuccess) {
            errors++;
            reqs[i] = NULL;
          } else if (done) {
            reqs[i] = NULL;
          } else {
            open++;
          }
        }
      }
      pending_closed += open;
      set_where(r, "round %d: closing with %d requests pending", k, open);
      xfer_release(&st->n, st->l.comm, &st->x);
    }
    set_where(r, "round %d: close", k);
    flink_down(&st->n, &st->l, r->rank);
    if (per_comm) {
      set_where(r, "round %d: finalize", k);
      ncclResult_t res = net_finalize(&st->n, st->n.ctx);
      st->n.ctx = NULL;
      if (res != ncclSuccess) {
        snprintf(st->why, sizeof st->why, "round %d: finalize returned %s", k, result_str(res));
        goto done;
      }
    }
    double secs = secs_since(t0);
    if (secs > worst) {
      worst = secs;
      worst_round = k;
    }
    int fds = count_fds(), th = count_threads();
    if (th > tmax) tmax = th;
    if (k == 1 || (!per_comm && k == 0)) {
      base = fds;
      tbase = th;
      atomic_store(&f->fds_base[r->rank], base);
      atomic_store(&f->threads_base[r->rank], tbase);
    } else if (base >= 0 && fds > base) {
      int at_return = fds;
      uint64_t until = now_ns() + 2000000000ull;
      while (fds > base && now_ns() < until) {
        sleep_ms(10);
        fds = count_fds();
      }
      if (fds > base) {
        snprintf(st->why, sizeof st->why,
                 "round %d (%s): %d descriptors open after %s returned, baseline %d; still %d 2 s later (a leak)",
                 k, kind == 0 ? "abort during set-up" : "abort with requests in flight", at_return,
                 per_comm ? "finalize" : "close", base, fds);
        atomic_store(&f->fds_after[r->rank], at_return);
        goto done;
      }
      late++;
    }
    if (secs > o->within) {
      snprintf(st->why, sizeof st->why, "round %d (%s) took %.2f s, more than --within %.1f s", k,
               kind == 0 ? "abort during set-up" : "abort with requests in flight", secs, o->within);
      goto done;
    }
    atomic_store(&f->rounds_done[r->rank], k + 1);
  }
  atomic_store(&f->fds_after[r->rank], count_fds());
  atomic_store(&f->threads_end[r->rank], count_threads());
  atomic_store(&f->threads_max[r->rank], tmax);
  atomic_store(&f->late_rounds[r->rank], late);
  atomic_store(&f->plugin_errors[r->rank], errors);
  atomic_store(&f->abandoned[r->rank], pending_closed);
  atomic_store(&f->worst_round[r->rank], worst_round);
  atomic_store(&f->worst_round_ns[r->rank], (unsigned long long)(worst * 1e9));
  rc = 0;
done:
  return rc;
}

/* ------------------------------------------------------------ parent */

static void usage_faults(FILE* out) {
  fprintf(out,
          "usage: ncclnet-harness faults SCENARIO --plugin PATH [options]\n"
          "Scenarios (rank 0 receives and listens, rank 1 sends and connects):\n"
          "  slow-recv          the receiver posts nothing for --hold s (default 3 x NCCL_GO_TIMEOUT) while\n"
          "                     the sender's --iters x --size isends are in flight: no error, every byte verified\n"
          "  kill               --trials runs; in each, a rank is SIGKILLed at a random point of the transfer\n"
          "                     (--victim recv|send|both): the survivor must see an error within --within\n"
          "                     (default NCCL_GO_TIMEOUT + 2 s); any trial without one is a hang\n"
          "  connect-refused    connect to a handle whose listener was closed: error within --within (default 6)\n"
          "  connect-blackhole  connect to a listener the caller made unreachable (packets vanish): same bound\n"
          "  transfer           --iters x --size, verified, with --fault stop|cmd injected once the receiver has\n"
          "                     --fault-after messages; --expect ok (default) or error (both ranks within --within);\n"
          "                     --tcp-streams N|auto adds plain TCP over the same path, same run\n"
          "  stray              --strays connections of each garbage kind at the listener before and after\n"
          "                     set-up: the real connection still works, nothing crashes, fds back to baseline\n"
          "  abort              --rounds of close/finalize during connect/accept and with requests in flight:\n"
          "                     fds back to baseline every round, no round longer than --within (default 10)\n"
          "Options:\n"
          "  --version V        API version (default: newest exported)\n"
          "  --netns NS0,NS1    run rank 0 / rank 1 in these network namespaces (/run/netns/NAME or a path)\n"
          "  --size BYTES --iters N   messages (defaults: 64M x 8; kill 8M; stray 1M x 16; abort 4M)\n"
          "  --trials N (kill, default 100)   --rounds N (abort, default 200)   --strays N (stray, default 4)\n"
          "  --hold SEC         slow-recv: delay before posting; --fault stop: SIGSTOP length (default 3 x timeout)\n"
          "  --within SEC       the bound a failure must be detected in (see above)\n"
          "  --fault stop|cmd   --victim recv|send   --cmd 'SHELL COMMAND'   --fault-after N (default iters/4)\n"
          "  --kill-spread SEC  kill: inject within this long after the transfer started (default 0.3)\n"
          "  --fork-child SEC   once connected, each rank forks a child that holds its descriptors for SEC s and\n"
          "                     outlives it, as a DataLoader worker does: the kill bound must hold all the same\n"
          "  --expect ok|error  --tcp-streams N|auto  --tcp-secs SEC (default 15)\n"
          "  --seed N           randomness (kill points, abort timing, garbage); printed, default from the clock\n"
          "  --timeout SEC      watchdog for one run / one trial (default: enough for the scenario)\n"
          "Reads NCCL_GO_TIMEOUT like the plugin. Exit 0 only when the scenario passed.\n");
}

static int parse_num(const char* name, const char* v, double lo, double hi, double* out) {
  if (*v != 0 && parse_in_range(v, lo, hi, out) == 0) return 0;
  fprintf(stderr, "faults: %s %s: use a number in %g..%g\n", name, v, lo, hi);
  return -1;
}

/* The index of v in words, or -1 after saying what the option takes. */
static int parse_word(const char* name, const char* v, const char* const* words, int n) {
  for (int i = 0; i < n; i++)
    if (!strcmp(v, words[i])) return i;
  fprintf(stderr, "faults: %s %s: use", name, v);
  for (int i = 0; i < n; i++) fprintf(stderr, "%s %s", i == 0 ? "" : i == n - 1 ? " or" : ",", words[i]);
  fprintf(stderr, "\n");
  return -1;
}

static int parse_faults(int argc, char** argv, fopts_t* o) {
  memset(o, 0, sizeof *o);
  o->victim = -2;
  o->tcp_streams = 0;
  o->tcp_secs = 15;
  o->seed = (uint64_t)now_ns() ^ ((uint64_t)getpid() << 32);
  double size = -1, iters = -1, trials = 100, rounds = 200, strays = 4, hold = -1, within = -1, after = -1, spread = 0.3,
         lim = 0;
  if (argc < 3 || argv[2][0] == '-') {
    usage_faults(stderr);
    return -1;
  }
  o->scenario = -1;
  for (int i = 0; i < SC_N; i++)
    if (!strcmp(argv[2], SC_NAMES[i])) o->scenario = i;
  if (o->scenario < 0) {
    fprintf(stderr, "faults: unknown scenario \"%s\"\n", argv[2]);
    usage_faults(stderr);
    return -1;
  }
  const struct {
    const char* name;
    double lo, hi;
    double* out;
  } nums[] = {
      {"--iters", 1, 1e6, &iters},          {"--trials", 1, 1e6, &trials},      {"--rounds", 1, 1e7, &rounds},
      {"--strays", 1, 16, &strays},         {"--hold", 0, 3600, &hold},         {"--within", 0.001, 3600, &within},
      {"--fault-after", 0, 1e6, &after},    {"--kill-spread", 0, 60, &spread},  {"--timeout", 1, 86400, &lim},
      {"--tcp-secs", 0.1, 3600, &o->tcp_secs}, {"--fork-child", 0, 3600, &o->fork_child},
  };
  static char nsbuf[512];
  for (int i = 3; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage_faults(stdout);
      exit(0);
    }
    if (v == NULL) {
      fprintf(stderr, "faults: %s needs a value (see --help)\n", a);
      return -1;
    }
    i++;
    bool numeric = false;
    for (size_t k = 0; k < sizeof nums / sizeof nums[0] && !numeric; k++) {
      if (strcmp(a, nums[k].name)) continue;
      if (parse_num(a, v, nums[k].lo, nums[k].hi, nums[k].out)) return -1;
      numeric = true;
    }
    if (numeric) continue;
    if (!strcmp(a, "--plugin")) o->base.plugin = v;
    else if (!strcmp(a, "--version")) {
      double x;
      if (parse_num(a, v, HARNESS_MIN_VERSION, HARNESS_MAX_VERSION, &x)) return -1;
      o->base.version = (int)x;
    } else if (!strcmp(a, "--netns")) {
      snprintf(nsbuf, sizeof nsbuf, "%s", v);
      char* comma = strchr(nsbuf, ',');
      if (comma == NULL) {
        fprintf(stderr, "faults: --netns wants two names: NS_OF_RANK0,NS_OF_RANK1\n");
        return -1;
      }
      *comma = 0;
      o->netns[0] = nsbuf;
      o->netns[1] = comma + 1;
    } else if (!strcmp(a, "--size")) {
      size_t sz;
      if (parse_size(v, &sz) != 0 || sz == 0 || sz > NCCL_MAX_NET_SIZE) {
        fprintf(stderr, "faults: --size %s: use 1 byte to 1 GiB (K, M, G suffixes)\n", v);
        return -1;
      }
      size = (double)sz;
    } else if (!strcmp(a, "--seed")) {
      o->seed = strtoull(v, NULL, 0);
    } else if (!strcmp(a, "--cmd")) {
      o->cmd = v;
    } else if (!strcmp(a, "--fault")) {
      static const char* const w[] = {"stop", "cmd"};
      int k = parse_word(a, v, w, 2);
      if (k < 0) return -1;
      o->fault = k == 0 ? FAULT_STOP : FAULT_CMD;
    } else if (!strcmp(a, "--victim")) {
      static const char* const w[] = {"recv", "send", "both"};
      int k = parse_word(a, v, w, 3);
      if (k < 0) return -1;
      o->victim = k == 2 ? -1 : k; /* RECV, SEND */
    } else if (!strcmp(a, "--expect")) {
      static const char* const w[] = {"ok", "error"};
      int k = parse_word(a, v, w, 2);
      if (k < 0) return -1;
      o->expect_error = k == 1;
    } else if (!strcmp(a, "--tcp-streams")) {
      if (!strcmp(v, "auto")) o->tcp_streams = -1;
      else {
        double x;
        if (parse_num(a, v, 0, MAX_TCP_STREAMS, &x)) return -1;
        o->tcp_streams = (int)x;
      }
    } else {
      fprintf(stderr, "faults: unknown option \"%s\" (see --help)\n", a);
      return -1;
    }
  }
  if (o->base.plugin == NULL) {
    fprintf(stderr, "faults: --plugin PATH is required\n");
    return -1;
  }
  o->peer_timeout = env_peer_timeout();
  if (isnan(o->peer_timeout)) {
    fprintf(stderr, "faults: cannot read NCCL_GO_TIMEOUT=%s (use seconds, e.g. 3)\n", getenv("NCCL_GO_TIMEOUT"));
    return -1;
  }
  double t = o->peer_timeout > 0 ? o->peer_timeout : 300;
  int sc = o->scenario;
  o->size = size > 0              ? (size_t)size
            : sc == SC_KILL      ? 8u << 20
            : sc == SC_STRAY     ? 1u << 20
            : sc == SC_ABORT     ? 4u << 20
                                 : 64u << 20;
  o->iters = iters > 0 ? (int)iters : sc == SC_STRAY ? 16 : 8;
  o->trials = (int)trials;
  o->rounds = (int)rounds;
  o->strays = (int)strays;
  o->hold = hold >= 0 ? hold : 3 * t;
  /* kill and transfer --expect error: NCCL_GO_TIMEOUT + 2 s; connect: issue 9's 6 s. */
  o->within = within > 0                                            ? within
              : sc == SC_ABORT                                      ? 10
              : sc == SC_CONNECT_REFUSED || sc == SC_CONNECT_BLACKHOLE ? 6
                                                                    : t + 2;
  o->fault_after = after >= 0 ? (int)after : sc == SC_TRANSFER ? o->iters / 4 : 0;
  o->kill_spread = spread;
  if (sc == SC_KILL) {
    o->fault = FAULT_KILL;
    if (o->victim == -2) o->victim = -1;
  }
  if (o->victim == -2) o->victim = RECV;
  if (sc == SC_TRANSFER) {
    if (o->fault == FAULT_CMD && (o->cmd == NULL || !*o->cmd)) {
      fprintf(stderr, "faults: --fault cmd needs --cmd 'COMMAND'\n");
      return -1;
    }
    if (o->fault != FAULT_NONE && o->fault_after >= o->iters) {
      fprintf(stderr, "faults: --fault-after %d must be below --iters %d, or the fault lands after the transfer\n",
              o->fault_after, o->iters);
      return -1;
    }
    if (o->expect_error && o->fault == FAULT_NONE) {
      fprintf(stderr, "faults: --expect error needs a --fault\n");
      return -1;
    }
  }
  if (lim > 0) o->limit = lim;
  else {
    switch (sc) {
      case SC_SLOW_RECV: o->limit = o->hold + 180; break;
      case SC_KILL: o->limit = o->within + o->kill_spread + 60; break;
      case SC_CONNECT_REFUSED:
      case SC_CONNECT_BLACKHOLE: o->limit = o->within + 60; break;
      case SC_TRANSFER: o->limit = (o->fault == FAULT_STOP ? o->hold : 0) + (o->tcp_streams ? o->tcp_secs : 0) +
                                   (o->expect_error ? o->within : 0) + 600; break;
      case SC_STRAY: o->limit = 120; break;
      default: o->limit = o->within + 60; break; /* abort: per round (each round restarts the watchdog) */
    }
  }
  return 0;
}

static const char* victim_name(int v) { return v == RECV ? "receiver" : "sender"; }

static void fshm_reset(fshm_t* f) {
  memset(f, 0, sizeof *f);
  atomic_store(&f->fault_rc, -1);
  for (int i = 0; i < 2; i++) {
    atomic_store(&f->fds_base[i], -1);
    atomic_store(&f->fds_after[i], -1);
    atomic_store(&f->fds_settled[i], -1);
    atomic_store(&f->threads_base[i], -1);
    atomic_store(&f->threads_end[i], -1);
    atomic_store(&f->threads_max[i], -1);
  }
}

static void print_rank_notes(const char* scen, fshm_t* f, const pair_outcome_t* out) {
  for (int i = 0; i < 2; i++) {
    char st[96];
    bool clean = out->exited[i] && WIFEXITED(out->status[i]) && WEXITSTATUS(out->status[i]) == 0;
    if (!clean || f->note[i][0])
      printf("faults %s:   rank %d (%s): %s%s%s\n", scen, i, i == RECV ? "receiver" : "sender",
             out->exited[i] ? wait_status_str(out->status[i], st, sizeof st) : "still running",
             f->note[i][0] ? ": " : "", f->note[i]);
  }
  if (out->hung)
    printf("faults %s:   watchdog: rank %d hung in \"%s\" for %.0f s (both ranks killed)\n", scen, out->hung_rank,
           out->hung_where, out->hung_after);
}

/* Every scenario ends with what the ranks noted, then its verdict. */
static int conclude(const char* sc, fshm_t* f, const pair_outcome_t* out, bool pass) {
  print_rank_notes(sc, f, out);
  printf("faults %s: %s\n", sc, pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

static bool rank_ok(const pair_outcome_t* out, int i) {
  return out->exited[i] && WIFEXITED(out->status[i]) && WEXITSTATUS(out->status[i]) == 0;
}

static void err_desc(fshm_t* f, int i, char* buf, size_t len) {
  snprintf(buf, len, "%s returned %s%s%s", f->err_call[i], result_str((ncclResult_t)atomic_load(&f->err_res[i])),
           f->err_warn[i][0] ? "; WARN: " : "", f->err_warn[i]);
}

static int cmp_dbl(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static int one_run(fctx_t* c, shm_t* s, scenario_fn fn, bool inject, pair_outcome_t* out, int* inj_status) {
  fshm_reset(c->f);
  memset(s->text, 0, sizeof s->text);
  pid_t inj = inject ? start_injector(c, s, c->o->limit) : -1;
  /* abort restarts the per-check watchdog every round: no bound on the total. */
  scenario_arg_t a = {c, fn};
  int rc = run_pair(s, scenario_rank, &a, c->o->limit, c->o->scenario == SC_ABORT ? 0 : c->o->limit + 30, out);
  /* A command injector (ip link down; sleep; up) is waited for, so the path
   * is whole again before anything else runs; a SIGSTOP one until its SIGCONT. */
  double wait = c->o->fault == FAULT_CMD ? c->o->limit : c->o->fault == FAULT_STOP ? c->o->hold + 2 : 1;
  *inj_status = inject ? stop_injector(inj, wait) : -1;
  return rc;
}

static const char* inj_why(int st) {
  switch (st) {
    case 0: return "injected";
    case 2: return "the transfer ended (or failed) before the fault could be injected";
    case 3: return "the transfer never got under way within the time limit";
    default: return "the injector did not finish";
  }
}

static int judge_slow(fctx_t* c, const pair_outcome_t* out) {
  const fopts_t* o = c->o;
  fshm_t* f = c->f;
  const char* sc = SC_NAMES[o->scenario];
  bool pass = rank_ok(out, 0) && rank_ok(out, 1) && !out->hung && atomic_load(&f->verified[RECV]) &&
              atomic_load(&f->verified[SEND]) && !atomic_load(&f->err_ns[RECV]) && !atomic_load(&f->err_ns[SEND]);
  char e0[512] = "none", e1[512] = "none";
  if (atomic_load(&f->err_ns[RECV])) err_desc(f, RECV, e0, sizeof e0);
  if (atomic_load(&f->err_ns[SEND])) err_desc(f, SEND, e1, sizeof e1);
  char szs[32];
  fmt_size(szs, sizeof szs, o->size);
  printf("faults %s: receiver held off %.1f s (NCCL_GO_TIMEOUT=%g s) with %d x %s isends in flight\n", sc, o->hold,
         o->peer_timeout, o->iters, szs);
  for (int i = SEND; i >= RECV; i--) {
    uint64_t start = atomic_load(&f->xfer_start_ns[i]), err = atomic_load(&f->err_ns[i]);
    if (err)
      printf("faults %s:   %s: FAILED %.2f s after %s: %s\n", sc, victim_name(i), start ? secs_between(start, err) : 0.0,
             i == SEND ? "posting its sends" : "the hold began", i == SEND ? e1 : e0);
    else if (atomic_load(&f->verified[i]))
      printf("faults %s:   %s: %s; longest a request stayed pending %.2f s, transfer %.2f s, no error\n", sc, victim_name(i),
             i == SEND ? "every send completed" : "every byte verified", (double)atomic_load(&f->pending_max_ns[i]) / 1e9,
             (double)atomic_load(&f->xfer_ns[i]) / 1e9);
    else
      printf("faults %s:   %s: neither completed nor saw an error\n", sc, victim_name(i));
  }
  return conclude(sc, f, out, pass);
}

static int run_kill(fctx_t* c, shm_t* s) {
  const fopts_t* o = c->o;
  const char* sc = SC_NAMES[o->scenario];
  fshm_t* f = c->f;
  double* lat[2];
  int nlat[2] = {0, 0};
  lat[0] = calloc((size_t)o->trials, sizeof(double));
  lat[1] = calloc((size_t)o->trials, sizeof(double));
  int hangs = 0, slow = 0, broken = 0, noinject = 0, codes[16] = {0};
  uint64_t t0 = now_ns();
  char szs[32];
  fmt_size(szs, sizeof szs, o->size);
  printf("faults %s: %d trials, %s x %d in flight, SIGKILL within %.2f s of the start, bound %.1f s (NCCL_GO_TIMEOUT=%g s)\n",
         sc, o->trials, szs, FWINDOW, o->kill_spread, o->within, o->peer_timeout);
  for (int t = 0; t < o->trials; t++) {
    c->trial = t;
    c->victim = o->victim >= 0 ? o->victim : t % 2;
    c->rng = o->seed + (uint64_t)t * 0x9E3779B97F4A7C15ull;
    pair_outcome_t out;
    int inj;
    if (one_run(c, s, xfer_rank, true, &out, &inj) != 0) return 2;
    int v = c->victim, sv = 1 - v;
    uint64_t fault = atomic_load(&f->fault_ns), err = atomic_load(&f->err_ns[sv]);
    bool killed = out.exited[v] && WIFSIGNALED(out.status[v]) && WTERMSIG(out.status[v]) == SIGKILL;
    const char* what = NULL;
    char why[700] = "";
    if (inj != 0 || !killed) {
      noinject++;
      what = "not injected";
      snprintf(why, sizeof why, "%s", inj_why(inj));
    } else if (out.hung) {
      hangs++;
      what = "HANG";
      snprintf(why, sizeof why, "rank %d stuck in \"%s\" for %.0f s", out.hung_rank, out.hung_where, out.hung_after);
    } else if (err == 0) {
      hangs++;
      what = "HANG";
      snprintf(why, sizeof why, "the surviving %s saw no error: %s", victim_name(sv), f->note[sv]);
    } else if (!rank_ok(&out, sv)) {
      broken++;
      what = "FAIL";
      char st[96];
      snprintf(why, sizeof why, "the surviving %s %s: %s", victim_name(sv), wait_status_str(out.status[sv], st, sizeof st),
               f->note[sv]);
    } else {
      double d = secs_between(fault, err);
      int rc = atomic_load(&f->err_res[sv]);
      codes[rc & 15]++;
      lat[v][nlat[v]++] = d;
      if (d > o->within || err < fault) {
        slow++;
        what = "SLOW";
        char e[512];
        err_desc(f, sv, e, sizeof e);
        snprintf(why, sizeof why, "error %.2f s after the kill: %s", d, e);
      }
    }
    if (what)
      printf("faults %s: trial %d (%s killed): %s: %s\n", sc, t, victim_name(v), what, why);
  }
  bool pass = hangs == 0 && slow == 0 && broken == 0 && noinject == 0;
  for (int v = 0; v < 2; v++) {
    if (nlat[v] == 0) continue;
    qsort(lat[v], (size_t)nlat[v], sizeof(double), cmp_dbl);
    printf("faults %s:   %s killed: %d trials; survivor's error after %.3f s median, %.3f s max (min %.3f)\n", sc,
           victim_name(v), nlat[v], lat[v][nlat[v] / 2], lat[v][nlat[v] - 1], lat[v][0]);
  }
  printf("faults %s:   results seen:", sc);
  for (int i = 0; i < 16; i++)
    if (codes[i]) printf(" %s x%d", result_str((ncclResult_t)i), codes[i]);
  printf("\nfaults %s: %s: %d trials in %.1f s: %d hangs, %d slower than %.1f s, %d survivors failed otherwise, "
         "%d not injected\n",
         sc, pass ? "PASS" : "FAIL", o->trials, secs_since(t0), hangs, slow, o->within, broken, noinject);
  free(lat[0]);
  free(lat[1]);
  return pass ? 0 : 1;
}

static int judge_connect(fctx_t* c, const pair_outcome_t* out) {
  const fopts_t* o = c->o;
  fshm_t* f = c->f;
  const char* sc = SC_NAMES[o->scenario];
  int verdict = atomic_load(&f->connect_outcome);
  double secs = (double)atomic_load(&f->connect_ns) / 1e9;
  double fin = (double)atomic_load(&f->finalize_ns) / 1e9;
  char e[512] = "";
  if (verdict == 1) err_desc(f, SEND, e, sizeof e);
  bool pass = !out->hung && rank_ok(out, 0) && rank_ok(out, 1) && verdict == 1 && secs <= o->within;
  printf("faults %s: connect %s after %.2f s (bound %.1f s, NCCL_GO_TIMEOUT=%g s)%s%s; finalize then took %.2f s\n", sc,
         verdict == 1 ? "failed" : verdict == 2 ? "SUCCEEDED (it should not have)" : "was STILL PENDING", secs, o->within,
         o->peer_timeout, e[0] ? ": " : "", e, fin);
  return conclude(sc, f, out, pass);
}

static int judge_transfer(fctx_t* c, const pair_outcome_t* out, int inj) {
  const fopts_t* o = c->o;
  fshm_t* f = c->f;
  const char* sc = SC_NAMES[o->scenario];
  uint64_t fault = atomic_load(&f->fault_ns), fend = atomic_load(&f->fault_end_ns);
  char szs[32];
  fmt_size(szs, sizeof szs, o->size);
  double bytes = (double)o->size * o->iters;
  bool pass = !out->hung && rank_ok(out, 0) && rank_ok(out, 1);
  if (o->fault != FAULT_NONE) {
    const char* what = o->fault == FAULT_STOP ? "SIGSTOP" : "command";
    printf("faults %s: fault (%s%s%s%s) %s after %d of %d messages: lasted %.2f s%s\n", sc, what,
           o->fault == FAULT_STOP ? " of the " : ": ", o->fault == FAULT_STOP ? victim_name(c->victim) : o->cmd,
           o->fault == FAULT_STOP ? "" : "", inj == 0 ? "injected" : "NOT injected", o->fault_after, o->iters,
           fault && fend ? secs_between(fault, fend) : 0.0,
           o->fault == FAULT_CMD && atomic_load(&f->fault_rc) != 0 ? " (the command FAILED)" : "");
    if (inj != 0) {
      printf("faults %s:   %s\n", sc, inj_why(inj));
      pass = false;
    }
    if (o->fault == FAULT_CMD && atomic_load(&f->fault_rc) != 0) pass = false;
  }
  for (int i = 0; i < 2; i++) {
    uint64_t err = atomic_load(&f->err_ns[i]);
    if (err) {
      char e[512];
      err_desc(f, i, e, sizeof e);
      double d = fault ? secs_between(fault, err) : 0;
      printf("faults %s:   %s: error %s%.2f s after the fault started: %s\n", sc, victim_name(i),
             d < 0 ? "(BEFORE the fault) " : "",
             d, e);
      if (!o->expect_error || d < 0 || d > o->within) pass = false;
    } else if (atomic_load(&f->verified[i])) {
      double secs = (double)atomic_load(&f->xfer_ns[i]) / 1e9;
      uint64_t done = atomic_load(&f->done_ns[i]);
      printf("faults %s:   %s: %d x %s %s in %.2f s = %.3f GB/s%s", sc, victim_name(i), o->iters, szs,
             i == RECV ? "received, every byte verified" : "sent", secs, secs > 0 ? bytes / secs / 1e9 : 0.0,
             fend && done ? "" : "\n");
      if (fend && done) printf(", done %.2f s after the fault ended\n", secs_between(fend, done));
      if (o->expect_error) pass = false;
    } else {
      printf("faults %s:   %s: neither completed nor saw an error\n", sc, victim_name(i));
      pass = false;
    }
  }
  if (o->expect_error)
    printf("faults %s:   expected: both ranks fail within %.1f s of the fault (NCCL_GO_TIMEOUT=%g s)\n", sc, o->within,
           o->peer_timeout);
  if (o->tcp_streams != 0 && atomic_load(&f->verified[RECV])) {
    double ts = (double)atomic_load(&f->tcp_ns) / 1e9, tb = (double)atomic_load(&f->tcp_bytes);
    double plugin = bytes / ((double)atomic_load(&f->xfer_ns[RECV]) / 1e9) / 1e9, tcp = ts > 0 ? tb / ts / 1e9 : 0;
    if (tb > 0) {
      printf("faults %s:   plain TCP, same path, same run: %d stream%s, %.0f bytes in %.2f s = %.3f GB/s; plugin/TCP = %.2f\n",
             sc, atomic_load(&f->tcp_streams), atomic_load(&f->tcp_streams) == 1 ? "" : "s", tb, ts, tcp,
             tcp > 0 ? plugin / tcp : 0);
    } else {
      printf("faults %s:   plain TCP baseline did not run\n", sc);
      pass = false;
    }
  }
  return conclude(sc, f, out, pass);
}

static int judge_stray(fctx_t* c, const pair_outcome_t* out) {
  const fopts_t* o = c->o;
  fshm_t* f = c->f;
  const char* sc = SC_NAMES[o->scenario];
  bool pass = !out->hung && rank_ok(out, 0) && rank_ok(out, 1) && atomic_load(&f->verified[RECV]);
  printf("faults %s: %d kinds x %d strays, before connect and again after set-up (%d connections made, %d refused); "
         "%d hanging while the real connect ran, %d while the listener closed\n",
         sc, ST_KINDS, o->strays, atomic_load(&f->strays_made), atomic_load(&f->strays_refused),
         atomic_load(&f->hanging_at_connect), atomic_load(&f->hanging_at_close));
  printf("faults %s:   real connection: connect %.3f s, accept %.3f s; data %s\n", sc,
         (double)atomic_load(&f->setup_ns[SEND]) / 1e9, (double)atomic_load(&f->setup_ns[RECV]) / 1e9,
         atomic_load(&f->verified[RECV]) ? "verified" : "NOT verified");
  for (int i = 0; i < 2; i++) {
    int b = atomic_load(&f->fds_base[i]), r = atomic_load(&f->fds_after[i]), st = atomic_load(&f->fds_settled[i]);
    if (r < 0) {
      printf("faults %s:   %s: fds not checked (the rank did not get that far)\n", sc, victim_name(i));
      pass = false;
      continue;
    }
    printf("faults %s:   %s: fds baseline %d, right after close %d, 2 s later %d; %d WARNs\n", sc, victim_name(i), b, r, st,
           atomic_load(&f->warns[i]));
    if (st > b || r > b) pass = false;
  }
  return conclude(sc, f, out, pass);
}

static int judge_abort(fctx_t* c, const pair_outcome_t* out) {
  const fopts_t* o = c->o;
  fshm_t* f = c->f;
  const char* sc = SC_NAMES[o->scenario];
  bool pass = !out->hung && rank_ok(out, 0) && rank_ok(out, 1);
  char szs[32];
  fmt_size(szs, sizeof szs, o->size);
  printf("faults %s: v%d, %d rounds%s, %s x %d requests per in-flight round, bound %.1f s per round\n", sc, c->version,
         o->rounds, c->version >= 11 ? " alternating abort-during-set-up / abort-with-requests-in-flight, init+finalize each" :
                                       " of abort-with-requests-in-flight (no finalize before v11)",
         szs, FWINDOW, o->within);
  for (int i = 0; i < 2; i++) {
    int tb = atomic_load(&f->threads_base[i]), te = atomic_load(&f->threads_end[i]), tm = atomic_load(&f->threads_max[i]);
    int done = atomic_load(&f->rounds_done[i]);
    if (done != o->rounds) {
      printf("faults %s:   %s: stopped after %d of %d rounds (fds baseline %d)\n", sc, victim_name(i), done, o->rounds,
             atomic_load(&f->fds_base[i]));
      pass = false;
      continue;
    }
    printf("faults %s:   %s: %d rounds; fds baseline %d, end %d, %d rounds released them only after finalize/close "
           "returned; threads baseline %d, end %d, max %d; slowest round %.3f s (#%d); %d plugin errors, %d "
           "requests/connects abandoned\n",
           sc, victim_name(i), done, atomic_load(&f->fds_base[i]), atomic_load(&f->fds_after[i]),
           atomic_load(&f->late_rounds[i]),
           tb, te, tm, (double)atomic_load(&f->worst_round_ns[i]) / 1e9, atomic_load(&f->worst_round[i]),
           atomic_load(&f->plugin_errors[i]), atomic_load(&f->abandoned[i]));
    /* finalize must release everything before it returns. Without finalize (before v11) a round released
     * late but within 2 s passes: a plugin may keep a closed sender's streams until the receiver has
     * acknowledged their unsent bytes (ours does, docs/socket.md "What a closed sender still owes"); a round
     * whose descriptors were still open 2 s later has already failed above. */
    if (c->version >= 11 && atomic_load(&f->late_rounds[i]) > 0) pass = false;
    if (te > tb + 16) {
      printf("faults %s:   %s: threads grew by %d over the rounds (a thread leak)\n", sc, victim_name(i), te - tb);
      pass = false;
    }
  }
  return conclude(sc, f, out, pass);
}

int cmd_faults(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  fopts_t o;
  if (parse_faults(argc, argv, &o) != 0) return 2;
  shm_t* s = shm_create();
  fshm_t* f = mmap(NULL, sizeof(fshm_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (s == NULL || f == MAP_FAILED) {
    perror("faults: mmap");
    return 2;
  }
  char err[WHY_LEN];
  int v = pick_version(&o.base, s, err, sizeof err);
  if (v < 0) {
    fprintf(stderr, "faults: %s\n", err);
    return 2;
  }
  fctx_t c = {.o = &o, .version = v, .f = f, .victim = o.victim >= 0 ? o.victim : RECV, .rng = o.seed};
  const char* sc = SC_NAMES[o.scenario];
  printf("faults %s: plugin %s, API v%d, seed %llu%s%s%s%s\n", sc, o.base.plugin, v, (unsigned long long)o.seed,
         o.netns[0] ? ", netns " : "", o.netns[0] ? o.netns[0] : "", o.netns[0] ? "," : "", o.netns[0] ? o.netns[1] : "");
  uint64_t t0 = now_ns();
  pair_outcome_t out;
  int inj = -1, rc;
  switch (o.scenario) {
    case SC_KILL: rc = run_kill(&c, s); break;
    case SC_SLOW_RECV:
      if (one_run(&c, s, xfer_rank, false, &out, &inj) != 0) return 2;
      rc = judge_slow(&c, &out);
      break;
    case SC_CONNECT_REFUSED:
    case SC_CONNECT_BLACKHOLE:
      if (one_run(&c, s, connect_rank, false, &out, &inj) != 0) return 2;
      rc = judge_connect(&c, &out);
      break;
    case SC_TRANSFER:
      if (one_run(&c, s, xfer_rank, o.fault != FAULT_NONE, &out, &inj) != 0) return 2;
      rc = judge_transfer(&c, &out, inj);
      break;
    case SC_STRAY:
      if (one_run(&c, s, stray_rank, false, &out, &inj) != 0) return 2;
      rc = judge_stray(&c, &out);
      break;
    default:
      if (one_run(&c, s, abort_rank, false, &out, &inj) != 0) return 2;
      rc = judge_abort(&c, &out);
      break;
  }
  printf("faults %s: took %.1f s\n", sc, secs_since(t0));
  return rc;
}
