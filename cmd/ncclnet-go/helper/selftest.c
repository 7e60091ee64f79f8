/*
 * ncclnet-go-selftest: the C side of `ncclnet-go selftest`. It loads an NCCL
 * net plugin the way NCCL does (dlopen of NCCL_NET_PLUGIN's value, then
 * libnccl-net-<name>.so; dlsym of ncclNetPlugin_vN) in two processes, moves
 * data both ways with every byte verified, measures round-trip latency with a
 * verified ping-pong, and prints one result line for the Go command to read.
 * A Go program cannot dlopen a Go c-shared library (two Go runtimes in one
 * process), which is why this part is C. It reuses the conformance harness's
 * loader, process pair and connection set-up (the .c files in harness/).
 *
 *   ncclnet-go-selftest run  --plugin NAME|PATH[,...] [--version V] [--size BYTES] [--iters N]
 *                            [--lat-size BYTES] [--lat-iters N] [--timeout SEC]
 *   ncclnet-go-selftest load --plugin NAME|PATH --duration SEC [--size BYTES] [--pause SEC]
 *                            [--idle] [--stall SEC] [--inject-error] [--timeout SEC]
 *
 * `load` keeps a pair busy (or, with --idle, connected and silent) for a while
 * so that metrics, dashboards and alerts can be checked against a live plugin:
 * rounds of 8 verified messages, --pause SEC apart; --stall holds one receive
 * posted SEC seconds before its send comes, and --inject-error has the plugin
 * refuse one malformed irecv.
 *
 * --plugin takes what NCCL_NET_PLUGIN takes: a comma-separated list is tried
 * in order, as NCCL tries it, and the first library that loads and exports an
 * ncclNetPlugin_vN table is tested. --timeout SEC (fractions allowed) is one
 * budget for the whole run, counted from this program's start: every step of
 * both processes runs under the same deadline, so a step after a slow one has
 * only what is left of it. A wait still pending at the deadline fails; a
 * process stuck inside a plugin call is killed WATCHDOG_GRACE seconds later.
 *
 * NCCLNET_GO_SELFTEST_TRACE_BUDGET=1 (for tests) has each process print, on
 * stderr, the deadlines every step it enters runs under, in seconds from the
 * start of the run:
 *   "selftest-budget rank=R at_s=T deadline_s=D watchdog_s=W step=STEP"
 * (D is "none" where the step has no deadline: load --idle).
 *
 * Output (stdout, one line): "result=pass key=value ..." or
 * "result=fail rank=R where=STEP reason=TEXT" (reason runs to the end of the
 * line). Exit status 0 on pass, 1 on failure, 2 on bad usage.
 *
 * SIGTERM or SIGINT while the two processes run kills and reaps them, prints
 * "result=fail rank=- where=process 0: STEP; process 1: STEP reason=interrupted
 * by SIGTERM" and exits with 128 + the signal number.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define WINDOW 8
#define MAX_LAT_ITERS 100000
/* A process's own deadline is --timeout; the parent's watchdog waits this
 * much longer, so that a process that hit its deadline in a wait reports
 * the wait itself rather than being killed while it does. */
#define WATCHDOG_GRACE 2.0

/* When the run started (CLOCK_MONOTONIC, as now_ns): the ranks' deadline and
 * the watchdog's count from here, not from each step or rank. */
static uint64_t run_start_ns;
/* NCCLNET_GO_SELFTEST_TRACE_BUDGET is set: step() reports each step's deadlines. */
static int trace_budget;

typedef struct {
  const char* plugin; /* as given: a name or a path, resolved like NCCL */
  int version;
  size_t size;
  int iters;
  size_t lat_size;
  int lat_iters;
  double timeout;
  /* load */
  int load;
  double duration;
  int idle;
  double stall;
  double pause;
  int inject_error;
} st_opts_t;

typedef struct {
  const st_opts_t* o;
  int version;
} st_arg_t;

/* Per-rank results, written into shm->text[rank] as key=value words. */
static void out_append(shm_t* s, int rank, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static void out_append(shm_t* s, int rank, const char* fmt, ...) {
  char* t = s->text[rank];
  size_t used = strnlen(t, sizeof s->text[0]);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t + used, sizeof s->text[0] - used, fmt, ap);
  va_end(ap);
}

/* Seconds from the start of the run to t (CLOCK_MONOTONIC ns). */
static double since_start(uint64_t t) { return ((double)t - (double)run_start_ns) / 1e9; }

/* set_where, and with trace_budget a line on stderr saying the deadlines the
 * step runs under, from the start of the run: this rank's own (r->deadline_ns)
 * and the watchdog's (cur_start_ns + r->timeout, the per_check limit run_pair
 * was given and watches this rank with). */
static void step(rank_t* r, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void step(rank_t* r, const char* fmt, ...) {
  char where[WHERE_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(where, sizeof where, fmt, ap);
  va_end(ap);
  set_where(r, "%s", where);
  if (!trace_budget) return;
  uint64_t now = now_ns();
  char deadline[32] = "none", line[WHERE_LEN + 160];
  if (r->deadline_ns != 0) snprintf(deadline, sizeof deadline, "%.3f", since_start(r->deadline_ns));
  double watchdog = since_start(atomic_load(&r->shm->cur_start_ns[r->rank])) + r->timeout;
  int n = snprintf(line, sizeof line, "selftest-budget rank=%d at_s=%.3f deadline_s=%s watchdog_s=%.3f step=%s\n",
                   r->rank, since_start(now), deadline, watchdog, where);
  /* One write per line: the two ranks share stderr. A trace that cannot be
   * written is only missing from the log. */
  if (n > 0) {
    ssize_t w = write(STDERR_FILENO, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
    (void)w;
  }
}

/* NCCL's plugin lookup (plugin_open.cc): the value as given, then, for a bare
 * name that is not already "lib*.so", libnccl-net-<name>.so. Returns the name
 * that loaded, or NULL with why set. */
static const char* resolve_plugin(const char* name, char* buf, size_t len, char* why, size_t whylen) {
  void* dl = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (dl != NULL) {
    snprintf(buf, len, "%s", name);
    return buf;
  }
  char first[300];
  snprintf(first, sizeof first, "%s", dlerror());
  size_t n = strlen(name);
  int is_lib = strncmp(name, "lib", 3) == 0 && n >= 3 && strcmp(name + n - 3, ".so") == 0;
  if (strchr(name, '/') == NULL && !is_lib) {
    snprintf(buf, len, "libnccl-net-%s.so", name);
    dl = dlopen(buf, RTLD_NOW | RTLD_LOCAL);
    if (dl != NULL) return buf;
    snprintf(why, whylen, "cannot load the plugin: %s; %s", first, dlerror());
    return NULL;
  }
  snprintf(why, whylen, "cannot load the plugin: %s", first);
  return NULL;
}

/* NCCL_NET_PLUGIN's list, tried in NCCL's order (src/plugin/net.cc: strtok_r
 * on ",", empty entries dropped; a library that loads without an
 * ncclNetPlugin_vN table is skipped too). Returns the entry that loaded,
 * resolved, or NULL with every entry's reason in why. A single entry keeps
 * resolve_plugin's reason as it is. */
static const char* resolve_plugin_list(const char* list, char* buf, size_t len, char* why, size_t whylen) {
  if (strchr(list, ',') == NULL) return resolve_plugin(list, buf, len, why, whylen);
  char copy[1024], *save = NULL;
  snprintf(copy, sizeof copy, "%s", list);
  size_t used = (size_t)snprintf(why, whylen, "no library of the list \"%s\" loads:", list);
  for (char* e = strtok_r(copy, ",", &save); e != NULL; e = strtok_r(NULL, ",", &save)) {
    char one[400];
    if (resolve_plugin(e, buf, len, one, sizeof one) != NULL) {
      void* dl = dlopen(buf, RTLD_NOW | RTLD_LOCAL);
      bool table = false;
      for (int v = HARNESS_MAX_VERSION; dl != NULL && v >= HARNESS_MIN_VERSION && !table; v--) {
        char sym[32];
        snprintf(sym, sizeof sym, "ncclNetPlugin_v%d", v);
        table = dlsym(dl, sym) != NULL;
      }
      if (table) return buf; /* left open: the test loads it again by path */
      if (dl != NULL) dlclose(dl);
      snprintf(one, sizeof one, "%s exports no ncclNetPlugin_v%d..v%d table", buf, HARNESS_MIN_VERSION,
               HARNESS_MAX_VERSION);
    }
    if (used < whylen) used += (size_t)snprintf(why + used, whylen - used, " [%s] %s;", e, one);
  }
  return NULL;
}

static void loaded_path(net_t* n, char* out, size_t len) {
  struct link_map* lm = NULL;
  if (n->dl && dlinfo(n->dl, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0]) {
    char* rp = realpath(lm->l_name, NULL);
    snprintf(out, len, "%s", rp ? rp : lm->l_name);
    free(rp);
  } else {
    snprintf(out, len, "?");
  }
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

/* One direction: `from` sends iters x size to the other rank, window WINDOW,
 * every byte checked by the receiver. The receiver reports GB/s. */
static int stream(rank_t* r, net_t* n, link_t* l, int from, uint8_t* sbuf, uint8_t* rbuf, size_t slot, void* smh,
                  void* rmh, size_t size, int iters, uint64_t seed0, double* gbps, char* why, size_t whylen) {
  bool sender = r->rank == from;
  void* comm = sender ? l->sc : l->rc;
  uint8_t* arena = sender ? sbuf : rbuf;
  void* mh = sender ? smh : rmh;
  int window = iters < WINDOW ? iters : WINDOW;
  if (sender) {
    /* Filling touches every page of the window: 8 GiB for 8 x 1 GiB. */
    step(r, "filling %d message%s of %zu bytes (%s)", window, window == 1 ? "" : "s", size,
         from == 1 ? "1->0" : "0->1");
    for (int k = 0; k < window; k++) pattern_fill(arena + (size_t)k * slot, size, seed0 + (uint64_t)k);
  }
  step(r, "barrier before the %s transfer", from == 1 ? "1->0" : "0->1");
  if (ctl_barrier(r, 60) != 0) {
    snprintf(why, whylen, "the other rank did not reach the transfer");
    return -1;
  }
  step(r, sender ? "sending (rank %d -> %d)" : "receiving (rank %d -> %d)", from, 1 - from);
  void* reqs[WINDOW];
  int posted = 0, completed = 0;
  uint64_t t0 = now_ns();
  while (completed < iters) {
    while (posted < iters && posted - completed < window) {
      uint8_t* b = arena + (size_t)(posted % window) * slot;
      ncclResult_t res = post_one(r, n, sender, comm, b, size, 1, mh, &reqs[posted % WINDOW]);
      if (res != ncclSuccess) {
        snprintf(why, whylen, "%s #%d returned %s", sender ? "isend" : "irecv", posted, result_str(res));
        return -1;
      }
      posted++;
    }
    int got = -1;
    if (wait_one(r, n, reqs[completed % WINDOW], &got, why, whylen) != 0) return -1;
    uint8_t* b = arena + (size_t)(completed % window) * slot;
    if (!sender) {
      if (got != (int)size) {
        snprintf(why, whylen, "receive #%d reported %d bytes, %zu were sent", completed, got, size);
        return -1;
      }
      long long bad = pattern_check(b, size, seed0 + (uint64_t)completed);
      if (bad >= 0) {
        snprintf(why, whylen, "message #%d: byte %lld differs from what was sent", completed, bad);
        return -1;
      }
    } else if (completed + window < iters) {
      /* the slot is free again: refill it for the message that reuses it */
      pattern_fill(b, size, seed0 + (uint64_t)(completed + window));
    }
    completed++;
  }
  double secs = (double)(now_ns() - t0) / 1e9;
  *gbps = secs > 0 ? (double)size * iters / secs / 1e9 : 0;
  return 0;
}

/* Ping-pong: rank 0 sends lat_size bytes, rank 1 answers; both check the
 * payload. Rank 0 records the round-trip times. */
static int pingpong(rank_t* r, net_t* n, link_t* l, uint8_t* sbuf, uint8_t* rbuf, void* smh, void* rmh, size_t sz,
                    int iters, double* rtts, char* why, size_t whylen) {
  if (ctl_barrier(r, 60) != 0) {
    snprintf(why, whylen, "the other rank did not reach the latency test");
    return -1;
  }
  step(r, "ping-pong");
  int warm = iters / 10;
  for (int i = -warm; i < iters; i++) {
    uint64_t seed = 0x5e1f0000u + (uint64_t)(i + warm);
    void *rq, *sq;
    int got = -1;
    ncclResult_t res;
    uint64_t t0 = now_ns();
    if (r->rank == 0) {
      pattern_fill(sbuf, sz, seed);
      if ((res = post_one(r, n, false, l->rc, rbuf, sz, 1, rmh, &rq)) != ncclSuccess ||
          (res = post_one(r, n, true, l->sc, sbuf, sz, 1, smh, &sq)) != ncclSuccess) {
        snprintf(why, whylen, "posting ping %d returned %s", i, result_str(res));
        return -1;
      }
      if (wait_one(r, n, sq, &got, why, whylen) || wait_one(r, n, rq, &got, why, whylen)) return -1;
      double us = (double)(now_ns() - t0) / 1e3;
      if (i >= 0) rtts[i] = us;
      if (got != (int)sz || pattern_check(rbuf, sz, ~seed) >= 0) {
        snprintf(why, whylen, "pong %d is wrong (%d bytes)", i, got);
        return -1;
      }
    } else {
      if ((res = post_one(r, n, false, l->rc, rbuf, sz, 1, rmh, &rq)) != ncclSuccess) {
        snprintf(why, whylen, "irecv of ping %d returned %s", i, result_str(res));
        return -1;
      }
      if (wait_one(r, n, rq, &got, why, whylen)) return -1;
      if (got != (int)sz || pattern_check(rbuf, sz, seed) >= 0) {
        snprintf(why, whylen, "ping %d is wrong (%d bytes)", i, got);
        return -1;
      }
      pattern_fill(sbuf, sz, ~seed);
      if ((res = post_one(r, n, true, l->sc, sbuf, sz, 1, smh, &sq)) != ncclSuccess) {
        snprintf(why, whylen, "isend of pong %d returned %s", i, result_str(res));
        return -1;
      }
      if (wait_one(r, n, sq, &got, why, whylen)) return -1;
    }
  }
  return 0;
}

/* load mode, traffic: rank 1 streams to rank 0 in rounds of WINDOW messages
 * until the duration is over; a round flag travels over the control channel
 * so both ranks agree on every message. */
enum { ROUND_DATA = 1, ROUND_STALL = 2, ROUND_STOP = 3 };

static int load_traffic(rank_t* r, net_t* n, link_t* l, const st_opts_t* o, uint8_t* sbuf, uint8_t* rbuf, size_t slot,
                        void* smh, void* rmh, long long* msgs, char* why, size_t whylen) {
  bool sender = r->rank == 1;
  uint64_t t0 = now_ns(), end = t0 + (uint64_t)(o->duration * 1e9);
  uint64_t stall_at = t0 + (uint64_t)(o->duration * 1e9 / 3);
  bool stalled = o->stall <= 0;
  uint64_t seq = 0;
  for (;;) {
    int32_t flag = ROUND_DATA;
    if (sender) {
      uint64_t now = now_ns();
      if (now >= end) flag = ROUND_STOP;
      else if (!stalled && now >= stall_at) flag = ROUND_STALL, stalled = true;
      if (ctl_send(r, &flag, sizeof flag) != 0) {
        snprintf(why, whylen, "lost the other rank");
        return -1;
      }
    } else if (ctl_recv(r, &flag, sizeof flag, 60) != 0) {
      snprintf(why, whylen, "lost the other rank");
      return -1;
    }
    if (flag == ROUND_STOP) return 0;
    if (flag == ROUND_STALL) {
      step(r, "stalled receive (%.1f s)", o->stall);
      void* q;
      int got;
      ncclResult_t res;
      if (!sender) {
        if (o->inject_error) {
          /* NCCL never groups more than 64 receives: the glue must refuse
           * this without touching the comm, and count one error. */
          void* data[65];
          size_t sizes[65];
          int tags[65];
          void* mhs[65];
          for (int i = 0; i < 65; i++) data[i] = rbuf, sizes[i] = 0, tags[i] = i, mhs[i] = rmh;
          void* bad = NULL;
          res = net_irecv(n, l->rc, 65, data, sizes, tags, mhs, NULL, &bad);
          if (res == ncclSuccess) {
            snprintf(why, whylen, "the plugin accepted an irecv of 65 buffers (NCCL groups at most 64)");
            return -1;
          }
        }
        pattern_fill(rbuf, o->size, 0);
        if ((res = post_one(r, n, false, l->rc, rbuf, o->size, 1, rmh, &q)) != ncclSuccess) {
          snprintf(why, whylen, "irecv (stall) returned %s", result_str(res));
          return -1;
        }
        if (ctl_barrier(r, 60) != 0 || wait_one(r, n, q, &got, why, whylen) != 0) return -1;
        if (pattern_check(rbuf, o->size, 0x57a11) >= 0) {
          snprintf(why, whylen, "the stalled message arrived corrupted");
          return -1;
        }
      } else {
        if (ctl_barrier(r, 60) != 0) return -1;
        r->deadline_ns += (uint64_t)(o->stall * 1e9);
        sleep_ms((int)(o->stall * 1000));
        pattern_fill(sbuf, o->size, 0x57a11);
        if ((res = post_one(r, n, true, l->sc, sbuf, o->size, 1, smh, &q)) != ncclSuccess ||
            wait_one(r, n, q, &got, why, whylen) != 0) {
          if (res != ncclSuccess) snprintf(why, whylen, "isend (stall) returned %s", result_str(res));
          return -1;
        }
      }
      (*msgs)++;
      continue;
    }
    step(r, sender ? "sending (load)" : "receiving (load)");
    void* reqs[WINDOW];
    for (int k = 0; k < WINDOW; k++) {
      uint8_t* b = (sender ? sbuf : rbuf) + (size_t)k * slot;
      if (sender) pattern_fill(b, o->size, seq + (uint64_t)k);
      ncclResult_t res = post_one(r, n, sender, sender ? l->sc : l->rc, b, o->size, 1, sender ? smh : rmh, &reqs[k]);
      if (res != ncclSuccess) {
        snprintf(why, whylen, "%s returned %s", sender ? "isend" : "irecv", result_str(res));
        return -1;
      }
    }
    for (int k = 0; k < WINDOW; k++) {
      int got = -1;
      if (wait_one(r, n, reqs[k], &got, why, whylen) != 0) return -1;
      if (!sender && (got != (int)o->size || pattern_check(rbuf + (size_t)k * slot, o->size, seq + (uint64_t)k) >= 0)) {
        snprintf(why, whylen, "message %llu arrived wrong", (unsigned long long)(seq + (uint64_t)k));
        return -1;
      }
    }
    seq += WINDOW;
    *msgs += WINDOW;
    if (sender && o->pause > 0) sleep_ms((int)(o->pause * 1000));
  }
}

/* The parent's SIGTERM/SIGINT handler: run_pair stops the ranks. */
static void on_stop_signal(int sig) { harness_stop_signal = sig; }

static const char* signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal"; }

static int st_rank(rank_t* r, void* arg) {
  /* A rank dies of these signals as a process without handlers does; only
   * the parent turns them into a report. */
  signal(SIGTERM, SIG_DFL);
  signal(SIGINT, SIG_DFL);
  st_arg_t* a = arg;
  const st_opts_t* o = a->o;
  shm_t* s = r->shm;
  net_t n;
  hprops_t p;
  link_t l = {0};
  char why[WHY_LEN] = "", name[512], path[1024];
  int rc = 1;
  uint8_t *sbuf = NULL, *rbuf = NULL;
  size_t slot = 0, arena = 0;
  void *smh = NULL, *rmh = NULL;
  double* rtts = NULL;
  r->check = 0;
  /* One budget for the whole run: the deadline and the watchdog's clock
   * start when the run did, and no step resets them. */
  atomic_store(&s->cur_start_ns[r->rank], run_start_ns);
  atomic_store(&s->cur[r->rank], 0);
  r->deadline_ns = run_start_ns + (uint64_t)(o->timeout * 1e9);
  step(r, "loading %s", o->plugin);
  if (resolve_plugin(o->plugin, name, sizeof name, why, sizeof why) == NULL) goto done;
  if (rank_open(r, &n, name, a->version, &p, why, sizeof why) != 0) goto done;
  loaded_path(&n, path, sizeof path);
  if (link_up(r, &n, &l, 0, 60, why, sizeof why) != 0) goto done;

  size_t big = o->size > o->lat_size ? o->size : o->lat_size;
  slot = (big + 4095) & ~(size_t)4095;
  if (slot == 0) slot = 4096;
  /* One slot per message in flight: stream() keeps min(WINDOW, iters) in
   * flight and the ping-pong uses the first slot; load rounds use WINDOW.
   * Slots no message uses would only cost registered (pinned, on ib)
   * memory: 8 GiB per buffer for --size 1G --iters 1. */
  int nslots = o->load || o->iters > WINDOW ? WINDOW : o->iters;
  arena = slot * (size_t)nslots;
  step(r, "allocating and registering buffers (2 x %zu bytes)", arena);
  sbuf = buf_alloc(arena);
  rbuf = buf_alloc(arena);
  if (sbuf == NULL || rbuf == NULL) {
    snprintf(why, sizeof why, "cannot allocate 2 x %zu bytes", arena);
    goto done;
  }
  ncclResult_t res;
  if ((res = net_regmr(&n, l.sc, sbuf, arena, NCCL_PTR_HOST, &smh)) != ncclSuccess ||
      (res = net_regmr(&n, l.rc, rbuf, arena, NCCL_PTR_HOST, &rmh)) != ncclSuccess) {
    snprintf(why, sizeof why, "regMr of %zu bytes returned %s", arena, result_str(res));
    goto done;
  }
  char tr[64];
  harness_transport_name(tr, sizeof tr);
  if (r->rank == 0)
    out_append(s, 0, "library=%s net=%s api=v%d transport=%s device=%s speed_mbps=%d", path, n.name ? n.name : "?",
               a->version, tr[0] ? tr : "unknown", p.name ? p.name : "?", p.speed);

  if (o->load) {
    long long msgs = 0;
    if (o->idle) {
      r->deadline_ns = 0;
      step(r, "idle (connected, silent)");
      atomic_store(&s->cur[r->rank], -1);
      sleep_ms((int)(o->duration * 1000));
    } else if (load_traffic(r, &n, &l, o, sbuf, rbuf, slot, smh, rmh, &msgs, why, sizeof why) != 0) {
      goto done;
    }
    if (r->rank == 0) out_append(s, 0, " messages=%lld", msgs);
  } else {
    double gbps[2] = {0, 0};
    for (int from = 1; from >= 0; from--) {
      double g = 0;
      if (stream(r, &n, &l, from, sbuf, rbuf, slot, smh, rmh, o->size, o->iters, (uint64_t)from << 32, &g, why,
                 sizeof why) != 0)
        goto done;
      if (r->rank != from) gbps[from] = g;
    }
    if (r->rank == 0) out_append(s, 0, " bytes=%zu iters=%d gbps_1to0=%.3f", o->size, o->iters, gbps[1]);
    else out_append(s, 1, " gbps_0to1=%.3f", gbps[0]);
    rtts = calloc((size_t)o->lat_iters, sizeof *rtts);
    if (rtts == NULL) {
      snprintf(why, sizeof why, "out of memory");
      goto done;
    }
    if (pingpong(r, &n, &l, sbuf, rbuf, smh, rmh, o->lat_size, o->lat_iters, rtts, why, sizeof why) != 0) goto done;
    if (r->rank == 0) {
      qsort(rtts, (size_t)o->lat_iters, sizeof *rtts, cmp_double);
      int k = (int)((double)o->lat_iters * 0.99);
      out_append(s, 0, " lat_size=%zu lat_iters=%d rtt_median_us=%.2f rtt_p99_us=%.2f", o->lat_size, o->lat_iters,
                 rtts[o->lat_iters / 2], rtts[k >= o->lat_iters ? o->lat_iters - 1 : k]);
    }
  }
  step(r, "closing");
  if (ctl_barrier(r, 60) != 0) {
    snprintf(why, sizeof why, "the other rank did not finish");
    goto done;
  }
  net_deregmr(&n, l.sc, smh);
  net_deregmr(&n, l.rc, rmh);
  smh = rmh = NULL;
  link_down(&n, &l);
  rank_close(&n);
  rc = 0;
done:
  if (rc != 0) {
    char w[300];
    harness_last_warn(w, sizeof w);
    s->text[r->rank][0] = 0;
    out_append(s, r->rank, "where=%s reason=%s%s%s", s->where[r->rank], why[0] ? why : "unknown",
               w[0] && !strstr(why, w) ? "; the plugin's last WARN: " : "", w[0] && !strstr(why, w) ? w : "");
    atomic_store(&s->abort_check[r->rank], 0);
  }
  free(rtts);
  atomic_store(&s->cur[r->rank], -1);
  return rc;
}

static void usage(FILE* f) {
  fprintf(f,
          "usage:\n"
          "  ncclnet-go-selftest run  --plugin NAME|PATH[,...] [--version V] [--size BYTES] [--iters N]\n"
          "                           [--lat-size BYTES] [--lat-iters N] [--timeout SEC]\n"
          "  ncclnet-go-selftest load --plugin NAME|PATH --duration SEC [--size BYTES] [--pause SEC]\n"
          "                           [--idle] [--stall SEC] [--inject-error] [--timeout SEC]\n"
          "Normally run by `ncclnet-go selftest`; see its --help.\n");
}

static int num(const char* flag, const char* v, double lo, double hi, double* out) {
  if (parse_in_range(v, lo, hi, out) == 0) return 0;
  fprintf(stderr, "ncclnet-go-selftest: %s %s: expected a number in [%g, %g]\n", flag, v, lo, hi);
  return -1;
}

int main(int argc, char** argv) {
  run_start_ns = now_ns();
  const char* tb = getenv("NCCLNET_GO_SELFTEST_TRACE_BUDGET");
  trace_budget = tb != NULL && tb[0] != 0 && strcmp(tb, "0") != 0;
  if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  st_opts_t o = {.size = 64ull << 20, .iters = 16, .lat_size = 8, .lat_iters = 1000, .timeout = 120};
  if (!strcmp(argv[1], "load")) o.load = 1, o.size = 1 << 20, o.timeout = 0;
  else if (strcmp(argv[1], "run") != 0) {
    fprintf(stderr, "ncclnet-go-selftest: unknown mode \"%s\" (run or load)\n", argv[1]);
    return 2;
  }
  for (int i = 2; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    double d;
    if (!strcmp(a, "--idle")) { o.idle = 1; continue; }
    if (!strcmp(a, "--inject-error")) { o.inject_error = 1; continue; }
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
    if (v == NULL) {
      fprintf(stderr, "ncclnet-go-selftest: %s needs a value\n", a);
      return 2;
    }
    i++;
    if (!strcmp(a, "--plugin")) o.plugin = v;
    else if (!strcmp(a, "--version")) {
      if (num(a, v, HARNESS_MIN_VERSION, HARNESS_MAX_VERSION, &d)) return 2;
      o.version = (int)d;
    } else if (!strcmp(a, "--size") || !strcmp(a, "--lat-size")) {
      size_t sz;
      if (parse_size(v, &sz) != 0 || sz == 0 || sz > NCCL_MAX_NET_SIZE) {
        fprintf(stderr, "ncclnet-go-selftest: %s %s: expected 1 byte to 1 GiB (suffix K, M or G allowed)\n", a, v);
        return 2;
      }
      if (!strcmp(a, "--size")) o.size = sz;
      else o.lat_size = sz;
    } else if (!strcmp(a, "--iters")) {
      if (num(a, v, 1, 1000000, &d)) return 2;
      o.iters = (int)d;
    } else if (!strcmp(a, "--lat-iters")) {
      if (num(a, v, 1, MAX_LAT_ITERS, &d)) return 2;
      o.lat_iters = (int)d;
    } else if (!strcmp(a, "--timeout")) {
      if (num(a, v, 5, 86400, &d)) return 2;
      o.timeout = d;
    } else if (!strcmp(a, "--duration")) {
      if (num(a, v, 0.1, 86400, &d)) return 2;
      o.duration = d;
    } else if (!strcmp(a, "--stall")) {
      if (num(a, v, 0, 3600, &d)) return 2;
      o.stall = d;
    } else if (!strcmp(a, "--pause")) {
      if (num(a, v, 0, 60, &d)) return 2;
      o.pause = d;
    } else {
      fprintf(stderr, "ncclnet-go-selftest: unknown argument \"%s\" (see --help)\n", a);
      return 2;
    }
  }
  if (o.plugin == NULL || !o.plugin[0]) {
    fprintf(stderr, "ncclnet-go-selftest: --plugin NAME|PATH is required\n");
    return 2;
  }
  if (o.load && o.duration <= 0) {
    fprintf(stderr, "ncclnet-go-selftest: load needs --duration SEC\n");
    return 2;
  }
  if (o.timeout == 0) o.timeout = o.duration + o.stall + 120;
  setvbuf(stdout, NULL, _IOLBF, 0);
  shm_t* s = shm_create();
  if (s == NULL) {
    printf("result=fail rank=- where=start reason=cannot create shared memory\n");
    return 1;
  }
  /* Resolve the name and the version in a throw-away child: the parent forks
   * the ranks and must never load a Go library itself. */
  char err[WHY_LEN];
  char resolved[sizeof s->text[0]] = "";
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    char why[WHY_LEN];
    if (resolve_plugin_list(o.plugin, resolved, sizeof resolved, why, sizeof why) == NULL)
      snprintf(s->text[0], sizeof s->text[0], "!%s", why);
    else
      snprintf(s->text[0], sizeof s->text[0], "%s", resolved);
    _exit(0);
  }
  int wst;
  if (pid < 0 || waitpid(pid, &wst, 0) != pid || s->text[0][0] == 0) {
    printf("result=fail rank=- where=loading reason=the process probing %s died\n", o.plugin);
    return 1;
  }
  if (s->text[0][0] == '!') {
    printf("result=fail rank=- where=loading reason=%s\n", s->text[0] + 1);
    return 1;
  }
  snprintf(resolved, sizeof resolved, "%s", s->text[0]);
  /* The ranks load the entry of the list the probe settled on. */
  o.plugin = resolved;
  opts_t ho = {.plugin = resolved, .version = o.version};
  int v = pick_version(&ho, s, err, sizeof err);
  if (v < 0) {
    printf("result=fail rank=- where=loading reason=%s\n", err);
    return 1;
  }
  memset(s->text, 0, sizeof s->text);
  st_arg_t a = {&o, v};
  pair_outcome_t out;
  struct sigaction sa = {.sa_handler = on_stop_signal, .sa_flags = SA_RESTART};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  if (run_pair(s, st_rank, &a, o.timeout + WATCHDOG_GRACE, o.timeout + 30, &out) != 0) {
    printf("result=fail rank=- where=start reason=cannot start the two processes\n");
    return 1;
  }
  int stop = out.stopped ? out.stopped : harness_stop_signal;
  if (stop != 0) {
    char w[2][WHERE_LEN];
    for (int i = 0; i < 2; i++) {
      memcpy(w[i], s->where[i], WHERE_LEN);
      w[i][WHERE_LEN - 1] = 0;
    }
    printf("result=fail rank=- where=process 0: %s; process 1: %s reason=interrupted by %s\n", w[0][0] ? w[0] : "?",
           w[1][0] ? w[1] : "?", signal_name(stop));
    return 128 + stop;
  }
  if (out.hung) {
    printf("result=fail rank=%d where=%s reason=not finished within --timeout %g s (stopped after %.1f s)\n",
           out.hung_rank, out.hung_where, o.timeout, out.hung_after);
    return 1;
  }
  for (int i = 0; i < 2; i++) {
    if (!(WIFEXITED(out.status[i]) && WEXITSTATUS(out.status[i]) == 0)) {
      char st[96];
      if (WIFEXITED(out.status[i]) && strstr(s->text[i], "reason=") != NULL)
        printf("result=fail rank=%d %s\n", i, s->text[i]);
      else
        printf("result=fail rank=%d where=%s reason=the process %s\n", i, s->where[i][0] ? s->where[i] : "?",
               wait_status_str(out.status[i], st, sizeof st));
      return 1;
    }
  }
  printf("result=pass %s %s\n", s->text[0], s->text[1]);
  return 0;
}
