/*
 * bench.c: latency and bandwidth through the plugin, and the same two
 * measurements over plain TCP sockets between the same two processes in the
 * same run, so the ratio plugin/TCP is taken under identical conditions.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define WINDOW 8
#define NSTREAMS 4
#define BW_BYTES (512ull << 20) /* per size and per method */

static const size_t LAT_SIZES[] = {8, 64, 512, 4096, 32768, 262144, 1048576};
static const size_t BW_SIZES[] = {64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20};
#define NLAT ((int)(sizeof LAT_SIZES / sizeof LAT_SIZES[0]))
#define NBW ((int)(sizeof BW_SIZES / sizeof BW_SIZES[0]))

typedef struct {
  const opts_t* o;
  int version;
  bool lat, bw;
} bench_arg_t;

typedef struct {
  rank_t* r;
  net_t* n;
  link_t* l;
  uint8_t* arena;
  size_t slot;
  void* smh;
  void* rmh;
  int tcp[1 + NSTREAMS];
  char why[WHY_LEN];
} bench_t;

static int lat_iters(size_t sz) { return sz <= 4096 ? 2000 : sz <= 32768 ? 1000 : sz <= 262144 ? 300 : 100; }

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static void stats(double* v, int n, double* median, double* p99) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  *median = v[n / 2];
  int k = (int)((double)n * 0.99);
  *p99 = v[k >= n ? n - 1 : k];
}

/* One ping-pong round through the plugin; rank 0 returns the round-trip time. */
static int plugin_pingpong(bench_t* b, size_t sz, double* rtt_us) {
  net_t* n = b->n;
  uint8_t* sbuf = b->arena;
  uint8_t* rbuf = b->arena + b->slot;
  void *rq, *sq;
  int got;
  ncclResult_t res;
  uint64_t t0 = now_ns();
  if (b->r->rank == 0) {
    if ((res = post_one(b->r, n, false, b->l->rc, rbuf, sz, 1, b->rmh, &rq)) != ncclSuccess ||
        (res = post_one(b->r, n, true, b->l->sc, sbuf, sz, 0, b->smh, &sq)) != ncclSuccess) {
      snprintf(b->why, sizeof b->why, "posting a ping returned %s", result_str(res));
      return -1;
    }
    if (wait_one(b->r, n, sq, &got, b->why, sizeof b->why) || wait_one(b->r, n, rq, &got, b->why, sizeof b->why)) return -1;
    *rtt_us = (double)(now_ns() - t0) / 1e3;
  } else {
    if ((res = post_one(b->r, n, false, b->l->rc, rbuf, sz, 0, b->rmh, &rq)) != ncclSuccess) {
      snprintf(b->why, sizeof b->why, "irecv returned %s", result_str(res));
      return -1;
    }
    if (wait_one(b->r, n, rq, &got, b->why, sizeof b->why)) return -1;
    if ((res = post_one(b->r, n, true, b->l->sc, sbuf, sz, 1, b->smh, &sq)) != ncclSuccess) {
      snprintf(b->why, sizeof b->why, "isend returned %s", result_str(res));
      return -1;
    }
    if (wait_one(b->r, n, sq, &got, b->why, sizeof b->why)) return -1;
  }
  return 0;
}

static int tcp_pingpong(bench_t* b, size_t sz, double* rtt_us) {
  int fd = b->tcp[0];
  uint64_t t0 = now_ns();
  if (b->r->rank == 0) {
    if (tcp_send_all(fd, b->arena, sz) || tcp_recv_all(fd, b->arena + b->slot, sz)) goto err;
    *rtt_us = (double)(now_ns() - t0) / 1e3;
  } else {
    if (tcp_recv_all(fd, b->arena + b->slot, sz) || tcp_send_all(fd, b->arena, sz)) goto err;
  }
  return 0;
err:
  snprintf(b->why, sizeof b->why, "TCP ping-pong failed");
  return -1;
}

static int run_lat(bench_t* b, int method, size_t sz, double* median, double* p99) {
  int iters = lat_iters(sz), warm = iters / 10;
  double* v = calloc((size_t)iters, sizeof *v);
  if (ctl_barrier(b->r, 60)) {
    snprintf(b->why, sizeof b->why, "lost the other rank before a latency run");
    free(v);
    return -1;
  }
  for (int i = -warm; i < iters; i++) {
    double rtt = 0;
    int rc = method == 0 ? plugin_pingpong(b, sz, &rtt) : tcp_pingpong(b, sz, &rtt);
    if (rc) {
      free(v);
      return -1;
    }
    if (i >= 0) v[i] = rtt / 2;
  }
  if (b->r->rank == 0) stats(v, iters, median, p99);
  free(v);
  return 0;
}

static int plugin_stream(bench_t* b, size_t sz, int count) {
  bool sender = b->r->rank == 1;
  void* comm = sender ? b->l->sc : b->l->rc;
  void* mh = sender ? b->smh : b->rmh;
  void* reqs[WINDOW];
  int posted = 0, done = 0;
  while (done < count) {
    while (posted < count && posted - done < WINDOW) {
      ncclResult_t res = post_one(b->r, b->n, sender, comm, b->arena + (size_t)(posted % WINDOW) * b->slot, sz, 1, mh,
                                  &reqs[posted % WINDOW]);
      if (res != ncclSuccess) {
        snprintf(b->why, sizeof b->why, "%s returned %s", sender ? "isend" : "irecv", result_str(res));
        return -1;
      }
      posted++;
    }
    int d = 0, got[1];
    ncclResult_t res = net_test(b->n, reqs[done % WINDOW], &d, got);
    if (res != ncclSuccess) {
      snprintf(b->why, sizeof b->why, "test returned %s", result_str(res));
      return -1;
    }
    if (d) done++;
    else if (past_deadline(b->r)) {
      snprintf(b->why, sizeof b->why, "bandwidth run did not finish before the deadline");
      return -1;
    }
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

static int tcp_stream(bench_t* b, size_t sz, int count, int streams) {
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
  int rc = 0;
  for (int k = 0; k < NSTREAMS; k++) {
    pthread_join(th[k], NULL);
    rc |= st[k].rc;
  }
  if (rc) snprintf(b->why, sizeof b->why, "4-stream TCP failed");
  return rc ? -1 : 0;
}

/* method 0 plugin, 1 TCP 1 stream, 4 TCP 4 streams. Rank 0 (the receiver) times it. */
static int run_bw(bench_t* b, int method, size_t sz, double* gbs) {
  int count = (int)(BW_BYTES / sz);
  if (count < 16) count = 16;
  int warm = count < 16 ? count : 16;
  for (int pass = 0; pass < 2; pass++) {
    int c = pass == 0 ? warm : count;
    if (ctl_barrier(b->r, 60)) {
      snprintf(b->why, sizeof b->why, "lost the other rank before a bandwidth run");
      return -1;
    }
    uint64_t t0 = now_ns();
    int rc = method == 0 ? plugin_stream(b, sz, c) : tcp_stream(b, sz, c, method);
    if (rc) return -1;
    if (pass == 1) *gbs = (double)sz * c / ((double)(now_ns() - t0) / 1e9) / 1e9;
  }
  return 0;
}

static int bench_rank(rank_t* r, void* arg) {
  bench_arg_t* a = arg;
  shm_t* s = r->shm;
  net_t n;
  hprops_t p;
  link_t l = {0};
  bench_t b = {.r = r, .n = &n, .l = &l};
  for (int i = 0; i < 1 + NSTREAMS; i++) b.tcp[i] = -1;
  int rc = 1;
  atomic_store(&s->cur_start_ns[r->rank], now_ns());
  atomic_store(&s->cur[r->rank], 0);
  r->deadline_ns = now_ns() + (uint64_t)((r->timeout - 2) * 1e9);
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
  size_t maxsz = a->bw ? BW_SIZES[NBW - 1] : LAT_SIZES[NLAT - 1];
  b.slot = (maxsz + 4095) & ~(size_t)4095;
  size_t alen = b.slot * WINDOW;
  b.arena = buf_alloc(alen);
  if (b.arena == NULL) {
    snprintf(b.why, sizeof b.why, "cannot allocate %zu bytes", alen);
    goto done;
  }
  pattern_fill(b.arena, alen, 7);
  net_regmr(&n, l.sc, b.arena, alen, NCCL_PTR_HOST, &b.smh);
  net_regmr(&n, l.rc, b.arena, alen, NCCL_PTR_HOST, &b.rmh);
  char tr[64];
  harness_transport_name(tr, sizeof tr);
  if (r->rank == 0)
    printf("bench: v%d plugin=%s transport=%s device=%s; 2 processes; TCP baseline over 127.0.0.1 (TCP_NODELAY, blocking)\n",
           a->version, n.name, tr[0] ? tr : "unknown", p.name);
  if (a->lat) {
    if (r->rank == 0)
      printf("\nlatency: ping-pong, one-way time = round trip / 2, microseconds\n"
             "%10s %6s | %10s %10s | %10s %10s | %s\n",
             "size", "iters", "plugin med", "plugin p99", "TCP med", "TCP p99", "plugin/TCP (median)");
    for (int i = 0; i < NLAT; i++) {
      size_t sz = LAT_SIZES[i];
      double pm = 0, pp = 0, tm = 0, tp = 0;
      set_where(r, "latency %zu B through the plugin", sz);
      if (run_lat(&b, 0, sz, &pm, &pp)) goto done;
      set_where(r, "latency %zu B over TCP", sz);
      if (run_lat(&b, 1, sz, &tm, &tp)) goto done;
      if (r->rank == 0) {
        char s1[32];
        fmt_size(s1, sizeof s1, sz);
        printf("%10s %6d | %10.2f %10.2f | %10.2f %10.2f | %.2f\n", s1, lat_iters(sz), pm, pp, tm, tp, tm > 0 ? pm / tm : 0);
      }
    }
  }
  if (a->bw) {
    if (r->rank == 0)
      printf("\nbandwidth: one direction, GB/s (1e9 B/s); plugin with %d requests in flight; TCP 4-stream stripes each message\n"
             "%10s %6s | %8s | %8s %8s | %11s %11s\n",
             WINDOW, "size", "msgs", "plugin", "TCP x1", "TCP x4", "plugin/TCP1", "plugin/TCP4");
    for (int i = 0; i < NBW; i++) {
      size_t sz = BW_SIZES[i];
      double pg = 0, t1 = 0, t4 = 0;
      set_where(r, "bandwidth %zu B through the plugin", sz);
      if (run_bw(&b, 0, sz, &pg)) goto done;
      set_where(r, "bandwidth %zu B over 1 TCP stream", sz);
      if (run_bw(&b, 1, sz, &t1)) goto done;
      set_where(r, "bandwidth %zu B over 4 TCP streams", sz);
      if (run_bw(&b, NSTREAMS, sz, &t4)) goto done;
      if (r->rank == 0) {
        char s1[32];
        fmt_size(s1, sizeof s1, sz);
        int count = (int)(BW_BYTES / sz) < 16 ? 16 : (int)(BW_BYTES / sz);
        printf("%10s %6d | %8.3f | %8.3f %8.3f | %11.2f %11.2f\n", s1, count, pg, t1, t4, t1 > 0 ? pg / t1 : 0,
               t4 > 0 ? pg / t4 : 0);
      }
    }
  }
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
  fflush(stdout);
  atomic_store(&s->cur[r->rank], -1);
  return rc;
}

int cmd_bench(const opts_t* o) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  shm_t* s = shm_create();
  char err[WHY_LEN];
  if (s == NULL) return 2;
  int v = pick_version(o, s, err, sizeof err);
  if (v < 0) {
    fprintf(stderr, "bench: %s\n", err);
    return 1;
  }
  memset(s->text, 0, sizeof s->text);
  bench_arg_t a = {o, v, strcmp(o->bench_what, "bw") != 0, strcmp(o->bench_what, "lat") != 0};
  double limit = o->timeout > 0 ? o->timeout : 900;
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
