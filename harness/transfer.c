/*
 * transfer.c: the "main job": one sender process, one receiver process, SIZE
 * bytes ITERS times with 8 requests in flight, every byte verified.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define WINDOW 8
#define KEEP_ALL_LIMIT (2ull << 30) /* receiver keeps every message (verify after timing) up to this */

typedef struct {
  const opts_t* o;
  int version;
} xfer_arg_t;

static int xfer_rank(rank_t* r, void* arg) {
  xfer_arg_t* a = arg;
  const opts_t* o = a->o;
  shm_t* s = r->shm;
  char* out = s->text[r->rank];
  net_t n;
  hprops_t p;
  link_t l = {0};
  char why[WHY_LEN] = "";
  int rc = 1;
  r->check = 0;
  atomic_store(&s->cur_start_ns[r->rank], now_ns());
  atomic_store(&s->cur[r->rank], 0);
  r->deadline_ns = now_ns() + (uint64_t)(rank_budget(r->timeout) * 1e9);
  if (rank_open(r, &n, o->plugin, a->version, &p, why, sizeof why) != 0) goto done;
  if (link_up(r, &n, &l, 0, 30, why, sizeof why) != 0) goto done;

  size_t size = o->size;
  int iters = o->iters;
  /* Distinct buffers per message when they fit, so the receiver can verify
   * after the clock stops; otherwise a ring of WINDOW verified as it lands. */
  int nbuf = (size * (size_t)iters <= KEEP_ALL_LIMIT || iters <= WINDOW) ? iters : WINDOW;
  int window = iters < WINDOW ? iters : WINDOW;
  size_t slot = (size + 4095) & ~(size_t)4095;
  if (slot == 0) slot = 4096;
  size_t arena_len = slot * (size_t)nbuf;
  uint8_t* arena = buf_alloc(arena_len);
  if (arena == NULL) {
    snprintf(why, sizeof why, "cannot allocate %zu bytes", arena_len);
    goto done;
  }
  bool sender = r->rank == 1;
  void* comm = sender ? l.sc : l.rc;
  void* mh = NULL;
  ncclResult_t res = net_regmr(&n, comm, arena, arena_len, NCCL_PTR_HOST, &mh);
  if (res != ncclSuccess) {
    snprintf(why, sizeof why, "regMr of %zu bytes returned %s", arena_len, result_str(res));
    goto done;
  }
  set_where(r, sender ? "filling send buffers" : "touching receive buffers");
  for (int k = 0; k < nbuf; k++) {
    if (sender) pattern_fill(arena + (size_t)k * slot, size, (uint64_t)k);
    else memset(arena + (size_t)k * slot, 0, size); /* fault pages in before the clock starts */
  }
  set_where(r, "barrier before the transfer");
  if (ctl_barrier(r, 60) != 0) {
    snprintf(why, sizeof why, "the other rank did not reach the start barrier");
    goto done;
  }
  set_where(r, sender ? "sending" : "receiving");
  void* reqs[WINDOW];
  int posted = 0, completed = 0;
  bool verified_inline = nbuf < iters;
  uint64_t t0 = now_ns();
  while (completed < iters) {
    while (posted < iters && posted - completed < window) {
      uint8_t* b = arena + (size_t)(posted % nbuf) * slot;
      /* A reused buffer's content is the same message after message: the
       * stamps make each one distinct, so a receive that wrote nothing, or
       * only part, cannot pass for the next. Its previous send completed:
       * at most nbuf are in flight. */
      if (sender && verified_inline) ring_stamp(b, size, (uint64_t)posted);
      res = post_one(r, &n, sender, comm, b, size, 1, mh, &reqs[posted % WINDOW]);
      if (res != ncclSuccess) {
        snprintf(why, sizeof why, "%s #%d returned %s", sender ? "isend" : "irecv", posted, result_str(res));
        goto done;
      }
      posted++;
    }
    int done = 0, got[1] = {-1};
    res = net_test(&n, reqs[completed % WINDOW], &done, got);
    if (res != ncclSuccess) {
      char w[300];
      harness_last_warn(w, sizeof w);
      snprintf(why, sizeof why, "test on %s #%d returned %s%s%s", sender ? "send" : "recv", completed, result_str(res),
               w[0] ? "; last WARN: " : "", w);
      goto done;
    }
    if (!done) {
      if (past_deadline(r)) {
        snprintf(why, sizeof why, "%s #%d did not complete before the deadline", sender ? "send" : "recv", completed);
        goto done;
      }
      continue;
    }
    if (!sender) {
      if (got[0] != (int)size) {
        snprintf(why, sizeof why, "recv #%d reported %d bytes, expected %zu", completed, got[0], size);
        goto done;
      }
      if (verified_inline) {
        long long bad = ring_check(arena + (size_t)(completed % nbuf) * slot, size, (uint64_t)(completed % nbuf),
                                   (uint64_t)completed);
        if (bad >= 0) {
          snprintf(why, sizeof why, "recv #%d: byte %lld is wrong", completed, bad);
          goto done;
        }
      }
    }
    completed++;
  }
  double secs = (double)(now_ns() - t0) / 1e9;
  if (!sender && !verified_inline) {
    set_where(r, "verifying");
    for (int k = 0; k < iters; k++) {
      long long bad = pattern_check(arena + (size_t)k * slot, size, (uint64_t)k);
      if (bad >= 0) {
        snprintf(why, sizeof why, "message #%d: byte %lld is wrong", k, bad);
        goto done;
      }
    }
  }
  char tr[64];
  harness_transport_name(tr, sizeof tr);
  double bytes = (double)size * iters;
  snprintf(out, sizeof s->text[0],
           "transfer: v%d plugin=%s transport=%s device=%s moved %.0f bytes (%d x %zu) in %.3f s = %.2f GB/s "
           "(sender→receiver), data verified%s",
           a->version, n.name ? n.name : "?", tr[0] ? tr : "unknown", p.name ? p.name : "?", bytes, iters, size, secs,
           secs > 0 ? bytes / secs / 1e9 : 0.0, verified_inline ? " (as it arrived, inside the timing)" : "");
  net_deregmr(&n, comm, mh);
  if (o->linger > 0) {
    set_where(r, "lingering");
    /* The watchdog would otherwise count the linger as a hang. */
    r->deadline_ns = 0;
    atomic_store(&s->cur[r->rank], -1);
    fprintf(stderr, "transfer: rank %d (pid %d) lingering %.1f s\n", r->rank, (int)getpid(), o->linger);
    sleep_ms((int)(o->linger * 1000));
  }
  link_down(&n, &l);
  rank_close(&n);
  rc = 0;
done:
  if (rc != 0) snprintf(out, sizeof s->text[0], "error: %s", why);
  atomic_store(&s->cur[r->rank], -1);
  return rc;
}

int cmd_transfer(const opts_t* o) {
  shm_t* s;
  int v, rc = cmd_start(o, "transfer", &s, &v);
  if (rc != 0) return rc;
  if (o->size > NCCL_MAX_NET_SIZE) {
    fprintf(stderr, "transfer: --size %zu is above 1 GiB, the most NCCL puts in one isend\n", o->size);
    return 2;
  }
  xfer_arg_t a = {o, v};
  double limit = o->timeout > 0 ? o->timeout : 300;
  pair_outcome_t out;
  if (run_pair(s, xfer_rank, &a, limit, limit + o->linger + 10, &out) != 0) return 2;
  int ok = 1;
  if (out.hung) {
    printf("transfer: FAILED: rank %d hung in \"%s\" for %.0f s\n", out.hung_rank, out.hung_where, out.hung_after);
    return 1;
  }
  for (int i = 0; i < 2; i++) {
    char st[96];
    if (!(WIFEXITED(out.status[i]) && WEXITSTATUS(out.status[i]) == 0)) {
      ok = 0;
      printf("transfer: FAILED: %s (%s) %s%s%s\n", i ? "sender" : "receiver", wait_status_str(out.status[i], st, sizeof st),
             s->text[i], s->where[i][0] ? " in " : "", s->where[i]);
    }
  }
  if (ok) printf("%s\n", s->text[0]);
  return ok ? 0 : 1;
}
