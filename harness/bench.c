/*
 * bench.c: latency and bandwidth through the plugin next to plain TCP sockets
 * between the same two processes in the same run, so every ratio is taken
 * under identical conditions.
 *
 * The plugin is driven the way NCCL's proxy progress thread drives it: each
 * pass posts what the window allows and tests the oldest outstanding request,
 * and a pass that made no progress ends in sched_yield(). The processes are not
 * pinned. Every figure is the median of 3 rounds (--rounds) in which the
 * methods alternate, each round starting one method later than the one before
 * (plugin, TCP x1, TCP x4; then TCP x1, TCP x4, plugin; ...), and carries both
 * processes' CPU use over the measured interval (getrusage: user + system
 * time / wall time, so 100 % is one core) and their thread counts
 * (/proc/self/status).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define WINDOW 8
#define NSTREAMS 4
#define ROUNDS 3     /* default rounds per figure */
#define BW_BYTES (1ull << 30) /* per size, method and round: about 0.2 s at 5 GB/s */

static const size_t LAT_SIZES[] = {8, 64, 512, 4096, 32768, 262144, 1048576};
static const size_t BW_SIZES[] = {64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20};
#define NLAT ((int)(sizeof LAT_SIZES / sizeof LAT_SIZES[0]))
#define NBW ((int)(sizeof BW_SIZES / sizeof BW_SIZES[0]))

enum { LAT_PLUGIN, LAT_TCP_POLL, LAT_TCP_POLL2, LAT_TCP_BLOCK, NLATM };
enum { BW_PLUGIN, BW_TCP1, BW_TCP4, NBWM };
static const char* LAT_NAME[NLATM] = {"plugin", "TCP poll", "TCP poll2", "TCP block"};
static const char* BW_NAME[NBWM] = {"plugin", "TCP x1", "TCP x4"};

typedef struct {
  const opts_t* o;
  int version;
  bool lat, bw;
  /* the sizes this run measures: the lists above, or --size alone */
  const size_t* lat_sizes;
  int nlat;
  const size_t* bw_sizes;
  int nbw;
  int iters; /* --iters: ping-pongs per latency round, 0 = by size */
  size_t bw_bytes; /* --bw-bytes: bytes per bandwidth measurement */
} bench_arg_t;

typedef struct {
  const bench_arg_t* a;
  rank_t* r;
  net_t* n;
  link_t* l;
  uint8_t* arena;
  size_t slot;
  void* smh;
  void* rmh;
  int tcp[1 + NSTREAMS];
  unsigned idle; /* idle passes so far: the deadline is read every 64th */
  char why[WHY_LEN];
} bench_t;

/* ------------------------------------------------------------ CPU meter */

/* What one process spent over a measured interval. */
typedef struct {
  double cpu; /* % of one core */
  int threads;
} usage_t;

typedef struct {
  uint64_t t0;
  double cpu0;
  int threads; /* most seen while measuring */
} meter_t;

static double cpu_seconds(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
         (double)ru.ru_stime.tv_usec / 1e6;
}

static void meter_start(meter_t* m) {
  m->threads = 0;
  m->cpu0 = cpu_seconds();
  m->t0 = now_ns();
}

/* Samples the thread count at a point where every thread of the method exists. */
static void meter_sample(meter_t* m) {
  int t = count_threads();
  if (t > m->threads) m->threads = t;
}

static usage_t meter_stop(meter_t* m) {
  uint64_t t1 = now_ns();
  double cpu = cpu_seconds() - m->cpu0;
  meter_sample(m);
  usage_t u = {t1 > m->t0 ? 100.0 * cpu / ((double)(t1 - m->t0) / 1e9) : 0, m->threads};
  return u;
}

/* Rank 1 hands its usage to rank 0, which prints both. */
static int swap_usage(bench_t* b, usage_t mine, usage_t both[2]) {
  if (b->r->rank == 1) return ctl_send(b->r, &mine, sizeof mine);
  both[0] = mine;
  return ctl_recv(b->r, &both[1], sizeof both[1], 60);
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

/* Rounds per figure, set once before the ranks fork. */
static int rounds = ROUNDS;

/* The median of this run's rounds; with an even count, the lower middle, so
 * that the figure is one a round measured and median_round can name it. */
static double median(const double v[BENCH_MAX_ROUNDS]) {
  double s[BENCH_MAX_ROUNDS];
  memcpy(s, v, sizeof s);
  qsort(s, rounds, sizeof s[0], cmp_double);
  return s[(rounds - 1) / 2];
}

/* The round whose main figure is the median, so CPU and threads shown next to
 * a figure come from the same round. */
static int median_round(const double v[BENCH_MAX_ROUNDS]) {
  double m = median(v);
  for (int i = 0; i < rounds; i++)
    if (v[i] == m) return i;
  return 0;
}

/* ------------------------------------------------ NCCL-like request polling */

/* A polling pass that found nothing to do: yields, as NCCL's proxy does; -1
 * with late as the reason once the check's deadline has passed. The clock
 * is read every 64th pass only: NCCL's proxy reads none per pass, nor does
 * the TCP poll loop this is compared with, and where clock_gettime is not a
 * vDSO call (the Soft-RoCE guest's HPET clock: a system call of ~20 us) a
 * read per pass would be the harness's cost counted as the plugin's. */
static int idle_pass(bench_t* b, const char* late) {
  if ((++b->idle & 63) == 0 && past_deadline(b->r)) {
    snprintf(b->why, sizeof b->why, "%s", late);
    return -1;
  }
  sched_yield();
  return 0;
}

/* Tests req until done; a pass that did not complete it is an idle pass. */
static int wait_yield(bench_t* b, void* req) {
  int done = 0, got[1];
  while (!done) {
    ncclResult_t res = net_test(b->n, req, &done, got);
    if (res != ncclSuccess) {
      char w[300];
      harness_last_warn(w, sizeof w);
      snprintf(b->why, sizeof b->why, "test returned %s%s%s", result_str(res), w[0] ? "; last WARN: " : "", w);
      return -1;
    }
    if (!done && idle_pass(b, "a request did not complete before the deadline") != 0) return -1;
  }
  return 0;
}

/* One ping-pong round through the plugin; rank 0 returns the round-trip time. */
static int plugin_pingpong(bench_t* b, size_t sz, double* rtt_us) {
  net_t* n = b->n;
  uint8_t* sbuf = b->arena;
  uint8_t* rbuf = b->arena + b->slot;
  void *rq, *sq;
  ncclResult_t res;
  uint64_t t0 = now_ns();
  if (b->r->rank == 0) {
    if ((res = post_one(b->r, n, false, b->l->rc, rbuf, sz, 1, b->rmh, &rq)) != ncclSuccess ||
        (res = post_one(b->r, n, true, b->l->sc, sbuf, sz, 0, b->smh, &sq)) != ncclSuccess) {
      snprintf(b->why, sizeof b->why, "posting a ping returned %s", result_str(res));
      return -1;
    }
    if (wait_yield(b, sq) || wait_yield(b, rq)) return -1;
    *rtt_us = (double)(now_ns() - t0) / 1e3;
  } else {
    if ((res = post_one(b->r, n, false, b->l->rc, rbuf, sz, 0, b->rmh, &rq)) != ncclSuccess) {
      snprintf(b->why, sizeof b->why, "irecv returned %s", result_str(res));
      return -1;
    }
    if (wait_yield(b, rq)) return -1;
    if ((res = post_one(b->r, n, true, b->l->sc, sbuf, sz, 1, b->smh, &sq)) != ncclSuccess) {
      snprintf(b->why, sizeof b->why, "isend returned %s", result_str(res));
      return -1;
    }
    if (wait_yield(b, sq)) return -1;
  }
  return 0;
}

/* One ping-pong round over plain TCP. Two connections: the ping goes on one,
 * the pong on the other, as with NCCL's send and receive comms (each one-way
 * connection then acknowledges every message with a packet of its own,
 * where one connection carries acknowledgements on the replies). */
static int tcp_pingpong(bench_t* b, size_t sz, bool poll, bool two, double* rtt_us) {
  int ping = b->tcp[0], pong = two ? b->tcp[1] : b->tcp[0];
  int (*snd)(int, const void*, size_t) = poll ? tcp_send_poll : tcp_send_all;
  int (*rcv)(int, void*, size_t) = poll ? tcp_recv_poll : tcp_recv_all;
  uint64_t t0 = now_ns();
  if (b->r->rank == 0) {
    if (snd(ping, b->arena, sz) || rcv(pong, b->arena + b->slot, sz)) goto err;
    *rtt_us = (double)(now_ns() - t0) / 1e3;
  } else {
    if (rcv(ping, b->arena + b->slot, sz) || snd(pong, b->arena, sz)) goto err;
  }
  return 0;
err:
  snprintf(b->why, sizeof b->why, "TCP ping-pong failed");
  return -1;
}

static int lat_iters(const bench_arg_t* a, size_t sz) {
  if (a->iters > 0) return a->iters;
  return sz <= 4096 ? 2000 : sz <= 32768 ? 1000 : sz <= 262144 ? 300 : 100;
}

/* --verbose's map of a latency round's tail: how many round trips took more
 * than SLOW_OVER times the round's median, in each tenth of the round. Slow
 * ones bunched in the first tenths are a start-up cost (docs/performance.md,
 * "The tail of a short round is sysmon waking up"); spread evenly, they are
 * what runs beside the polling threads all the time. */
#define SLOW_OVER 2.5
#define SLOW_BINS 10

/* One latency measurement: rank 0 gets the median and p99 round trip, and
 * where the round's slow round trips fell. */
static int run_lat(bench_t* b, int method, size_t sz, double* median, double* p99, int slow[SLOW_BINS], usage_t u[2]) {
  int iters = lat_iters(b->a, sz), warm = iters / 10;
  double* v = calloc((size_t)iters, sizeof *v);
  if (ctl_barrier(b->r, 60)) {
    snprintf(b->why, sizeof b->why, "lost the other rank before a latency run");
    free(v);
    return -1;
  }
  meter_t m;
  for (int i = -warm; i < iters; i++) {
    if (i == 0) meter_start(&m);
    double rtt = 0;
    int rc = method == LAT_PLUGIN ? plugin_pingpong(b, sz, &rtt)
                                  : tcp_pingpong(b, sz, method != LAT_TCP_BLOCK, method == LAT_TCP_POLL2, &rtt);
    if (rc) {
      free(v);
      return -1;
    }
    if (i >= 0) v[i] = rtt;
  }
  usage_t mine = meter_stop(&m);
  if (b->r->rank == 0) {
    double* s = malloc((size_t)iters * sizeof *s);
    if (s == NULL) {
      snprintf(b->why, sizeof b->why, "out of memory sorting %d round trips", iters);
      free(v);
      return -1;
    }
    memcpy(s, v, (size_t)iters * sizeof *s);
    qsort(s, (size_t)iters, sizeof *s, cmp_double);
    *median = s[iters / 2];
    int k = (int)((double)iters * 0.99);
    *p99 = s[k >= iters ? iters - 1 : k];
    for (int i = 0; i < SLOW_BINS; i++) slow[i] = 0;
    for (int i = 0; i < iters; i++)
      if (v[i] > SLOW_OVER * *median) slow[(int)((long)i * SLOW_BINS / iters)]++;
    free(s);
  }
  free(v);
  if (swap_usage(b, mine, u)) {
    snprintf(b->why, sizeof b->why, "lost the other rank after a latency run");
    return -1;
  }
  return 0;
}

/* The proxy's loop for one connection: post while the window allows, test the
 * oldest request until one is not done, yield when the pass moved nothing. */
static int plugin_stream(bench_t* b, size_t sz, int count) {
  bool sender = b->r->rank == 1;
  void* comm = sender ? b->l->sc : b->l->rc;
  void* mh = sender ? b->smh : b->rmh;
  void* reqs[WINDOW];
  int posted = 0, done = 0;
  while (done < count) {
    bool progress = false;
    while (posted < count && posted - done < WINDOW) {
      void* req = NULL;
      ncclResult_t res;
      uint8_t* buf = b->arena + (size_t)(posted % WINDOW) * b->slot;
      if (sender) {
        res = net_isend(b->n, comm, buf, sz, 1, mh, NULL, &req);
      } else {
        void* data[1] = {buf};
        size_t szs[1] = {sz};
        int tags[1] = {1};
        void* mhs[1] = {mh};
        res = net_irecv(b->n, comm, 1, data, szs, tags, mhs, NULL, &req);
      }
      if (res != ncclSuccess) {
        snprintf(b->why, sizeof b->why, "%s returned %s", sender ? "isend" : "irecv", result_str(res));
        return -1;
      }
      if (req == NULL) break; /* the plugin asks to retry later */
      reqs[posted % WINDOW] = req;
      posted++;
      progress = true;
    }
    while (done < posted) {
      int d = 0, got[1];
      ncclResult_t res = net_test(b->n, reqs[done % WINDOW], &d, got);
      if (res != ncclSuccess) {
        snprintf(b->why, sizeof b->why, "test returned %s", result_str(res));
        return -1;
      }
      if (!d) break;
      done++;
      progress = true;
    }
    if (!progress && idle_pass(b, "bandwidth run did not finish before the deadline") != 0) return -1;
  }
  return 0;
}

typedef struct {
  bench_t* b;
  int k;
  size_t sz;
  int count;
  int rc;
} stripe_t;

/* Stream k carries bytes [k*stripe, (k+1)*stripe) of every message. */
static void* stripe_main(void* p) {
  stripe_t* s = p;
  size_t stripe = s->sz / NSTREAMS, off = (size_t)s->k * stripe;
  size_t len = s->k == NSTREAMS - 1 ? s->sz - off : stripe;
  int fd = s->b->tcp[1 + s->k];
  for (int i = 0; i < s->count && s->rc == 0; i++) {
    uint8_t* buf = s->b->arena + (size_t)(i % WINDOW) * s->b->slot + off;
    s->rc = s->b->r->rank == 1 ? tcp_send_all(fd, buf, len) : tcp_recv_all(fd, buf, len);
  }
  return NULL;
}

static int tcp_stream(bench_t* b, size_t sz, int count, int streams, meter_t* m) {
  if (streams == 1) {
    for (int i = 0; i < count; i++) {
      uint8_t* buf = b->arena + (size_t)(i % WINDOW) * b->slot;
      int rc = b->r->rank == 1 ? tcp_send_all(b->tcp[0], buf, sz) : tcp_recv_all(b->tcp[0], buf, sz);
      if (rc) {
        snprintf(b->why, sizeof b->why, "TCP stream failed");
        return -1;
      }
    }
    return 0;
  }
  pthread_t th[NSTREAMS];
  stripe_t st[NSTREAMS];
  for (int k = 0; k < NSTREAMS; k++) {
    st[k] = (stripe_t){b, k, sz, count, 0};
    pthread_create(&th[k], NULL, stripe_main, &st[k]);
  }
  if (m) meter_sample(m);
  int rc = 0;
  for (int k = 0; k < NSTREAMS; k++) {
    pthread_join(th[k], NULL);
    rc |= st[k].rc;
  }
  if (rc) snprintf(b->why, sizeof b->why, "4-stream TCP failed");
  return rc ? -1 : 0;
}

static int bw_count(const bench_arg_t* a, size_t sz) {
  int count = (int)(a->bw_bytes / sz);
  return count < 16 ? 16 : count;
}

/* One bandwidth measurement, rank 1 sending to rank 0; rank 0 gets GB/s. */
static int run_bw(bench_t* b, int method, size_t sz, double* gbs, usage_t u[2]) {
  int count = bw_count(b->a, sz);
  int warm = 16;
  usage_t mine = {0, 0};
  for (int pass = 0; pass < 2; pass++) {
    int c = pass == 0 ? warm : count;
    if (ctl_barrier(b->r, 60)) {
      snprintf(b->why, sizeof b->why, "lost the other rank before a bandwidth run");
      return -1;
    }
    meter_t m;
    meter_start(&m);
    int rc = method == BW_PLUGIN ? plugin_stream(b, sz, c) : tcp_stream(b, sz, c, method == BW_TCP1 ? 1 : NSTREAMS, &m);
    if (rc) return -1;
    /* The receiver's clock runs until its last byte arrived; the sender's
     * CPU share is over its own interval. */
    mine = meter_stop(&m);
    if (pass == 1) *gbs = (double)sz * c / ((double)(now_ns() - m.t0) / 1e9) / 1e9;
  }
  if (swap_usage(b, mine, u)) {
    snprintf(b->why, sizeof b->why, "lost the other rank after a bandwidth run");
    return -1;
  }
  return 0;
}

/* ------------------------------------------------------------- reporting */

typedef struct {
  double med[NLATM][BENCH_MAX_ROUNDS], p99[NLATM][BENCH_MAX_ROUNDS];
  int slow[NLATM][BENCH_MAX_ROUNDS][SLOW_BINS];
  usage_t u[NLATM][BENCH_MAX_ROUNDS][2];
} lat_res_t;

typedef struct {
  double gbs[NBWM][BENCH_MAX_ROUNDS];
  usage_t u[NBWM][BENCH_MAX_ROUNDS][2];
} bw_res_t;

static int bw_index(const bench_arg_t* a, size_t sz) {
  for (int i = 0; i < a->nbw; i++)
    if (a->bw_sizes[i] == sz) return i;
  return -1;
}

static void print_verdict(const char* what, double v, double target, bool higher_better) {
  bool ok = higher_better ? v >= target : v <= target;
  printf("  %-52s %7.*f  (target %s %.2f: %s)\n", what, verdict_precision(v, target, higher_better), v,
         higher_better ? ">=" : "<=", target, ok ? "met" : "NOT met");
}

/* print_ratio: num / den against its target, or why there is none (no
 * baseline was measured: --plugin-only). */
static void print_ratio(const char* what, double num, double den, double target, bool higher_better) {
  if (den <= 0 || num <= 0) {
    printf("  %-52s %7s  (no baseline measured in this run: --plugin-only)\n", what, "-");
    return;
  }
  print_verdict(what, num / den, target, higher_better);
}

/* The end of a latency or bandwidth row: both ranks' cpu%/threads in the
 * method's median round, and the plugin's figure over this method's (blank on
 * the plugin's own row). */
static void print_row_end(const usage_t u[2], bool plugin_row, double plugin, double self) {
  char ratio[32] = "";
  if (!plugin_row && self > 0) snprintf(ratio, sizeof ratio, "%.2f", plugin / self);
  printf(" %8.0f%%/%-4d %8.0f%%/%-4d %12s\n", u[0].cpu, u[0].threads, u[1].cpu, u[1].threads, ratio);
}

/* --verbose: every round's figure under its median, in the order the rounds
 * ran, so that a slow spell (a state that lasts rounds) shows as such. */
static void print_rounds(const double* v, int decimals) {
  printf("%8s %6s  %-10s", "", "", "rounds");
  for (int i = 0; i < rounds; i++) printf(" %.*f", decimals, v[i]);
  printf("\n");
}

/* The price of one idle pass, NCCL's most frequent call: a test of a receive
 * nothing has arrived for (cgo callback, handle lookup, the transport's poll),
 * next to what the same poll costs a C program (recv() on an idle TCP socket)
 * and the sched_yield() that ends the pass. Rank 1 then sends the message the
 * receive waits for, so the comm is left as it was. */
#define IDLE_CALLS 200000
static double ns_per_call(uint64_t t0, uint64_t t1) { return (double)(t1 - t0) / IDLE_CALLS; }

static int bench_idle(bench_t* b) {
  rank_t* r = b->r;
  net_t* n = b->n;
  void* req = NULL;
  ncclResult_t res;
  if (ctl_barrier(r, 60)) {
    snprintf(b->why, sizeof b->why, "lost the other rank before the idle-pass measurement");
    return -1;
  }
  if (r->rank == 0) {
    if ((res = post_one(r, n, false, b->l->rc, b->arena + b->slot, 8, 1, b->rmh, &req)) != ncclSuccess) {
      snprintf(b->why, sizeof b->why, "irecv for the idle-pass measurement returned %s", result_str(res));
      return -1;
    }
    int done = 0, got[1];
    meter_t m;
    meter_start(&m);
    uint64_t t0 = now_ns();
    for (int i = 0; i < IDLE_CALLS; i++) {
      res = net_test(n, req, &done, got);
      if (res != ncclSuccess || done) {
        snprintf(b->why, sizeof b->why, "a receive nothing was sent for %s", done ? "completed" : "failed");
        return -1;
      }
    }
    uint64_t t1 = now_ns();
    usage_t u = meter_stop(&m);
    double c_recv = 0;
    if (b->tcp[0] >= 0) {
      char c;
      uint64_t t2 = now_ns();
      for (int i = 0; i < IDLE_CALLS; i++)
        if (recv(b->tcp[0], &c, 1, MSG_DONTWAIT) >= 0) break; /* nothing is sent on it now */
      c_recv = ns_per_call(t2, now_ns());
    }
    uint64_t t3 = now_ns();
    for (int i = 0; i < IDLE_CALLS; i++) sched_yield();
    double yield = ns_per_call(t3, now_ns());
    printf("\nidle pass: test of a pending receive %.0f ns per call (rank 0 %.0f%%/%d threads); C recv() on an\n"
           "idle TCP socket %.0f ns, sched_yield() %.0f ns; %d calls each\n",
           ns_per_call(t0, t1), u.cpu, u.threads, c_recv, yield, IDLE_CALLS);
  }
  if (ctl_barrier(r, 60)) {
    snprintf(b->why, sizeof b->why, "lost the other rank after the idle-pass measurement");
    return -1;
  }
  if (r->rank == 1) {
    if ((res = post_one(r, n, true, b->l->sc, b->arena, 8, 1, b->smh, &req)) != ncclSuccess) {
      snprintf(b->why, sizeof b->why, "isend ending the idle-pass measurement returned %s", result_str(res));
      return -1;
    }
  }
  return wait_yield(b, req);
}

/* The k-th method to run in a round. The order rotates by one each round, so
 * that no method always runs first after a size change or right after another
 * given method: the VM's slow spells last seconds, and a fixed order lets them
 * fall on the same neighbour pair every time (docs/performance.md, "Noise"). */
static int method_in_round(int round, int k, int nm) { return (round + k) % nm; }

static int bench_lat(bench_t* b, lat_res_t* res) {
  rank_t* r = b->r;
  int nm = b->a->o->plugin_only ? 1 : NLATM;
  if (r->rank == 0)
    printf("\nlatency: ping-pong round trip, microseconds, median of %d alternating rounds (p99: median of the\n"
           "rounds' p99s). plugin: driven NCCL-style (test, sched_yield when not done). TCP poll: non-blocking\n"
           "send/recv, sched_yield on EAGAIN, one connection. TCP poll2: the same over two one-way connections,\n"
           "ping on one and pong on the other, as NCCL's send and receive comms are. TCP block: blocking\n"
           "send/recv, one connection. cpu%%/threads of each rank over the measured interval.\n"
           "%8s %6s  %-10s %9s %9s %14s %14s %12s\n",
           rounds, "size", "iters", "method", "median", "p99", "rank 0", "rank 1", "plugin/this");
  for (int i = 0; i < b->a->nlat; i++) {
    size_t sz = b->a->lat_sizes[i];
    lat_res_t* lr = &res[i];
    for (int round = 0; round < rounds; round++)
      for (int k = 0; k < nm; k++) {
        int m = method_in_round(round, k, nm);
        set_where(r, "latency %zu B, %s, round %d", sz, LAT_NAME[m], round + 1);
        if (run_lat(b, m, sz, &lr->med[m][round], &lr->p99[m][round], lr->slow[m][round], lr->u[m][round])) return -1;
      }
    if (r->rank != 0) continue;
    char s1[32];
    fmt_size(s1, sizeof s1, sz);
    double pm = median(lr->med[LAT_PLUGIN]);
    for (int m = 0; m < nm; m++) {
      double med = median(lr->med[m]), p99 = median(lr->p99[m]);
      printf("%8s %6d  %-10s %9.2f %9.2f", m == 0 ? s1 : "", lat_iters(b->a, sz), LAT_NAME[m], med, p99);
      print_row_end(lr->u[m][median_round(lr->med[m])], m == LAT_PLUGIN, pm, med);
      if (b->a->o->verbose) {
        print_rounds(lr->med[m], 2);
        printf("%8s %6s  %-10s", "", "", "slow");
        for (int round = 0; round < rounds; round++) {
          printf("%s", round ? " |" : "");
          for (int t = 0; t < SLOW_BINS; t++) printf(" %d", lr->slow[m][round][t]);
        }
        printf("  (round trips over %.1fx the round's median, per tenth of each round)\n", SLOW_OVER);
      }
    }
  }
  return 0;
}

static int bench_bw(bench_t* b, bw_res_t* res) {
  rank_t* r = b->r;
  int nm = b->a->o->plugin_only ? 1 : NBWM;
  if (r->rank == 0)
    printf("\nbandwidth: rank 1 sends to rank 0, GB/s (1e9 B/s), median of %d alternating rounds. plugin: %d\n"
           "requests in flight, driven NCCL-style. TCP x1: one blocking socket. TCP x4: 4 sockets, a thread each\n"
           "per side, every message striped in 4. cpu%%/threads of rank 0 (receiver) and rank 1 (sender).\n"
           "%8s %6s  %-10s %9s %14s %14s %12s\n",
           rounds, WINDOW, "size", "msgs", "method", "GB/s", "rank 0", "rank 1", "plugin/this");
  for (int i = 0; i < b->a->nbw; i++) {
    size_t sz = b->a->bw_sizes[i];
    bw_res_t* br = &res[i];
    for (int round = 0; round < rounds; round++)
      for (int k = 0; k < nm; k++) {
        int m = method_in_round(round, k, nm);
        set_where(r, "bandwidth %zu B, %s, round %d", sz, BW_NAME[m], round + 1);
        if (run_bw(b, m, sz, &br->gbs[m][round], br->u[m][round])) return -1;
      }
    if (r->rank != 0) continue;
    char s1[32];
    fmt_size(s1, sizeof s1, sz);
    double pg = median(br->gbs[BW_PLUGIN]);
    for (int m = 0; m < nm; m++) {
      double g = median(br->gbs[m]);
      printf("%8s %6d  %-10s %9.3f", m == 0 ? s1 : "", bw_count(b->a, sz), BW_NAME[m], g);
      print_row_end(br->u[m][median_round(br->gbs[m])], m == BW_PLUGIN, pg, g);
      if (b->a->o->verbose) print_rounds(br->gbs[m], 3);
    }
  }
  return 0;
}

/* A bandwidth ratio's rounds, when one of the two figures' rounds spread by
 * 2x or more: on a shared VM a slow spell of the whole machine (it hits
 * plain TCP as much as the plugin, docs/performance.md "Slow spells") can
 * cover two of three rounds and move a median by half. */
static void print_spread(const char* name, const double v[BENCH_MAX_ROUNDS]) {
  double lo = v[0], hi = v[0];
  for (int i = 1; i < rounds; i++) {
    if (v[i] < lo) lo = v[i];
    if (v[i] > hi) hi = v[i];
  }
  if (lo <= 0 || hi < 2 * lo) return;
  printf("  %-52s %s rounds spread %.1fx:", "", name, hi / lo);
  for (int i = 0; i < rounds; i++) printf(" %.3f", v[i]);
  printf(" GB/s (a slow spell? rerun)\n");
}

/* The ratios issue #10 sets targets for, from this run's figures. */
static void print_summary(const bench_arg_t* a, const lat_res_t* lat, const bw_res_t* bw) {
  printf("\nsummary (ratios against baselines measured in this run):\n");
  if (a->lat && a->lat_sizes[0] == 8) {
    const lat_res_t* l8 = &lat[0];
    double pm = median(l8->med[LAT_PLUGIN]), pp = median(l8->p99[LAT_PLUGIN]);
    double poll = median(l8->med[LAT_TCP_POLL]), poll2 = median(l8->med[LAT_TCP_POLL2]);
    print_ratio("8 B round trip, plugin / TCP poll", pm, poll, 1.5, false);
    if (poll2 > 0 && poll > 0)
      printf("  %-52s %7.2f  (TCP's own cost of NCCL's one-way comms: poll2 / poll = %.2f)\n",
             "8 B round trip, plugin / TCP poll over 2 connections", pm / poll2, poll2 / poll);
    print_verdict("8 B round trip, plugin p99 / median", pm > 0 ? pp / pm : 0, 3.0, false);
  }
  if (a->bw) {
    static const size_t x4[] = {1 << 20, 4 << 20, 64 << 20};
    for (int k = 0; k < 3; k++) {
      if (bw_index(a, x4[k]) < 0) continue;
      const bw_res_t* r = &bw[bw_index(a, x4[k])];
      double p = median(r->gbs[BW_PLUGIN]), t = median(r->gbs[BW_TCP4]);
      char what[80], s1[32];
      fmt_size(s1, sizeof s1, x4[k]);
      snprintf(what, sizeof what, "%s bandwidth, plugin / TCP x4", s1);
      print_ratio(what, p, t, 1.0, true);
      print_spread("plugin", r->gbs[BW_PLUGIN]);
      if (t > 0) print_spread("TCP x4", r->gbs[BW_TCP4]);
    }
    if (bw_index(a, 64 << 10) >= 0) {
      const bw_res_t* r64 = &bw[bw_index(a, 64 << 10)];
      double p = median(r64->gbs[BW_PLUGIN]), t = median(r64->gbs[BW_TCP1]);
      print_ratio("64 KiB bandwidth, plugin / TCP x1", p, t, 1.0, true);
      print_spread("plugin", r64->gbs[BW_PLUGIN]);
      if (t > 0) print_spread("TCP x1", r64->gbs[BW_TCP1]);
    }
    if (bw_index(a, 1 << 20) < 0) return;
    const bw_res_t* r1 = &bw[bw_index(a, 1 << 20)];
    const usage_t* u = r1->u[BW_PLUGIN][median_round(r1->gbs[BW_PLUGIN])];
    char what[80];
    snprintf(what, sizeof what, "1 MiB streaming, receiver CPU %% (%d threads)", u[0].threads);
    print_verdict(what, u[0].cpu, 105, false);
    snprintf(what, sizeof what, "1 MiB streaming, sender CPU %% (%d threads)", u[1].threads);
    print_verdict(what, u[1].cpu, 105, false);
  }
}

/* ------------------------------------------------------------------ rank */

static int bench_rank(rank_t* r, void* arg) {
  bench_arg_t* a = arg;
  shm_t* s = r->shm;
  net_t n;
  hprops_t p;
  link_t l = {0};
  bench_t b = {.a = a, .r = r, .n = &n, .l = &l};
  lat_res_t* lat = calloc(NLAT, sizeof *lat);
  bw_res_t* bw = calloc(NBW, sizeof *bw);
  for (int i = 0; i < 1 + NSTREAMS; i++) b.tcp[i] = -1;
  int rc = 1;
  atomic_store(&s->cur_start_ns[r->rank], now_ns());
  atomic_store(&s->cur[r->rank], 0);
  r->deadline_ns = now_ns() + (uint64_t)(rank_budget(r->timeout) * 1e9);
  if (lat == NULL || bw == NULL) {
    snprintf(b.why, sizeof b.why, "out of memory");
    goto done;
  }
  if (rank_open(r, &n, a->o->plugin, a->version, &p, b.why, sizeof b.why) != 0) goto done;
  if (link_up(r, &n, &l, 0, 30, b.why, sizeof b.why) != 0) goto done;
  set_where(r, "connecting the TCP baseline");
  if (r->rank == 0) {
    int port = 0, lfd = tcp_listen(&port);
    if (lfd < 0 || ctl_send(r, &port, sizeof port)) {
      snprintf(b.why, sizeof b.why, "cannot listen on 127.0.0.1 for the TCP baseline");
      goto done;
    }
    for (int i = 0; i < 1 + NSTREAMS; i++)
      if ((b.tcp[i] = tcp_accept(lfd, 30)) < 0) {
        snprintf(b.why, sizeof b.why, "TCP baseline accept failed");
        close(lfd);
        goto done;
      }
    close(lfd);
  } else {
    int port = 0;
    if (ctl_recv(r, &port, sizeof port, 30)) {
      snprintf(b.why, sizeof b.why, "no TCP port from rank 0");
      goto done;
    }
    for (int i = 0; i < 1 + NSTREAMS; i++) {
      /* sequential connects are accepted in the same order */
      if ((b.tcp[i] = tcp_connect(port, 30)) < 0) {
        snprintf(b.why, sizeof b.why, "TCP baseline connect failed");
        goto done;
      }
    }
  }
  size_t maxsz = a->bw ? a->bw_sizes[a->nbw - 1] : a->lat_sizes[a->nlat - 1];
  b.slot = (maxsz + 4095) & ~(size_t)4095;
  size_t alen = b.slot * WINDOW;
  b.arena = buf_alloc(alen);
  if (b.arena == NULL) {
    snprintf(b.why, sizeof b.why, "cannot allocate %zu bytes", alen);
    goto done;
  }
  pattern_fill(b.arena, alen, 7);
  /* A failed registration must stop the run, not leave it measuring with
   * NULL handles (which an RDMA transport refuses, or worse). */
  ncclResult_t sres = net_regmr(&n, l.sc, b.arena, alen, NCCL_PTR_HOST, &b.smh);
  ncclResult_t rres = sres == ncclSuccess ? net_regmr(&n, l.rc, b.arena, alen, NCCL_PTR_HOST, &b.rmh) : sres;
  if (sres != ncclSuccess || rres != ncclSuccess) {
    snprintf(b.why, sizeof b.why, "regMr of %zu bytes on the %s comm returned %s", alen, sres != ncclSuccess ? "send" : "recv",
             result_str(sres != ncclSuccess ? sres : rres));
    goto done;
  }
  char tr[64];
  harness_transport_name(tr, sizeof tr);
  if (r->rank == 0)
    printf("bench: v%d plugin=%s transport=%s device=%s; 2 processes, not pinned, %ld CPUs online; "
           "TCP baselines over 127.0.0.1 (TCP_NODELAY)\n",
           a->version, n.name, tr[0] ? tr : "unknown", p.name, sysconf(_SC_NPROCESSORS_ONLN));
  if (a->lat && (bench_idle(&b) || bench_lat(&b, lat))) goto done;
  if (a->bw && bench_bw(&b, bw)) goto done;
  if (r->rank == 0) print_summary(a, lat, bw);
  if (ctl_barrier(r, 60) == 0) rc = 0;
  else snprintf(b.why, sizeof b.why, "lost the other rank at the end");
done:
  if (rc) {
    snprintf(s->text[r->rank], sizeof s->text[0], "%s", b.why);
    fprintf(stderr, "bench: rank %d: %s\n", r->rank, b.why);
  } else {
    if (b.arena) {
      net_deregmr(&n, l.sc, b.smh);
      net_deregmr(&n, l.rc, b.rmh);
    }
    link_down(&n, &l);
    rank_close(&n);
  }
  for (int i = 0; i < 1 + NSTREAMS; i++)
    if (b.tcp[i] >= 0) close(b.tcp[i]);
  free(lat);
  free(bw);
  fflush(stdout);
  atomic_store(&s->cur[r->rank], -1);
  return rc;
}

int cmd_bench(const opts_t* o) {
  shm_t* s;
  if (o->rounds) rounds = o->rounds;
  int v, rc = cmd_start(o, "bench", &s, &v);
  if (rc != 0) return rc;
  bench_arg_t a = {o, v, strcmp(o->bench_what, "bw") != 0, strcmp(o->bench_what, "lat") != 0,
                   LAT_SIZES, NLAT, BW_SIZES, NBW, o->iters_set ? o->iters : 0,
                   o->bw_bytes ? o->bw_bytes : BW_BYTES};
  if (o->size_set) {
    if (o->size == 0 || o->size > (1ull << 30)) {
      fprintf(stderr, "bench: --size must be 1 B to 1 GiB\n");
      return 2;
    }
    a.lat_sizes = a.bw_sizes = &o->size;
    a.nlat = a.nbw = 1;
  }
  double limit = o->timeout > 0 ? o->timeout : 1800;
  pair_outcome_t out;
  if (run_pair(s, bench_rank, &a, limit, limit + 10, &out) != 0) return 2;
  if (out.hung) {
    printf("bench: FAILED: rank %d hung in \"%s\" for %.0f s\n", out.hung_rank, out.hung_where, out.hung_after);
    return 1;
  }
  int ok = 1;
  for (int i = 0; i < 2; i++) {
    char st[96];
    if (!(WIFEXITED(out.status[i]) && WEXITSTATUS(out.status[i]) == 0)) {
      ok = 0;
      printf("bench: FAILED: rank %d %s: %s (in \"%s\")\n", i, wait_status_str(out.status[i], st, sizeof st), s->text[i],
             s->where[i]);
    }
  }
  return ok ? 0 : 1;
}
