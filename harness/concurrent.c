/*
 * concurrent.c: the plugin driven from many threads at once, as NCCL drives it
 * inside a process that holds several communicators (nccl-net-api.md §3.1).
 *
 * Each rank runs:
 *   - P progress threads, each with its own communicator (v11+: its own
 *     init(ctx) ... finalize(ctx)), its own send and receive comm to the
 *     same-numbered thread of the other rank, streaming messages both ways with
 *     profiler handles; every received byte is checked;
 *   - one service thread that keeps making and tearing down connections
 *     (listen, connect, accept, closeListen, regMr, deregMr, a verified ping,
 *     closeSend/closeRecv; v11+: each round in a context of its own, created
 *     and finalized around it). One round in four is torn down while connect
 *     and accept may still be pending (v11+: finalize first), another closes
 *     with a send and a receive in flight, as ncclCommAbort does. It also
 *     registers memory on the progress threads' comms while they move data,
 *     as NCCL's lazy user-buffer registration does.
 *
 * Against a -race build of a Go plugin (make concurrent-race) this finds data
 * races between entry points that one-thread tests cannot reach.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define MT_MAX_THREADS 8
#define MT_WINDOW 8
#define MT_SVC_CHANNEL (MBOX_MAX - 1)
#define MT_SCRATCH (1u << 20)
#define MT_PING 4096

typedef struct mt_rank mt_rank_t;

typedef struct {
  mt_rank_t* m;
  int k; /* thread index, also its mailbox channel */
  pthread_t tid;
  net_t n; /* the rank's net_t with this thread's communicator context */
  link_t l;
  /* The service thread registers memory on l's comms while this thread moves
   * data (allowed: NCCL does it); comm_mu keeps it off them while they close. */
  pthread_mutex_t comm_mu;
  int comms_up;
  long msgs, bytes;
  char why[WHY_LEN];
  int failed;
} mt_thread_t;

struct mt_rank {
  rank_t* r;
  const opts_t* o;
  net_t n;
  hprops_t p;
  int nthreads;
  atomic_int stop;    /* some thread of this rank failed */
  atomic_int running; /* progress threads not done yet */
  mt_thread_t th[MT_MAX_THREADS];
  pthread_t svc;
  int rounds, regs, aborts, inflight_closes;
  int torn_errors; /* set-up calls that failed because the other rank tore the round down first */
  char svc_why[WHY_LEN];
  int svc_failed;
};

/* ------------------------------------------------------------ profiler */

/* NCCL's profiler as the plugin sees it: every Start with a parent handle
 * gets an event, every event must be stopped once. Thread-safe (several
 * progress threads report at once). */
static atomic_long mt_starts, mt_stops, mt_bad;

static ncclResult_t mt_profiler(void** eHandle, int type, void* pHandle, int64_t pluginId, void* extData) {
  (void)pluginId;
  (void)extData;
  if (eHandle == NULL) return ncclInvalidArgument;
  if (type == ncclProfilerNetEventStart) {
    if (pHandle == NULL) {
      atomic_fetch_add(&mt_bad, 1);
      *eHandle = NULL;
      return ncclSuccess;
    }
    atomic_fetch_add(&mt_starts, 1);
    *eHandle = pHandle; /* any non-NULL token; the plugin must hand it back at Stop */
  } else if (type == ncclProfilerNetEventStop || type == ncclProfilerNetEventUpdateAndStop) {
    if (*eHandle == NULL) atomic_fetch_add(&mt_bad, 1);
    else atomic_fetch_add(&mt_stops, 1);
  }
  return ncclSuccess;
}

/* ------------------------------------------------------------ helpers */

static int mt_fail(mt_rank_t* m, char* why, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static int mt_fail(mt_rank_t* m, char* why, const char* fmt, ...) {
  if (why[0] == 0) { /* the first failure is the one to report */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, WHY_LEN, fmt, ap);
    va_end(ap);
  }
  atomic_store(&m->stop, 1);
  atomic_store(&m->r->shm->abort_check[m->r->rank], m->r->check);
  return -1;
}

/* Why a wait should end early, or NULL to keep going. */
static const char* mt_interrupted(mt_rank_t* m) {
  if (atomic_load(&m->stop)) return "another thread of this rank failed";
  if (peer_failed(m->r)) return "the other rank failed";
  if (past_deadline(m->r)) return "the deadline passed";
  return NULL;
}

static uint64_t mt_hash(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* Message i of thread k from rank src: its size (zero-byte messages included,
 * as NCCL sends them) and the seed of its contents. */
static size_t mt_size(int src, int k, int i, size_t max) {
  if (i % 7 == 3) return 0;
  return 1 + (size_t)(mt_hash(((uint64_t)src << 48) ^ ((uint64_t)k << 32) ^ (uint64_t)i) % max);
}
static uint64_t mt_seed(int src, int k, int i) { return ((uint64_t)src << 48) | ((uint64_t)k << 32) | (uint64_t)i; }

typedef struct {
  char handle[NCCL_NET_HANDLE_MAXSIZE];
  int more; /* the sender wants this round to happen */
} mt_hello_t;
_Static_assert(sizeof(mt_hello_t) <= MBOX_DATA, "mt_hello_t must fit a mailbox");

/* listen, swap handles with thread ch of the other rank, then connect/accept
 * without blocking on either. *go is false (and nothing is left open) when
 * either side did not want the round. With polls > 0 it gives up after that
 * many connect/accept calls, leaving whatever is pending (an abort during
 * connection set-up). */
static int mt_link(mt_rank_t* m, net_t* n, int ch, bool more, int polls, link_t* l, bool* go, char* why) {
  rank_t* r = m->r;
  memset(l, 0, sizeof *l);
  *go = false;
  mt_hello_t mine = {.more = more}, peer;
  ncclResult_t res = net_listen(n, 0, mine.handle, &l->lc);
  if (res != ncclSuccess || l->lc == NULL)
    return mt_fail(m, why, "listen returned %s with listenComm %p", result_str(res), l->lc);
  int k = mbox_post(r, ch, &mine, sizeof mine);
  if (k == 0) k = mbox_take(r, ch, &peer, sizeof peer);
  if (k != 0) {
    net_close_listen(n, l->lc);
    l->lc = NULL;
    return mt_fail(m, why, "could not swap listen handles with the other rank (%s)",
                   k == -3 ? "it failed" : k == -2 ? "deadline" : "mailbox error");
  }
  if (!mine.more || !peer.more) {
    res = net_close_listen(n, l->lc); /* a listener nobody connected to */
    l->lc = NULL;
    if (res != ncclSuccess) return mt_fail(m, why, "closeListen of an unused listener returned %s", result_str(res));
    return 0;
  }
  ncclNetDeviceHandle_v8_t *sdh = NULL, *rdh = NULL;
  ncclNetCommConfig_v10_t cfg = {NCCL_NET_TRAFFIC_CLASS_UNDEF};
  /* In a round torn down during set-up (polls > 0) the other rank may close
   * its listener before this rank's connect reaches it: the connect then
   * fails with ncclSystemError ("connection reset by peer"), as NCCL's own
   * would against an aborting peer. That is the abort's outcome, not a
   * defect; any other result is still one. */
#define MT_TORN(res) (polls > 0 && ((res) == ncclSystemError || (res) == ncclRemoteError))
  while (l->sc == NULL || l->rc == NULL) {
    if (l->sc == NULL && (res = net_connect(n, 0, &cfg, peer.handle, &l->sc, &sdh)) != ncclSuccess) {
      if (!MT_TORN(res)) return mt_fail(m, why, "connect returned %s", result_str(res));
      m->torn_errors++;
      break;
    }
    if (l->rc == NULL) {
      if ((res = net_accept(n, l->lc, &l->rc, &rdh)) != ncclSuccess) {
        if (!MT_TORN(res)) return mt_fail(m, why, "accept returned %s", result_str(res));
        m->torn_errors++;
        break;
      }
      if (l->rc != NULL) {
        res = net_close_listen(n, l->lc);
        l->lc = NULL;
        if (res != ncclSuccess) return mt_fail(m, why, "closeListen after accept returned %s", result_str(res));
      }
    }
    if (l->sc != NULL && l->rc != NULL) break;
    if (polls > 0 && --polls == 0) break;
    const char* stop = mt_interrupted(m);
    if (stop) return mt_fail(m, why, "connect/accept not done when %s (sendComm %p, recvComm %p)", stop, l->sc, l->rc);
    sched_yield();
  }
#undef MT_TORN
  *go = true;
  return 0;
}

static int mt_unlink(mt_rank_t* m, net_t* n, link_t* l, char* why) {
  ncclResult_t a = l->sc ? net_close_send(n, l->sc) : ncclSuccess;
  ncclResult_t b = l->rc ? net_close_recv(n, l->rc) : ncclSuccess;
  ncclResult_t c = l->lc ? net_close_listen(n, l->lc) : ncclSuccess;
  memset(l, 0, sizeof *l);
  if (a != ncclSuccess || b != ncclSuccess || c != ncclSuccess)
    return mt_fail(m, why, "close returned %s / %s / %s (send/recv/listen)", result_str(a), result_str(b), result_str(c));
  return 0;
}

/* ------------------------------------------------------------ progress threads */

static int mt_stream(mt_thread_t* t) {
  mt_rank_t* m = t->m;
  int me = m->r->rank, peer = 1 - me, k = t->k;
  size_t max = m->o->size, slot = (max + 4095) & ~(size_t)4095;
  int iters = m->o->iters;
  bool prof = t->n.version >= 10;
  uint8_t* sbuf = buf_alloc(slot * MT_WINDOW);
  uint8_t* rbuf = buf_alloc(slot * MT_WINDOW);
  if (sbuf == NULL || rbuf == NULL) return mt_fail(m, t->why, "cannot allocate buffers");
  void *smh = NULL, *rmh = NULL;
  int rv = 0;
  ncclResult_t res;
  if ((res = net_regmr(&t->n, t->l.sc, sbuf, slot * MT_WINDOW, NCCL_PTR_HOST, &smh)) != ncclSuccess ||
      (res = net_regmr(&t->n, t->l.rc, rbuf, slot * MT_WINDOW, NCCL_PTR_HOST, &rmh)) != ncclSuccess) {
    rv = mt_fail(m, t->why, "regMr returned %s", result_str(res));
    goto out;
  }
  pthread_mutex_lock(&t->comm_mu);
  t->comms_up = 1;
  pthread_mutex_unlock(&t->comm_mu);

  char phs[MT_WINDOW], phr[MT_WINDOW]; /* distinct non-NULL profiler parents per slot */
  void *sreq[MT_WINDOW], *rreq[MT_WINDOW];
  int sposted = 0, sdone = 0, rposted = 0, rdone = 0;
  while (sdone < iters || rdone < iters) {
    bool progress = false;
    while (sposted < iters && sposted - sdone < MT_WINDOW) {
      int s = sposted % MT_WINDOW;
      size_t sz = mt_size(me, k, sposted, max);
      pattern_fill(sbuf + (size_t)s * slot, sz, mt_seed(me, k, sposted));
      void* req = NULL;
      res = net_isend(&t->n, t->l.sc, sbuf + (size_t)s * slot, sz, me, smh, prof ? &phs[s] : NULL, &req);
      if (res != ncclSuccess) {
        rv = mt_fail(m, t->why, "isend #%d (%zu bytes) returned %s", sposted, sz, result_str(res));
        goto out;
      }
      if (req == NULL) break; /* retry later, as NCCL does */
      sreq[s] = req;
      sposted++;
      progress = true;
    }
    while (rposted < iters && rposted - rdone < MT_WINDOW) {
      int s = rposted % MT_WINDOW;
      void* data[1] = {rbuf + (size_t)s * slot};
      size_t sizes[1] = {max};
      int tags[1] = {peer};
      void* mhs[1] = {rmh};
      void* ph[1] = {&phr[s]};
      void* req = (rposted & 1) ? (void*)0x1 : NULL; /* NCCL's LL/LL128 marker on some */
      res = net_irecv(&t->n, t->l.rc, 1, data, sizes, tags, mhs, prof ? ph : NULL, &req);
      if (res != ncclSuccess) {
        rv = mt_fail(m, t->why, "irecv #%d returned %s", rposted, result_str(res));
        goto out;
      }
      if (req == (void*)0x1) {
        rv = mt_fail(m, t->why, "irecv #%d left NCCL's 0x1 marker in *request", rposted);
        goto out;
      }
      if (req == NULL) break;
      rreq[s] = req;
      rposted++;
      progress = true;
    }
    int done = 0, got = -1;
    if (sdone < sposted) {
      if ((res = net_test(&t->n, sreq[sdone % MT_WINDOW], &done, &got)) != ncclSuccess) {
        rv = mt_fail(m, t->why, "test on send #%d returned %s", sdone, result_str(res));
        goto out;
      }
      if (done) {
        size_t want = mt_size(me, k, sdone, max);
        if ((size_t)got != want) {
          rv = mt_fail(m, t->why, "send #%d reported %d bytes sent, posted %zu", sdone, got, want);
          goto out;
        }
        sdone++;
        progress = true;
      }
    }
    if (rdone < rposted) {
      done = 0;
      got = -1;
      if ((res = net_test(&t->n, rreq[rdone % MT_WINDOW], &done, &got)) != ncclSuccess) {
        rv = mt_fail(m, t->why, "test on recv #%d returned %s", rdone, result_str(res));
        goto out;
      }
      if (done) {
        size_t want = mt_size(peer, k, rdone, max);
        if ((size_t)got != want) {
          rv = mt_fail(m, t->why, "recv #%d reported %d bytes, the peer sent %zu", rdone, got, want);
          goto out;
        }
        long long bad = pattern_check(rbuf + (size_t)(rdone % MT_WINDOW) * slot, want, mt_seed(peer, k, rdone));
        if (bad >= 0) {
          rv = mt_fail(m, t->why, "corrupt data: recv #%d (%zu bytes), byte %lld is wrong", rdone, want, bad);
          goto out;
        }
        t->msgs++;
        t->bytes += (long)want;
        rdone++;
        progress = true;
      }
    }
    if (!progress) {
      const char* stop = mt_interrupted(m);
      if (stop) {
        rv = mt_fail(m, t->why, "stopped when %s (sent %d/%d, received %d/%d)", stop, sdone, iters, rdone, iters);
        goto out;
      }
      sched_yield();
    }
  }
out:
  pthread_mutex_lock(&t->comm_mu);
  t->comms_up = 0;
  pthread_mutex_unlock(&t->comm_mu);
  if (smh) net_deregmr(&t->n, t->l.sc, smh);
  if (rmh) net_deregmr(&t->n, t->l.rc, rmh);
  buf_free(sbuf, slot * MT_WINDOW);
  buf_free(rbuf, slot * MT_WINDOW);
  return rv;
}

static void* mt_progress(void* arg) {
  mt_thread_t* t = arg;
  mt_rank_t* m = t->m;
  t->n = m->n;
  t->n.ctx = NULL;
  bool own_ctx = t->n.version >= 11;
  ncclResult_t res;
  if (own_ctx && (res = net_init_with(&t->n, &t->n.ctx, 0x10000 + (uint64_t)t->k, mt_profiler)) != ncclSuccess) {
    t->failed = mt_fail(m, t->why, "init of communicator %d returned %s", t->k, result_str(res));
    goto out;
  }
  bool go;
  if (mt_link(m, &t->n, t->k, true, 0, &t->l, &go, t->why) != 0) {
    t->failed = 1;
  } else if (mt_stream(t) != 0) {
    t->failed = 1;
  }
  if (mt_unlink(m, &t->n, &t->l, t->why) != 0) t->failed = 1;
  if (own_ctx && (res = net_finalize(&t->n, t->n.ctx)) != ncclSuccess && !t->failed)
    t->failed = mt_fail(m, t->why, "finalize of communicator %d returned %s", t->k, result_str(res));
out:
  atomic_fetch_sub(&m->running, 1);
  return NULL;
}

/* ------------------------------------------------------------ service thread */

/* One 4 KiB message each way on a fresh link, verified. */
static int mt_ping(mt_rank_t* m, net_t* n, link_t* l, uint8_t* buf, void* smh, void* rmh, int round) {
  rank_t* r = m->r;
  int me = r->rank;
  void *sq = NULL, *rq = NULL;
  pattern_fill(buf, MT_PING, mt_seed(me, 99, round));
  ncclResult_t res = post_one(r, n, false, l->rc, buf + MT_PING, MT_PING, 1 - me, rmh, &rq);
  if (res == ncclSuccess) res = post_one(r, n, true, l->sc, buf, MT_PING, me, smh, &sq);
  if (res != ncclSuccess) return mt_fail(m, m->svc_why, "round %d: posting the ping returned %s", round, result_str(res));
  char why[WHY_LEN];
  int ssz = -1, rsz = -1;
  if (wait_one(r, n, sq, &ssz, why, sizeof why) != 0 || wait_one(r, n, rq, &rsz, why, sizeof why) != 0)
    return mt_fail(m, m->svc_why, "round %d: ping: %s", round, why);
  if (rsz != MT_PING || pattern_check(buf + MT_PING, MT_PING, mt_seed(1 - me, 99, round)) >= 0)
    return mt_fail(m, m->svc_why, "round %d: ping came back wrong (%d bytes)", round, rsz);
  return 0;
}

static void* mt_service(void* arg) {
  mt_rank_t* m = arg;
  uint8_t* scratch = buf_alloc(MT_SCRATCH);
  if (scratch == NULL) {
    m->svc_failed = mt_fail(m, m->svc_why, "cannot allocate the scratch buffer");
    return NULL;
  }
  bool own_ctx = m->n.version >= 11;
  for (int round = 0;; round++) {
    net_t n = m->n;
    n.ctx = NULL;
    bool more = atomic_load(&m->running) > 0 && !atomic_load(&m->stop);
    ncclResult_t res;
    if (own_ctx && more && (res = net_init_with(&n, &n.ctx, 0x20000 + (uint64_t)round, mt_profiler)) != ncclSuccess) {
      m->svc_failed = mt_fail(m, m->svc_why, "round %d: init of an extra context returned %s", round, result_str(res));
      break;
    }
    /* Every fourth round is torn down while connect/accept may still be
     * pending (ncclCommAbort during set-up): v11+ finalizes its context
     * first, then whatever exists is closed. Both ranks count rounds alike. */
    bool abort_round = round % 4 == 3;
    link_t l;
    bool go = false;
    int rc = mt_link(m, &n, MT_SVC_CHANNEL, more, abort_round ? 1 : 0, &l, &go, m->svc_why);
    if (rc == 0 && go && abort_round) {
      if (own_ctx && (res = net_finalize(&n, n.ctx)) != ncclSuccess)
        rc = mt_fail(m, m->svc_why, "round %d: finalize during connection set-up returned %s", round, result_str(res));
      n.ctx = NULL;
      m->aborts++;
    } else if (rc == 0 && go) {
      void *smh = NULL, *rmh = NULL;
      if ((res = net_regmr(&n, l.sc, scratch, 2 * MT_PING, NCCL_PTR_HOST, &smh)) != ncclSuccess ||
          (res = net_regmr(&n, l.rc, scratch, 2 * MT_PING, NCCL_PTR_HOST, &rmh)) != ncclSuccess)
        rc = mt_fail(m, m->svc_why, "round %d: regMr returned %s", round, result_str(res));
      if (rc == 0) rc = mt_ping(m, &n, &l, scratch, smh, rmh, round);
      if (rc == 0 && round % 4 == 1) {
        /* Close with requests in flight (ncclCommAbort): the plugin settles them. */
        void *rq = NULL, *sq = NULL;
        ncclResult_t a = post_one(m->r, &n, false, l.rc, scratch + MT_PING, MT_PING, 1 - m->r->rank, rmh, &rq);
        ncclResult_t b = post_one(m->r, &n, true, l.sc, scratch, MT_PING, m->r->rank, smh, &sq);
        if (a != ncclSuccess || b != ncclSuccess)
          rc = mt_fail(m, m->svc_why, "round %d: posting before an abort returned %s / %s", round, result_str(a), result_str(b));
        else
          m->inflight_closes++;
      }
      if (smh) net_deregmr(&n, l.sc, smh);
      if (rmh) net_deregmr(&n, l.rc, rmh);
      /* Lazy user-buffer registration on a comm a progress thread is using. */
      mt_thread_t* t = &m->th[round % m->nthreads];
      pthread_mutex_lock(&t->comm_mu);
      if (rc == 0 && t->comms_up) {
        void* mh = NULL;
        void* comm = (round & 1) ? t->l.rc : t->l.sc;
        size_t off = (size_t)(round % 16) * 4096;
        if ((res = net_regmr(&t->n, comm, scratch + off, MT_SCRATCH - off, NCCL_PTR_HOST, &mh)) != ncclSuccess)
          rc = mt_fail(m, m->svc_why, "round %d: regMr on a busy comm returned %s", round, result_str(res));
        else if ((res = net_deregmr(&t->n, comm, mh)) != ncclSuccess)
          rc = mt_fail(m, m->svc_why, "round %d: deregMr on a busy comm returned %s", round, result_str(res));
        else if ((res = net_deregmr(&t->n, comm, NULL)) != ncclSuccess) /* NCCL deregisters failed ones too */
          rc = mt_fail(m, m->svc_why, "round %d: deregMr(NULL) returned %s", round, result_str(res));
        else
          m->regs++;
      }
      pthread_mutex_unlock(&t->comm_mu);
    }
    if (mt_unlink(m, &n, &l, m->svc_why) != 0) rc = -1;
    if (own_ctx && n.ctx != NULL && (res = net_finalize(&n, n.ctx)) != ncclSuccess && rc == 0)
      rc = mt_fail(m, m->svc_why, "round %d: finalize of an extra context returned %s", round, result_str(res));
    if (rc != 0) {
      m->svc_failed = 1;
      break;
    }
    if (!go) break;
    m->rounds++;
  }
  buf_free(scratch, MT_SCRATCH);
  return NULL;
}

/* ------------------------------------------------------------ ranks */

typedef struct {
  const opts_t* o;
  int version;
} mt_arg_t;

static int mt_rank_main(rank_t* r, void* arg) {
  const opts_t* o = ((const mt_arg_t*)arg)->o;
  int version = ((const mt_arg_t*)arg)->version;
  shm_t* s = r->shm;
  char* out = s->text[r->rank];
  static mt_rank_t m; /* large; one per process */
  memset(&m, 0, sizeof m);
  m.r = r;
  m.o = o;
  m.nthreads = o->threads;
  char why[WHY_LEN + 64] = "";
  int rc = 1;
  r->check = 0;
  atomic_store(&s->cur_start_ns[r->rank], now_ns());
  atomic_store(&s->cur[r->rank], 0);
  r->deadline_ns = now_ns() + (uint64_t)(rank_budget(r->timeout) * 1e9);
  set_where(r, "loading the plugin");
  if (net_load(&m.n, o->plugin, version, why, sizeof why) != 0) goto done;
  const char* miss = net_missing_entry(&m.n);
  if (*miss) {
    snprintf(why, sizeof why, "ncclNetPlugin_v%d.%s is NULL", version, miss);
    goto done;
  }
  set_where(r, "init");
  ncclResult_t res = net_init_with(&m.n, &m.n.ctx, 0x4242 + (uint64_t)r->rank, mt_profiler);
  int nd = 0;
  if (res != ncclSuccess || (res = net_devices(&m.n, &nd)) != ncclSuccess || nd <= 0 ||
      (res = net_props(&m.n, 0, &m.p)) != ncclSuccess) {
    snprintf(why, sizeof why, "init/devices/getProperties(0) returned %s (ndev %d)", result_str(res), nd);
    goto done;
  }
  set_where(r, "threads running");
  atomic_store(&m.running, m.nthreads);
  int started = 0;
  for (; started < m.nthreads; started++) {
    mt_thread_t* t = &m.th[started];
    t->m = &m;
    t->k = started;
    pthread_mutex_init(&t->comm_mu, NULL);
    if (pthread_create(&t->tid, NULL, mt_progress, t) != 0) break;
  }
  bool svc = started == m.nthreads && pthread_create(&m.svc, NULL, mt_service, &m) == 0;
  if (started < m.nthreads || !svc) {
    atomic_fetch_sub(&m.running, m.nthreads - started);
    mt_fail(&m, why, "pthread_create failed");
  }
  for (int i = 0; i < started; i++) pthread_join(m.th[i].tid, NULL);
  if (svc) pthread_join(m.svc, NULL);
  set_where(r, "checking results");
  long msgs = 0, bytes = 0;
  for (int i = 0; i < started; i++) {
    mt_thread_t* t = &m.th[i];
    msgs += t->msgs;
    bytes += t->bytes;
    if (t->failed && !why[0]) snprintf(why, sizeof why, "progress thread %d: %s", i, t->why);
  }
  if (m.svc_failed && !why[0]) snprintf(why, sizeof why, "service thread: %s", m.svc_why);
  if (why[0]) goto done;
  long st = atomic_load(&mt_starts), sp = atomic_load(&mt_stops), bad = atomic_load(&mt_bad);
  if (version >= 10 && (st != sp || bad != 0 || st == 0)) {
    snprintf(why, sizeof why, "profiler: %ld events started, %ld stopped, %ld bad calls (want equal, > 0, and 0)", st, sp, bad);
    goto done;
  }
  if (version >= 11 && (res = net_finalize(&m.n, m.n.ctx)) != ncclSuccess) {
    snprintf(why, sizeof why, "finalize of the main context returned %s", result_str(res));
    goto done;
  }
  snprintf(out, sizeof s->text[0],
           "rank %d: %d progress threads received %ld messages (%.1f MiB) verified; service thread: %d connection "
           "rounds%s (%d torn down during set-up, %d of them failing connect/accept on this rank; %d closed with requests "
           "in flight), %d registrations on busy "
           "comms; profiler events: %ld started, %ld stopped",
           r->rank, m.nthreads, msgs, (double)bytes / (1 << 20), m.rounds,
           version >= 11 ? " each in its own init/finalize context" : "", m.aborts, m.torn_errors, m.inflight_closes, m.regs,
           st, sp);
  rc = 0;
done:
  if (rc != 0) {
    snprintf(out, sizeof s->text[0], "rank %d: %s", r->rank, why);
    atomic_store(&s->abort_check[r->rank], 0);
  }
  atomic_store(&s->cur[r->rank], -1);
  return rc;
}

int cmd_concurrent(const opts_t* o) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (o->threads < 1 || o->threads > MT_MAX_THREADS) {
    fprintf(stderr, "concurrent: --threads %d: use 1 to %d\n", o->threads, MT_MAX_THREADS);
    return 2;
  }
  shm_t* s = shm_create();
  if (s == NULL) return 2;
  int rc = 0;
  for (int vi = 0; vi < o->nversions; vi++) {
    int v = o->versions[vi];
    memset(s->text, 0, sizeof s->text);
    memset(s->mbox, 0, sizeof s->mbox);
    mt_arg_t arg = {o, v};
    double limit = o->timeout > 0 ? o->timeout : 120;
    pair_outcome_t out;
    uint64_t t0 = now_ns();
    if (run_pair(s, mt_rank_main, &arg, limit, limit + 10, &out) != 0) return 2;
    double secs = (double)(now_ns() - t0) / 1e9;
    if (out.hung) {
      printf("FAIL concurrent v%d: rank %d hung in \"%s\" for %.0f s\n", v, out.hung_rank, out.hung_where, out.hung_after);
      rc = 1;
      continue;
    }
    int ok = 1;
    for (int i = 0; i < 2; i++) {
      char st[96];
      if (!(WIFEXITED(out.status[i]) && WEXITSTATUS(out.status[i]) == 0)) {
        ok = 0;
        /* 66 is the Go race detector's exit code (GORACE=halt_on_error=1). */
        bool race = WIFEXITED(out.status[i]) && WEXITSTATUS(out.status[i]) == 66 && !s->text[i][0];
        printf("FAIL concurrent v%d: rank %d %s: %s%s%s\n", v, i, wait_status_str(out.status[i], st, sizeof st),
               s->text[i][0] ? s->text[i] : race ? "halted by the Go race detector (its report is on stderr)" : "(no result)",
               s->where[i][0] ? " in " : "", s->where[i]);
      }
    }
    if (ok) printf("PASS concurrent v%d (%.1f s): %s; %s\n", v, secs, s->text[0], s->text[1]);
    else rc = 1;
  }
  return rc;
}
