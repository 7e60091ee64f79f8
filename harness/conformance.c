/*
 * conformance.c: the contract NCCL relies on, one check at a time, for each API
 * version. Both ranks run the same list in step (the control channel marks the
 * end of every check); each check can fail, and a rank that fails a check
 * raises a flag so the other one stops waiting for it.
 */
#define _GNU_SOURCE
#include <math.h>
#include <dirent.h>
#include <poll.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

/* A single plugin call that takes longer than this is treated as blocking.
 * The peer deliberately stays away for PEER_DELAY_MS in the non-blocking
 * checks, so a call that waits for it is caught with margin to spare on a
 * busy 2-core machine. Under software emulation (the Soft-RoCE lane boots its
 * guest under qemu TCG, 10-50x slower) a plain listen() can take a few hundred
 * ms: NCCLNET_HARNESS_TIME_SCALE (1 to 50, default 1) stretches all three
 * bounds together, so the peer's absence stays longer than the bound and a
 * call that waits for the peer is still caught. */
static double g_time_scale = 1.0;
#define CALL_BOUND_MS (200.0 * g_time_scale)
#define PEER_DELAY_MS ((int)(700.0 * g_time_scale))
#define CLOSE_BOUND_MS (1000.0 * g_time_scale)
#define CONN_TIMEOUT_S 20.0
#define MAXWIN 64

typedef struct {
  rank_t* r;
  net_t n;
  bool loaded, inited;
  int ndev;
  hprops_t props; /* device 0 */
  char why[WHY_LEN];
  bool secondary; /* this rank failed only because the other one did */
  char note[128]; /* shown after PASS (e.g. what did not apply) */
  int version;
  const char* path;
} conf_t;

typedef int (*check_fn)(conf_t* c);
enum {
  F_SOLO0 = 1,   /* rank 1 is gone by then (after peer-killed): rank 0 alone */
  F_NOSYNC = 2,  /* no end-of-check handshake (a rank dies on purpose) */
  F_NEWEST = 4,  /* only for the newest version under test */
  F_NOSETUP = 8, /* the check does load/init itself */
};
typedef struct {
  const char* name;
  check_fn fn;
  int minver;
  int flags;
} check_t;

typedef struct {
  const char* path;
  const char* only;
  int version;
  int first;
  bool with_1g;
  const check_t* checks;
  int nchecks;
} conf_arg_t;

static int fail(conf_t* c, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(conf_t* c, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->why, sizeof c->why, fmt, ap);
  va_end(ap);
  return -1;
}

/* The other rank failed: waiting on is pointless, and the real reason is its. */
static int peer_gone(conf_t* c, const char* during) {
  c->secondary = true;
  return fail(c, "stopped %s because the other rank failed this check", during);
}

static const char* warn_suffix(char* buf, size_t len) {
  char w[300];
  if (harness_last_warn(w, sizeof w) > 0) snprintf(buf, len, " (last WARN: %s)", w);
  else snprintf(buf, len, " (no WARN logged)");
  return buf;
}

static double ms_since(uint64_t t0) { return (double)(now_ns() - t0) / 1e6; }

/* ------------------------------------------------------------ setup */

static int do_load(conf_t* c) {
  if (c->loaded) return 0;
  char err[WHY_LEN];
  set_where(c->r, "dlopen(%s) + dlsym(ncclNetPlugin_v%d)", c->path, c->version);
  if (net_load(&c->n, c->path, c->version, err, sizeof err) != 0) return fail(c, "%s", err);
  c->loaded = true;
  return 0;
}

static int do_setup(conf_t* c) {
  if (do_load(c) != 0) return -1;
  if (c->inited) return 0;
  const char* miss = net_missing_entry(&c->n);
  if (*miss) return fail(c, "setup: ncclNetPlugin_v%d.%s is NULL", c->version, miss);
  set_where(c->r, "init");
  ncclResult_t res = net_init(&c->n, &c->n.ctx, 0x1234 + (uint64_t)c->r->rank, true);
  if (res != ncclSuccess) return fail(c, "setup: init returned %s", result_str(res));
  c->inited = true;
  res = net_devices(&c->n, &c->ndev);
  if (res != ncclSuccess || c->ndev <= 0) return fail(c, "setup: devices returned %s, ndev %d", result_str(res), c->ndev);
  res = net_props(&c->n, 0, &c->props);
  if (res != ncclSuccess) return fail(c, "setup: getProperties(0) returned %s", result_str(res));
  return 0;
}

/* ------------------------------------------------------------ connections */

enum { L_NULL_DEVPTR = 1, L_NULL_CONFIG = 2 };

static int timed(conf_t* c, const char* what, uint64_t t0) {
  double ms = ms_since(t0);
  if (ms > CALL_BOUND_MS)
    return fail(c, "%s took %.0f ms; it must not block (NCCL polls it and may drive connect and accept from one thread)",
                what, ms);
  return 0;
}

static int check_devh(conf_t* c, const char* what, ncclNetDeviceHandle_v8_t* dh) {
  if (dh != NULL && c->props.netDeviceType == NCCL_NET_DEVICE_HOST)
    return fail(c, "%s wrote device handle %p although the device is NCCL_NET_DEVICE_HOST (that asks NCCL for offload)",
                what, (void*)dh);
  return 0;
}

/* link_up with every call timed and the NCCL corner cases selectable. */
static int conf_link(conf_t* c, link_t* l, int flags) {
  rank_t* r = c->r;
  memset(l, 0, sizeof *l);
  char mine[NCCL_NET_HANDLE_MAXSIZE] = {0}, peer[NCCL_NET_HANDLE_MAXSIZE];
  set_where(r, "listen");
  uint64_t t0 = now_ns();
  ncclResult_t res = net_listen(&c->n, 0, mine, &l->lc);
  if (timed(c, "listen", t0)) return -1;
  if (res != ncclSuccess || l->lc == NULL)
    return fail(c, "listen returned %s with listenComm %p (must be non-NULL on success)", result_str(res), l->lc);
  set_where(r, "exchanging handles");
  if (ctl_send(r, mine, sizeof mine) != 0) return fail(c, "control channel to the other rank is broken");
  int k = ctl_recv(r, peer, sizeof peer, CONN_TIMEOUT_S);
  if (k == -3) return peer_gone(c, "before connecting");
  if (k != 0) return fail(c, "did not get the other rank's listen handle");
  ncclNetDeviceHandle_v8_t *sdh = NULL, *rdh = NULL;
  ncclNetDeviceHandle_v8_t** sdp = (flags & L_NULL_DEVPTR) ? NULL : &sdh;
  ncclNetDeviceHandle_v8_t** rdp = (flags & L_NULL_DEVPTR) ? NULL : &rdh;
  ncclNetCommConfig_v10_t cfg = {NCCL_NET_TRAFFIC_CLASS_UNDEF};
  ncclNetCommConfig_v10_t* cfgp = (flags & L_NULL_CONFIG) ? NULL : &cfg;
  uint64_t until = now_ns() + (uint64_t)(CONN_TIMEOUT_S * 1e9);
  set_where(r, "connect/accept loop");
  while (l->sc == NULL || l->rc == NULL) {
    if (l->sc == NULL) {
      t0 = now_ns();
      res = net_connect(&c->n, 0, cfgp, peer, &l->sc, sdp);
      if (timed(c, "connect", t0)) return -1;
      if (res != ncclSuccess) return fail(c, "connect returned %s", result_str(res));
    }
    if (l->rc == NULL) {
      t0 = now_ns();
      res = net_accept(&c->n, l->lc, &l->rc, rdp);
      if (timed(c, "accept", t0)) return -1;
      if (res != ncclSuccess) return fail(c, "accept returned %s", result_str(res));
      if (l->rc != NULL) {
        t0 = now_ns();
        res = net_close_listen(&c->n, l->lc);
        l->lc = NULL;
        if (timed(c, "closeListen", t0)) return -1;
        if (res != ncclSuccess) return fail(c, "closeListen after accept returned %s", result_str(res));
      }
    }
    if (now_ns() > until)
      return fail(c, "connect/accept still returned NULL comms after %.0f s (sendComm %p, recvComm %p)", CONN_TIMEOUT_S,
                  l->sc, l->rc);
    if (peer_failed(r)) return peer_gone(c, "connecting");
    if (l->sc == NULL || l->rc == NULL) sched_yield();
  }
  if (check_devh(c, "connect", sdh) || check_devh(c, "accept", rdh)) return -1;
  return 0;
}

static int conf_unlink(conf_t* c, link_t* l) {
  int rc = 0;
  uint64_t t0 = now_ns();
  set_where(c->r, "closing comms");
  if (l->sc && net_close_send(&c->n, l->sc) != ncclSuccess) rc = fail(c, "closeSend failed");
  if (l->rc && net_close_recv(&c->n, l->rc) != ncclSuccess) rc = fail(c, "closeRecv failed");
  if (l->lc && net_close_listen(&c->n, l->lc) != ncclSuccess) rc = fail(c, "closeListen failed");
  memset(l, 0, sizeof *l);
  if (rc == 0 && ms_since(t0) > 5 * CLOSE_BOUND_MS)
    rc = fail(c, "closing the comms took %.0f ms; close must not wait for the peer", ms_since(t0));
  return rc;
}

/* ------------------------------------------------------------ data streams */

/* One direction of traffic on one comm: `count` messages, `window` in flight,
 * message i carries the pattern seed+i. Send and receive sides use the same
 * description so the receiver knows what it must get. */
typedef struct {
  const char* label;
  int send;
  void* comm;
  int count;
  const size_t* sizes; /* bytes the sender sends */
  const size_t* caps;  /* receive capacity (NULL: same as sizes) */
  int window;
  uint64_t seed;
  int tag;
  void** phandles;  /* per-message profiler handles, or NULL */
  bool sizes_null;  /* test(..., sizes = NULL) as NCCL does for flushes/bootstrap */
  /* state */
  uint8_t* arena;
  size_t slot, arena_len;
  void* mh;
  void* req[MAXWIN];
  int filled_for[MAXWIN];
  int posted, done;
} stream_t;

#define GUARD_BYTE 0xEE
#define GUARD_MAX 65536

static size_t cap_of(const stream_t* s, int i) { return s->caps ? s->caps[i] : s->sizes[i]; }

static int stream_setup(conf_t* c, stream_t* s) {
  size_t mx = 1;
  for (int i = 0; i < s->count; i++) mx = cap_of(s, i) > mx ? cap_of(s, i) : mx;
  if (s->window > MAXWIN) s->window = MAXWIN;
  if (s->window > s->count) s->window = s->count;
  s->slot = (mx + 4095) & ~(size_t)4095;
  s->arena_len = s->slot * (size_t)s->window;
  s->arena = buf_alloc(s->arena_len);
  if (s->arena == NULL) return fail(c, "%s: cannot allocate %zu bytes", s->label, s->arena_len);
  for (int i = 0; i < MAXWIN; i++) s->filled_for[i] = -1;
  s->mh = NULL;
  ncclResult_t res = net_regmr(&c->n, s->comm, s->arena, s->arena_len, NCCL_PTR_HOST, &s->mh);
  if (res != ncclSuccess) return fail(c, "%s: regMr(NCCL_PTR_HOST, %zu bytes) returned %s", s->label, s->arena_len, result_str(res));
  return 0;
}

static void stream_free(conf_t* c, stream_t* s) {
  if (s->arena == NULL) return;
  net_deregmr(&c->n, s->comm, s->mh);
  buf_free(s->arena, s->arena_len);
  s->arena = NULL;
}

/* Posts what the window allows. Returns -1 on failure. */
static int stream_post(conf_t* c, stream_t* s, bool* progress) {
  while (s->posted < s->count && s->posted - s->done < s->window) {
    int i = s->posted, slot = i % s->window;
    uint8_t* buf = s->arena + (size_t)slot * s->slot;
    void* req = (void*)0x1; /* NCCL's LL/LL128 optional-completion marker */
    void* ph = s->phandles ? s->phandles[i] : NULL;
    ncclResult_t res;
    char ws[400];
    if (s->send) {
      if (s->filled_for[slot] != i) {
        pattern_fill(buf, s->sizes[i], s->seed + (uint64_t)i);
        s->filled_for[slot] = i;
      }
      res = net_isend(&c->n, s->comm, buf, s->sizes[i], s->tag, s->mh, ph, &req);
    } else {
      size_t cap = cap_of(s, i);
      if (s->filled_for[slot] != i && cap > s->sizes[i]) {
        size_t g = cap - s->sizes[i] < GUARD_MAX ? cap - s->sizes[i] : GUARD_MAX;
        memset(buf + s->sizes[i], GUARD_BYTE, g);
      }
      s->filled_for[slot] = i;
      void* data[1] = {buf};
      size_t sz[1] = {cap};
      int tags[1] = {s->tag};
      void* mhs[1] = {s->mh};
      void* phs[1] = {ph};
      res = net_irecv(&c->n, s->comm, 1, data, sz, tags, mhs, s->phandles ? phs : NULL, &req);
    }
    if (res != ncclSuccess)
      return fail(c, "%s: %s #%d (%zu bytes) returned %s%s", s->label, s->send ? "isend" : "irecv", i, s->sizes[i],
                  result_str(res), warn_suffix(ws, sizeof ws));
    if (req == (void*)0x1)
      return fail(c, "%s: %s #%d left *request at 0x1 (the LL/LL128 marker NCCL pre-stores); it must always store a request or NULL",
                  s->label, s->send ? "isend" : "irecv", i);
    if (req == NULL) return 0; /* retry later, as NCCL does */
    s->req[slot] = req;
    s->posted++;
    *progress = true;
  }
  return 0;
}

static int stream_test(conf_t* c, stream_t* s, bool* progress) {
  if (s->done >= s->posted) return 0;
  int i = s->done, slot = i % s->window;
  int sz[1] = {-1}, d = 0;
  char ws[400];
  ncclResult_t res = net_test(&c->n, s->req[slot], &d, s->sizes_null ? NULL : sz);
  if (res != ncclSuccess)
    return fail(c, "%s: test on %s #%d (%zu bytes) returned %s%s", s->label, s->send ? "send" : "recv", i, s->sizes[i],
                result_str(res), warn_suffix(ws, sizeof ws));
  if (!d) return 0;
  if (!s->send) {
    uint8_t* buf = s->arena + (size_t)slot * s->slot;
    if (!s->sizes_null && sz[0] != (int)s->sizes[i])
      return fail(c, "%s: test reported %d bytes for recv #%d; the sender sent %zu (posted capacity %zu)", s->label, sz[0], i,
                  s->sizes[i], cap_of(s, i));
    long long bad = pattern_check(buf, s->sizes[i], s->seed + (uint64_t)i);
    if (bad >= 0)
      return fail(c, "%s: recv #%d (%zu bytes): byte %lld is wrong (data corrupted or messages out of order)", s->label, i,
                  s->sizes[i], bad);
    size_t cap = cap_of(s, i);
    if (cap > s->sizes[i]) {
      size_t g = cap - s->sizes[i] < GUARD_MAX ? cap - s->sizes[i] : GUARD_MAX;
      for (size_t k = 0; k < g; k++)
        if (buf[s->sizes[i] + k] != GUARD_BYTE)
          return fail(c, "%s: recv #%d of %zu bytes wrote past the received size (byte %zu of the posted %zu-byte buffer)",
                      s->label, i, s->sizes[i], s->sizes[i] + k, cap);
    }
  }
  s->done++;
  *progress = true;
  return 0;
}

static int run_streams(conf_t* c, stream_t* s, int ns) {
  int rc = 0;
  for (int k = 0; k < ns; k++) s[k].arena = NULL;
  for (int k = 0; k < ns && rc == 0; k++) rc = stream_setup(c, &s[k]);
  set_where(c->r, "moving data (%s ...)", s[0].label);
  while (rc == 0) {
    bool all = true, progress = false;
    for (int k = 0; k < ns && rc == 0; k++) {
      stream_t* x = &s[k];
      if (x->done == x->count) continue;
      all = false;
      if ((rc = stream_post(c, x, &progress)) != 0) break;
      rc = stream_test(c, x, &progress);
    }
    if (rc != 0 || all) break;
    if (peer_failed(c->r)) {
      rc = peer_gone(c, "moving data");
      break;
    }
    if (past_deadline(c->r)) {
      for (int k = 0; k < ns; k++)
        if (s[k].done < s[k].count) {
          rc = fail(c, "%s: %s #%d of %zu bytes not done before the check's deadline (%d of %d posted)", s[k].label,
                    s[k].send ? "send" : "recv", s[k].done, s[k].sizes[s[k].done], s[k].posted, s[k].count);
          break;
        }
      break;
    }
    if (!progress) sched_yield();
  }
  for (int k = 0; k < ns; k++) stream_free(c, &s[k]);
  return rc;
}

/* Traffic both ways on one link: this rank sends `sizes` with seed `seed_base + rank`
 * and receives the other rank's. */
static int exchange(conf_t* c, link_t* l, const char* label, int count, const size_t* sizes, const size_t* caps,
                    int window, uint64_t seed_base) {
  int me = c->r->rank;
  stream_t s[2];
  memset(s, 0, sizeof s);
  char ls[64], lr[64];
  snprintf(ls, sizeof ls, "%s send", label);
  snprintf(lr, sizeof lr, "%s recv", label);
  s[0] = (stream_t){.label = ls, .send = 1, .comm = l->sc, .count = count, .sizes = sizes, .window = window,
                    .seed = seed_base + (uint64_t)me * 1000003, .tag = me};
  s[1] = (stream_t){.label = lr, .send = 0, .comm = l->rc, .count = count, .sizes = sizes, .caps = caps,
                    .window = window, .seed = seed_base + (uint64_t)(1 - me) * 1000003, .tag = 1 - me};
  return run_streams(c, s, 2);
}

/* ================================================================= checks */

static int chk_load(conf_t* c) {
  if (do_load(c) != 0) return -1;
  if (c->n.name == NULL) return fail(c, "ncclNetPlugin_v%d.name is NULL", c->version);
  if (strlen(c->n.name) == 0) return fail(c, "ncclNetPlugin_v%d.name is empty (NCCL_NET matches on it)", c->version);
  const char* miss = net_missing_entry(&c->n);
  if (*miss) return fail(c, "ncclNetPlugin_v%d.%s is NULL but NCCL calls it", c->version, miss);
  return 0;
}

static int chk_init(conf_t* c) {
  if (do_load(c) != 0) return -1;
  ncclResult_t res;
  set_where(c->r, "init");
  if (c->version >= 11) {
    /* NCCL 2.28+: one init/finalize pair per communicator, contexts overlap. */
    void *a = NULL, *b = NULL;
    if ((res = net_init(&c->n, &a, 0x1001, true)) != ncclSuccess) return fail(c, "first init(ctx) returned %s", result_str(res));
    if ((res = net_init(&c->n, &b, 0x1002, true)) != ncclSuccess)
      return fail(c, "second init(ctx) (a second communicator) returned %s", result_str(res));
    int nd = 0;
    if ((res = net_devices(&c->n, &nd)) != ncclSuccess || nd <= 0)
      return fail(c, "devices after two inits returned %s, ndev %d", result_str(res), nd);
    set_where(c->r, "finalize");
    if ((res = net_finalize(&c->n, a)) != ncclSuccess) return fail(c, "finalize(first ctx) returned %s", result_str(res));
    if ((res = net_finalize(&c->n, b)) != ncclSuccess) return fail(c, "finalize(second ctx) returned %s", result_str(res));
    /* The communicator the remaining checks use: init after every context was finalized. */
    set_where(c->r, "init after finalize");
    if ((res = net_init(&c->n, &c->n.ctx, 0x1003 + (uint64_t)c->r->rank, true)) != ncclSuccess)
      return fail(c, "init after both contexts were finalized returned %s (NCCL re-inits for the next communicator)",
                  result_str(res));
  } else {
    void* unused;
    if ((res = net_init(&c->n, &unused, 0, true)) != ncclSuccess) return fail(c, "init returned %s", result_str(res));
    if ((res = net_init(&c->n, &unused, 0, true)) != ncclSuccess)
      return fail(c, "init called a second time without finalize returned %s (NCCL may do that)", result_str(res));
    c->n.ctx = NULL;
  }
  c->inited = true;
  return 0;
}

static int chk_devices(conf_t* c) {
  int nd = -1, nd2 = -1;
  ncclResult_t res = net_devices(&c->n, &nd);
  if (res != ncclSuccess) return fail(c, "devices returned %s", result_str(res));
  if (nd <= 0)
    return fail(c, "devices reported %d; NCCL disables a plugin with no devices (init should fail instead)", nd);
  if ((res = net_devices(&c->n, &nd2)) != ncclSuccess || nd2 != nd)
    return fail(c, "second devices call returned %s with %d (first: %d)", result_str(res), nd2, nd);
  c->ndev = nd;
  if ((res = net_props(&c->n, 0, &c->props)) != ncclSuccess) return fail(c, "getProperties(0) returned %s", result_str(res));
  return 0;
}

#define GARBAGE 0xA5
static bool is_garbage32(int v) { return (uint32_t)v == 0xA5A5A5A5u; }

static int chk_props(conf_t* c) {
  size_t sz = net_props_size(c->version);
  uint8_t raw[256 + 64];
  int ndev = c->ndev < 16 ? c->ndev : 16;
  for (int d = 0; d < ndev; d++) {
    memset(raw, GARBAGE, sizeof raw);
    ncclResult_t res = net_props_raw(&c->n, d, raw);
    if (res != ncclSuccess) return fail(c, "getProperties(%d) returned %s", d, result_str(res));
    for (size_t k = sz; k < sz + 64; k++)
      if (raw[k] != GARBAGE)
        return fail(c, "getProperties(%d) wrote byte %zu, past the end of ncclNetProperties_v%d_t (%zu bytes)", d, k, c->version, sz);
    /* Fields the plugin left alone still hold 0xA5 garbage and fail below. */
    hprops_t p;
    net_props_convert(c->version, d, raw, &p);
    ncclNetProperties_v8_t* c8 = (void*)raw;
    if (c8->name == NULL || (uintptr_t)c8->name == 0xA5A5A5A5A5A5A5A5ull) return fail(c, "dev %d: name not set", d);
    size_t nl = strnlen(c8->name, 256);
    if (nl == 0 || nl == 256) return fail(c, "dev %d: name is empty or not a string", d);
    if ((uintptr_t)c8->pciPath == 0xA5A5A5A5A5A5A5A5ull) return fail(c, "dev %d: pciPath not set (NULL for a virtual NIC)", d);
    if (c8->pciPath != NULL && c8->pciPath[0] != '/')
      return fail(c, "dev %d: pciPath \"%.80s\" is not an absolute path (NCCL builds its topology from it)", d, c8->pciPath);
    if (c8->guid == 0xA5A5A5A5A5A5A5A5ull) return fail(c, "dev %d: guid not set", d);
    if (is_garbage32(c8->ptrSupport) || !(c8->ptrSupport & NCCL_PTR_HOST) || (c8->ptrSupport & ~7))
      return fail(c, "dev %d: ptrSupport 0x%x (must include NCCL_PTR_HOST and only known bits)", d, c8->ptrSupport);
    if (p.regIsGlobal != 0 && p.regIsGlobal != 1) return fail(c, "dev %d: regIsGlobal %d (0 or 1)", d, p.regIsGlobal);
    if (c->version >= 9 && p.forceFlush != 0 && p.forceFlush != 1) return fail(c, "dev %d: forceFlush %d (0 or 1)", d, p.forceFlush);
    if (p.speed <= 0) return fail(c, "dev %d: speed %d Mbps (must be > 0)", d, p.speed);
    if (is_garbage32(p.port)) return fail(c, "dev %d: port not set", d);
    if (!isfinite(p.latency) || p.latency < 0) return fail(c, "dev %d: latency %g (µs, >= 0)", d, (double)p.latency);
    if (p.maxComms <= 0) return fail(c, "dev %d: maxComms %d (must be > 0)", d, p.maxComms);
    if (p.maxRecvs < 1 || p.maxRecvs > 64) return fail(c, "dev %d: maxRecvs %d (1..64)", d, p.maxRecvs);
    if (p.netDeviceType != NCCL_NET_DEVICE_HOST || p.netDeviceVersion != 0)
      return fail(c, "dev %d: netDeviceType %d version %d (a host plugin reports NCCL_NET_DEVICE_HOST, version 0)", d,
                  p.netDeviceType, p.netDeviceVersion);
    if (c->version >= 9) {
      int maxv = c->version >= 12 ? NCCL_NET_MAX_DEVS_PER_NIC_V12 : NCCL_NET_MAX_DEVS_PER_NIC_V9;
      if (p.vndevs == 1) {
        if (p.vdevs[0] != d) return fail(c, "dev %d: vProps {1, %d}; a plain device reports {1, %d}", d, p.vdevs[0], d);
      } else if (p.vndevs < 1 || p.vndevs > maxv) {
        return fail(c, "dev %d: vProps.ndevs %d (1..%d)", d, p.vndevs, maxv);
      } else {
        for (int k = 0; k < p.vndevs; k++)
          if (p.vdevs[k] < 0 || p.vdevs[k] >= c->ndev) return fail(c, "dev %d: vProps.devs[%d] = %d is not a device", d, k, p.vdevs[k]);
      }
      if (p.maxP2pBytes == 0 || p.maxP2pBytes > NCCL_MAX_NET_SIZE_BYTES)
        return fail(c, "dev %d: maxP2pBytes %zu (NCCL requires (0, 2^40])", d, p.maxP2pBytes);
      if (p.maxCollBytes == 0 || p.maxCollBytes > NCCL_MAX_NET_SIZE_BYTES)
        return fail(c, "dev %d: maxCollBytes %zu (must be in (0, 2^40])", d, p.maxCollBytes);
    }
    if (c->version >= 11 && p.maxMultiRequestSize < 1)
      return fail(c, "dev %d: maxMultiRequestSize %d (>= 1)", d, p.maxMultiRequestSize);
    if (c->version >= 12 && (p.railId < -1 || p.planeId < -1))
      return fail(c, "dev %d: railId %d planeId %d (NCCL_NET_ID_UNDEF = -1 when unknown)", d, p.railId, p.planeId);
  }
  return 0;
}

static int chk_props_invalid(conf_t* c) {
  int bad[3] = {c->ndev, c->ndev + 7, -1};
  for (int i = 0; i < 3; i++) {
    uint8_t raw[256];
    memset(raw, GARBAGE, sizeof raw);
    ncclResult_t res = net_props_raw(&c->n, bad[i], raw);
    if (res == ncclSuccess)
      return fail(c, "getProperties(%d) with %d devices returned ncclSuccess; an invalid device must be an error", bad[i], c->ndev);
  }
  return 0;
}

/* makeVDevice with a device count the version's props cannot hold (or none)
 * must be an error, and not a read past NCCL's struct, which here ends at a
 * page followed by an inaccessible one (a plugin that reads on dies with
 * SIGSEGV, which the harness reports as the check failing). A valid fusion
 * is not attempted: it would add a device under the checks that follow. */
static int vdevice_bad(conf_t* c, const char* when) {
  if (!net_has_make_vdevice(&c->n)) {
    snprintf(c->note, sizeof c->note, "(makeVDevice is NULL %s)", when);
    return 0;
  }
  size_t pg = (size_t)sysconf(_SC_PAGESIZE), psz = net_vdevice_props_size(c->n.version);
  uint8_t* mem = mmap(NULL, 2 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return fail(c, "mmap: %s", strerror(errno));
  int rv = 0, max = net_vdevice_max_devs(c->n.version);
  if (mprotect(mem + pg, pg, PROT_NONE)) rv = fail(c, "mprotect: %s", strerror(errno));
  int counts[] = {max + 1, 64, 1000, 0, -1};
  for (int i = 0; rv == 0 && i < (int)(sizeof counts / sizeof counts[0]); i++) {
    uint8_t* props = mem + pg - psz;
    memset(props, 0, psz);
    memcpy(props, &counts[i], sizeof(int)); /* ndevs is the first field of every version */
    int d = -7;
    set_where(c->r, "makeVDevice");
    ncclResult_t res = net_make_vdevice(&c->n, &d, props);
    if (res == ncclSuccess)
      rv = fail(c, "makeVDevice %s with ndevs=%d (this version's struct holds %d) returned ncclSuccess, device %d", when,
                counts[i], max, d);
  }
  munmap(mem, 2 * pg);
  if (rv == 0) snprintf(c->note, sizeof c->note, "(ndevs %d, 64, 1000, 0, -1 refused %s)", max + 1, when);
  return rv;
}

/* NCCL never calls it before init, but the table is there to call. */
static int chk_vdevice_before_init(conf_t* c) {
  if (do_load(c) != 0) return -1;
  return vdevice_bad(c, "before init");
}

static int chk_vdevice_bad(conf_t* c) { return vdevice_bad(c, "after init"); }

/* Small traffic both ways proves a link works. */
static int link_works(conf_t* c, link_t* l, uint64_t seed) {
  size_t sizes[3] = {1024, 0, 77777};
  return exchange(c, l, "smoke", 3, sizes, NULL, 3, seed);
}

static int chk_nonblocking(conf_t* c) {
  rank_t* r = c->r;
  /* Phase A: rank 0 accepts while rank 1 has not connected yet.
   * Phase B: rank 0 connects while rank 1 has not started accepting. */
  void *lc = NULL, *sc = NULL, *rc = NULL;
  char h[NCCL_NET_HANDLE_MAXSIZE] = {0};
  ncclNetDeviceHandle_v8_t *sdh = NULL, *rdh = NULL;
  ncclNetCommConfig_v10_t cfg = {NCCL_NET_TRAFFIC_CLASS_UNDEF};
  ncclResult_t res;
  uint64_t t0;
  int rv = 0;
  for (int phase = 0; phase < 2 && rv == 0; phase++) {
    int acceptor = phase == 0 ? 0 : 1;
    if (r->rank == acceptor) {
      memset(h, 0, sizeof h);
      set_where(r, "listen (phase %c)", 'A' + phase);
      t0 = now_ns();
      res = net_listen(&c->n, 0, h, &lc);
      if (timed(c, "listen", t0)) return -1;
      if (res != ncclSuccess || lc == NULL) return fail(c, "listen returned %s, listenComm %p", result_str(res), lc);
      if (ctl_send(r, h, sizeof h)) return fail(c, "control channel broken");
      uint64_t start = now_ns();
      if (phase == 0) {
        set_where(r, "accept before the peer connects");
        while (ms_since(start) < PEER_DELAY_MS - CALL_BOUND_MS) {
          t0 = now_ns();
          res = net_accept(&c->n, lc, &rc, &rdh);
          if (timed(c, "accept (peer not connecting yet)", t0)) return -1;
          if (res != ncclSuccess) return fail(c, "accept before the peer connected returned %s (must be success with a NULL comm)", result_str(res));
          if (rc != NULL) return fail(c, "accept returned a comm before the peer called connect");
          sleep_ms(5);
        }
      } else {
        sleep_ms(PEER_DELAY_MS);
      }
      set_where(r, "accept loop (phase %c)", 'A' + phase);
      uint64_t until = now_ns() + (uint64_t)(CONN_TIMEOUT_S * 1e9);
      while (rc == NULL) {
        t0 = now_ns();
        res = net_accept(&c->n, lc, &rc, &rdh);
        if (timed(c, "accept", t0)) return -1;
        if (res != ncclSuccess) return fail(c, "accept returned %s", result_str(res));
        if (now_ns() > until) return fail(c, "accept still NULL after %.0f s", CONN_TIMEOUT_S);
        if (peer_failed(r)) return peer_gone(c, "accepting");
        sched_yield();
      }
      if (check_devh(c, "accept", rdh)) return -1;
      t0 = now_ns();
      res = net_close_listen(&c->n, lc);
      lc = NULL;
      if (timed(c, "closeListen", t0)) return -1;
      if (res != ncclSuccess) return fail(c, "closeListen returned %s", result_str(res));
    } else {
      set_where(r, "waiting for the listen handle (phase %c)", 'A' + phase);
      int k = ctl_recv(r, h, sizeof h, CONN_TIMEOUT_S);
      if (k == -3) return peer_gone(c, "before connect");
      if (k) return fail(c, "no listen handle from the other rank");
      if (phase == 0) sleep_ms(PEER_DELAY_MS);
      set_where(r, "connect loop (phase %c)", 'A' + phase);
      uint64_t until = now_ns() + (uint64_t)(CONN_TIMEOUT_S * 1e9);
      int calls = 0;
      while (sc == NULL) {
        t0 = now_ns();
        res = net_connect(&c->n, 0, &cfg, h, &sc, &sdh); /* same handle buffer every time, as NCCL */
        calls++;
        if (timed(c, phase ? "connect (peer not accepting yet)" : "connect", t0)) return -1;
        if (res != ncclSuccess) return fail(c, "connect returned %s after %d calls", result_str(res), calls);
        if (now_ns() > until) return fail(c, "connect still NULL after %.0f s (%d calls)", CONN_TIMEOUT_S, calls);
        if (peer_failed(r)) return peer_gone(c, "connecting");
        if (sc == NULL) sched_yield();
      }
      if (check_devh(c, "connect", sdh)) return -1;
    }
  }
  link_t l = {.sc = sc, .rc = rc};
  rv = link_works(c, &l, 11);
  if (conf_unlink(c, &l) && rv == 0) rv = -1;
  return rv;
}

static int chk_null_devptr(conf_t* c) {
  link_t l;
  int flags = L_NULL_DEVPTR | (c->version == 10 ? L_NULL_CONFIG : 0);
  int rv = conf_link(c, &l, flags);
  if (rv == 0) rv = link_works(c, &l, 22);
  if (conf_unlink(c, &l) && rv == 0) rv = -1;
  if (rv == 0 && c->version == 10) snprintf(c->note, sizeof c->note, "(also v10 connect config NULL)");
  return rv;
}

static int chk_regmr(conf_t* c) {
  link_t l;
  if (conf_link(c, &l, 0)) return -1;
  int rv = 0;
  size_t len = 1 << 20;
  void* buf = buf_alloc(len);
  void* comms[2] = {l.sc, l.rc};
  const char* cn[2] = {"sendComm", "recvComm"};
  char ws[400];
  for (int i = 0; i < 2 && rv == 0; i++) {
    void* mh = NULL;
    ncclResult_t res = net_regmr(&c->n, comms[i], buf, len, NCCL_PTR_HOST, &mh);
    if (res != ncclSuccess) {
      rv = fail(c, "regMr(%s, NCCL_PTR_HOST, 1 MiB) returned %s%s", cn[i], result_str(res), warn_suffix(ws, sizeof ws));
      break;
    }
    if ((res = net_deregmr(&c->n, comms[i], mh)) != ncclSuccess) {
      rv = fail(c, "deregMr(%s) of a HOST registration returned %s", cn[i], result_str(res));
      break;
    }
    if ((res = net_deregmr(&c->n, comms[i], NULL)) != ncclSuccess) {
      rv = fail(c, "deregMr(%s, NULL) returned %s; NCCL deregisters failed registrations with a NULL handle", cn[i],
                result_str(res));
      break;
    }
    int types[2] = {NCCL_PTR_CUDA, 0x8};
    for (int t = 0; t < 2 && rv == 0; t++) {
      if (c->props.ptrSupport & types[t]) continue;
      mh = NULL;
      int w0 = atomic_load(&g_warns);
      res = net_regmr(&c->n, comms[i], buf, len, types[t], &mh);
      if (res == ncclSuccess)
        rv = fail(c, "regMr(%s, type 0x%x) returned ncclSuccess but ptrSupport is 0x%x; an unsupported type must be an error",
                  cn[i], types[t], c->props.ptrSupport);
      else if (atomic_load(&g_warns) == w0)
        rv = fail(c, "regMr(%s, unsupported type 0x%x) returned %s without a WARN saying what was wrong", cn[i], types[t],
                  result_str(res));
    }
  }
  buf_free(buf, len);
  if (conf_unlink(c, &l) && rv == 0) rv = -1;
  return rv;
}

static int chk_marker(conf_t* c) {
  link_t l;
  if (conf_link(c, &l, 0)) return -1;
  size_t sizes[16];
  for (int i = 0; i < 16; i++) sizes[i] = (size_t)(i * 113) % 700; /* includes 0-byte, LL-sized messages */
  int rv = exchange(c, &l, "marker", 16, sizes, NULL, 8, 33);
  if (conf_unlink(c, &l) && rv == 0) rv = -1;
  return rv;
}

static int chk_sizes(conf_t* c) {
  link_t l;
  if (conf_link(c, &l, 0)) return -1;
  size_t sizes[] = {0, 1, 7, 8, 4095, 65536, (1u << 20) + 3, 64u << 20, 8, 0};
  int rv = exchange(c, &l, "sizes", (int)(sizeof sizes / sizeof sizes[0]), sizes, NULL, 1, 44);
  if (conf_unlink(c, &l) && rv == 0) rv = -1;
  return rv;
}

static int chk_1gib(conf_t* c) {
  link_t l;
  if (conf_link(c, &l, 0)) return -1;
  size_t size = 1ull << 30;
  stream_t s = {.label = "1GiB", .comm = c->r->rank == 1 ? l.sc : l.rc, .send = c->r->rank == 1, .count = 1,
                .sizes = &size, .window = 1, .seed = 55, .tag = 1};
  int rv = run_streams(c, &s, 1);
  if (conf_unlink(c, &l) && rv == 0) rv = -1;
  return rv;
}

static int chk_recv_larger(conf_t* c) {
  link_t l;
  if (conf_link(c, &l, 0)) return -1;
  size_t sizes[] = {0, 1, 1000, 65536, (1u << 20) + 1, 5};
  size_t caps[] = {4096, 4096, 1 << 20, 4 << 20, 2 << 20, 64 << 10};
  int rv = exchange(c, &l, "recv>send", 6, sizes, caps, 2, 66);
  if (conf_unlink(c, &l) && rv == 0) rv = -1;
  return rv;
}

static int post_until(conf_t* c, bool send, void* comm, void* buf, size_t sz, void* mh, void** req) {
  uint64_t until = now_ns() + 5000000000ull;
  *req = NULL;
  while (*req == NULL) {
    *req = (void*)0x1;
    ncclResult_t res;
    if (send) res = net_isend(&c->n, comm, buf, sz, c->r->rank, mh, NULL, req);
    else {
      void* data[1] = {buf};
      size_t s[1] = {sz};
      int tags[1] = {1 - c->r->rank};
      void* mhs[1] = {mh};
      res = net_irecv(&c->n, comm, 1, data, s, tags, mhs, NULL, req);
    }
    if (res != ncclSuccess) return fail(c, "%s returned %s", send ? "isend" : "irecv", result_str(res));
    if (*req == (void*)0x1) return fail(c, "%s left *request at 0x1", send ? "isend" : "irecv");
    if (*req == NULL && now_ns() > until) return fail(c, "%s returned NULL requests for 5 s", send ? "isend" : "irecv");
    if (*req == NULL) sched_yield();
  }
  return 0;
}

/* A send larger than the posted receive. A transport that pushes data (like
 * NCCL's socket) finds out on the receiver's test; a rendezvous transport
 * (receiver-announced buffers, like IB) finds out in the sender's isend/test.
 * Either way one side must return ncclInvalidUsage with a WARN, the receive
 * must never report success, and nothing may land past the posted buffer. */
enum { SENDER_PENDING = 0, SENDER_OK = 1, SENDER_FAILED = 2 };

static int chk_truncate(conf_t* c) {
  rank_t* r = c->r;
  atomic_int* side = r->shm->aux[1]; /* [0] sender state, [1] its result, [2] 1 if it WARNed */
  if (r->rank == 1) { /* before the link handshake, so rank 0 never reads a stale state */
    atomic_store(&side[0], SENDER_PENDING);
    atomic_store(&side[2], 0);
  }
  link_t l;
  if (conf_link(c, &l, 0)) return -1;
  int rv = 0;
  const size_t cap = 1024, sent = 4096, guard = 8192;
  uint8_t* buf = buf_alloc(cap + guard);
  void* mh = NULL;
  char ws[400];
  if (r->rank == 0) {
    memset(buf, 0, cap);
    memset(buf + cap, 0x5C, guard);
    net_regmr(&c->n, l.rc, buf, cap + guard, NCCL_PTR_HOST, &mh);
    void* req;
    rv = post_until(c, false, l.rc, buf, cap, mh, &req);
    if (rv == 0 && ctl_send(r, "p", 1)) rv = fail(c, "control channel broken");
    int w0 = atomic_load(&g_warns);
    set_where(r, "test on the receive that is too small");
    ncclResult_t res = ncclSuccess;
    int done = 0, got[1] = {-1};
    uint64_t sender_failed_at = 0;
    while (rv == 0 && !done && res == ncclSuccess) {
      res = net_test(&c->n, req, &done, got);
      if (res != ncclSuccess || done) break;
      if (atomic_load(&side[0]) == SENDER_FAILED) {
        /* give our own side a moment to notice too, then take the sender's word */
        if (sender_failed_at == 0) sender_failed_at = now_ns();
        else if (ms_since(sender_failed_at) > 1000) break;
      }
      if (past_deadline(r)) rv = fail(c, "test on a %zu-byte receive of a %zu-byte send neither failed nor completed, and the sender reported no error", cap, sent);
      if (peer_failed(r)) rv = peer_gone(c, "waiting for the truncated receive");
      sched_yield();
    }
    if (rv == 0) {
      int sstate = atomic_load(&side[0]), sres = atomic_load(&side[1]), swarn = atomic_load(&side[2]);
      if (done && res == ncclSuccess)
        rv = fail(c, "a %zu-byte send into a %zu-byte receive completed (reported %d bytes); it must fail with ncclInvalidUsage",
                  sent, cap, got[0]);
      else if (res == ncclInvalidUsage) {
        if (atomic_load(&g_warns) == w0) rv = fail(c, "truncation returned ncclInvalidUsage but logged no WARN saying what was wrong");
      } else if (res != ncclSuccess) {
        if (!(sstate == SENDER_FAILED && sres == ncclInvalidUsage))
          rv = fail(c, "a %zu-byte send into a %zu-byte receive: receiver's test returned %s; NCCL expects ncclInvalidUsage%s",
                    sent, cap, result_str(res), warn_suffix(ws, sizeof ws));
      } else if (sstate == SENDER_FAILED) {
        if (sres != ncclInvalidUsage)
          rv = fail(c, "the sender detected the oversized send but returned %s; expected ncclInvalidUsage", result_str((ncclResult_t)sres));
        else if (!swarn)
          rv = fail(c, "the sender returned ncclInvalidUsage for the oversized send without a WARN saying what was wrong");
        else
          snprintf(c->note, sizeof c->note, "(detected by the sender)");
      }
      for (size_t k = 0; rv == 0 && k < guard; k++)
        if (buf[cap + k] != 0x5C) rv = fail(c, "truncated receive wrote %zu bytes past the posted %zu-byte buffer", k + 1, cap);
    }
    net_deregmr(&c->n, l.rc, mh);
  } else {
    pattern_fill(buf, sent, 77);
    net_regmr(&c->n, l.sc, buf, cap + guard, NCCL_PTR_HOST, &mh);
    char p;
    int k = ctl_recv(r, &p, 1, CONN_TIMEOUT_S);
    if (k == -3) rv = peer_gone(c, "before sending");
    else if (k) rv = fail(c, "no go-ahead from the receiver");
    int w0 = atomic_load(&g_warns);
    ncclResult_t res = ncclSuccess;
    void* req = NULL;
    uint64_t until = now_ns() + 5000000000ull;
    set_where(r, "isend larger than the posted receive");
    while (rv == 0 && req == NULL && now_ns() < until && res == ncclSuccess) {
      req = (void*)0x1;
      res = net_isend(&c->n, l.sc, buf, sent, 1, mh, NULL, &req);
      if (res == ncclSuccess && req == (void*)0x1) rv = fail(c, "isend left *request at 0x1");
      if (res != ncclSuccess) req = NULL;
    }
    /* The send may complete, fail, or stay pending (NCCL aborts the
     * communicator after the receiver's error); it only must not hang. */
    set_where(r, "test on the oversized send");
    int done = 0;
    uint64_t stop = now_ns() + 3000000000ull;
    while (rv == 0 && res == ncclSuccess && req != NULL && !done && now_ns() < stop && !peer_failed(r)) {
      res = net_test(&c->n, req, &done, NULL);
      sched_yield();
    }
    if (res != ncclSuccess) {
      atomic_store(&side[1], (int)res);
      atomic_store(&side[2], atomic_load(&g_warns) != w0);
      atomic_store(&side[0], SENDER_FAILED);
    } else if (done) {
      atomic_store(&side[0], SENDER_OK);
    }
    net_deregmr(&c->n, l.sc, mh);
  }
  /* Both sides close only after the receiver has seen the outcome. */
  if (rv == 0) {
    int k = ctl_barrier(r, CONN_TIMEOUT_S);
    if (k == -3) rv = peer_gone(c, "at the end");
  }
  buf_free(buf, cap + guard);
  if (conf_unlink(c, &l) && rv == 0) rv = -1;
  return rv;
}

static int chk_sizes_null(conf_t* c) {
  link_t l;
  if (conf_link(c, &l, 0)) return -1;
  size_t sizes[8] = {0, 8, 4096, 70000, 1, 128, 129, 65536};
  stream_t s[2];
  int me = c->r->rank;
  s[0] = (stream_t){.label = "sizes=NULL send", .send = 1, .comm = l.sc, .count = 8, .sizes = sizes, .window = 4,
                    .seed = 88 + (uint64_t)me, .tag = me, .sizes_null = true};
  s[1] = (stream_t){.label = "sizes=NULL recv", .send = 0, .comm = l.rc, .count = 8, .sizes = sizes, .window = 4,
                    .seed = 88 + (uint64_t)(1 - me), .tag = 1 - me, .sizes_null = true};
  int rv = run_streams(c, s, 2);
  if (conf_unlink(c, &l) && rv == 0) rv = -1;
  return rv;
}

/* 32 receives posted (grouped by maxRecvs) before the sender posts
 * 32*maxRecvs sends; nothing is tested until everything is posted. */
static int chk_inflight(conf_t* c) {
  rank_t* r = c->r;
  link_t l;
  if (conf_link(c, &l, 0)) return -1;
  int m = c->props.maxRecvs, nreq = NCCL_NET_MAX_REQUESTS, total = nreq * m;
  const size_t msz = 4096 + 64;
  size_t len = (size_t)total * msz;
  uint8_t* arena = buf_alloc(len);
  void* mh = NULL;
  void* comm = r->rank == 0 ? l.rc : l.sc;
  int rv = 0;
  char ws[400];
  net_regmr(&c->n, comm, arena, len, NCCL_PTR_HOST, &mh);
  void** reqs = calloc((size_t)total, sizeof(void*));
  int nposts = r->rank == 0 ? nreq : total, posted = 0;
  if (r->rank == 1) {
    int k = ctl_recv(r, &posted, sizeof posted, CONN_TIMEOUT_S); /* receiver's go-ahead */
    posted = 0;
    if (k == -3) rv = peer_gone(c, "before sending");
    else if (k) rv = fail(c, "no go-ahead from the receiver");
    for (int i = 0; i < total; i++) pattern_fill(arena + (size_t)i * msz, msz - 64 + (size_t)(i % 64), 900 + (uint64_t)i);
  }
  set_where(r, "posting %d %s", nposts, r->rank == 0 ? "irecvs" : "isends");
  uint64_t null_since = 0;
  while (rv == 0 && posted < nposts) {
    void* req = (void*)0x1;
    ncclResult_t res;
    if (r->rank == 0) {
      void* data[64];
      size_t sz[64];
      int tags[64];
      void* mhs[64];
      for (int j = 0; j < m; j++) {
        data[j] = arena + (size_t)(posted * m + j) * msz;
        sz[j] = msz;
        tags[j] = j;
        mhs[j] = mh;
      }
      res = net_irecv(&c->n, l.rc, m, data, sz, tags, mhs, NULL, &req);
    } else {
      int i = posted;
      res = net_isend(&c->n, l.sc, arena + (size_t)i * msz, msz - 64 + (size_t)(i % 64), i % m, mh, NULL, &req);
    }
    if (res != ncclSuccess) {
      rv = fail(c, "%s #%d returned %s%s", r->rank == 0 ? "irecv" : "isend", posted, result_str(res), warn_suffix(ws, sizeof ws));
      break;
    }
    if (req == (void*)0x1) {
      rv = fail(c, "%s left *request at 0x1", r->rank == 0 ? "irecv" : "isend");
      break;
    }
    if (req == NULL) {
      if (null_since == 0) null_since = now_ns();
      if (ms_since(null_since) > 2000) {
        rv = fail(c, "only %d %s accepted in flight on one comm (NCCL needs %d%s); #%d kept returning NULL for 2 s", posted,
                  r->rank == 0 ? "irecvs" : "isends", nposts, r->rank == 0 ? "" : " = 32 * maxRecvs", posted);
        break;
      }
      if (peer_failed(r)) {
        rv = peer_gone(c, "posting");
        break;
      }
      sched_yield();
      continue;
    }
    null_since = 0;
    reqs[posted++] = req;
  }
  if (rv == 0 && r->rank == 0 && ctl_send(r, &posted, sizeof posted)) rv = fail(c, "control channel broken");
  set_where(r, "testing %d requests in order", nposts);
  for (int i = 0; rv == 0 && i < nposts; i++) {
    int done = 0, sz[64];
    memset(sz, 0xff, sizeof sz);
    while (!done && rv == 0) {
      ncclResult_t res = net_test(&c->n, reqs[i], &done, sz);
      if (res != ncclSuccess) rv = fail(c, "test on request #%d returned %s%s", i, result_str(res), warn_suffix(ws, sizeof ws));
      else if (!done && past_deadline(r)) rv = fail(c, "request #%d of %d never completed", i, nposts);
      else if (!done && peer_failed(r)) rv = peer_gone(c, "testing");
      else if (!done) sched_yield();
    }
    if (rv || r->rank == 1) continue;
    for (int j = 0; j < m && rv == 0; j++) {
      int k = i * m + j;
      size_t want = msz - 64 + (size_t)(k % 64);
      if (sz[j] != (int)want) rv = fail(c, "group %d buffer %d: test reported %d bytes, expected %zu", i, j, sz[j], want);
      else if (pattern_check(arena + (size_t)k * msz, want, 900 + (uint64_t)k) >= 0)
        rv = fail(c, "group %d buffer %d: data is not message #%d (FIFO order or tag matching broken)", i, j, k);
    }
  }
  net_deregmr(&c->n, comm, mh);
  free(reqs);
  buf_free(arena, len);
  if (rv == 0) {
    int k = ctl_barrier(r, CONN_TIMEOUT_S);
    if (k == -3) rv = peer_gone(c, "at the end");
  }
  if (conf_unlink(c, &l) && rv == 0) rv = -1;
  if (rv == 0) snprintf(c->note, sizeof c->note, "(%d recvs of n=%d, %d sends in flight)", nreq, m, total);
  return rv;
}

/* Grouped receive of n buffers: the sender's tags pick the buffer (sent in
 * reverse tag order), then all-equal tags as NCCL passes them (FIFO fill),
 * then distinct tags with each send tested before the next is posted (NCCL's
 * subs sharing a comm reach isend at different times): a send reported done
 * has its buffer scribbled over at once, as NCCL would reuse it. */
static int chk_grouped(conf_t* c) {
  rank_t* r = c->r;
  link_t l;
  if (conf_link(c, &l, 0)) return -1;
  int m = c->props.maxRecvs;
  int rv = 0;
  const size_t bsz = 8192;
  uint8_t* arena = buf_alloc(bsz * 64);
  void* mh = NULL;
  void* comm = r->rank == 0 ? l.rc : l.sc;
  char ws[400];
  static const char* const modes[] = {"distinct tags", "equal tags", "sends tested one by one"};
  net_regmr(&c->n, comm, arena, bsz * 64, NCCL_PTR_HOST, &mh);
  for (int mode = 0; mode < 3 && rv == 0; mode++) {
    for (int n = (m >= 2 ? 2 : 1); n <= m && rv == 0; n++) {
      /* size of the message for buffer j (distinct, so sizes[] proves the mapping) */
      uint64_t seed = 5000 + (uint64_t)(mode * 100 + n) * 64;
      if (r->rank == 0) {
        void* data[64];
        size_t sz[64];
        int tags[64];
        void* mhs[64];
        for (int j = 0; j < n; j++) {
          data[j] = arena + (size_t)j * bsz;
          sz[j] = bsz;
          tags[j] = mode == 1 ? 7 : 100 + j;
          mhs[j] = mh;
        }
        void* req = NULL;
        uint64_t until = now_ns() + 5000000000ull;
        while (req == NULL && rv == 0) {
          req = (void*)0x1;
          ncclResult_t res = net_irecv(&c->n, l.rc, n, data, sz, tags, mhs, NULL, &req);
          if (res != ncclSuccess) rv = fail(c, "irecv(n=%d) returned %s%s", n, result_str(res), warn_suffix(ws, sizeof ws));
          else if (req == (void*)0x1) rv = fail(c, "irecv(n=%d) left *request at 0x1", n);
          else if (req == NULL && now_ns() > until) rv = fail(c, "irecv(n=%d) returned NULL requests for 5 s", n);
        }
        if (rv == 0 && ctl_send(r, &n, sizeof n)) rv = fail(c, "control channel broken");
        int done = 0, got[64];
        while (rv == 0 && !done) {
          ncclResult_t res = net_test(&c->n, req, &done, got);
          if (res != ncclSuccess) rv = fail(c, "test on irecv(n=%d) returned %s%s", n, result_str(res), warn_suffix(ws, sizeof ws));
          else if (!done && past_deadline(r)) rv = fail(c, "irecv(n=%d) never completed", n);
          else if (!done && peer_failed(r)) rv = peer_gone(c, "waiting for a grouped receive");
          else if (!done) sched_yield();
        }
        for (int j = 0; j < n && rv == 0; j++) {
          size_t want = 1000 + (size_t)j * 17;
          if (got[j] != (int)want)
            rv = fail(c, "irecv(n=%d, %s): buffer %d reports %d bytes, expected %zu", n, modes[mode], j,
                      got[j], want);
          else if (pattern_check(data[j], want, seed + (uint64_t)j) >= 0)
            rv = fail(c, "irecv(n=%d, %s): buffer %d holds the wrong message (%s)", n, modes[mode], j,
                      mode == 1   ? "equal tags must fill buffers in send order"
                      : mode == 2 ? "a send reported done before its data was safe, or its request was reused"
                                  : "the tag must select the buffer");
        }
      } else {
        int k = ctl_recv(r, &n, sizeof n, CONN_TIMEOUT_S);
        if (k == -3) {
          rv = peer_gone(c, "before sending");
          break;
        }
        if (k) {
          rv = fail(c, "no go-ahead from the receiver");
          break;
        }
        void* reqs[64];
        int sent[64] = {0};
        for (int q = 0; q < n && rv == 0; q++) {
          /* mode 0: send buffer j's message with tag 100+j, highest tag first */
          int j = mode == 0 ? n - 1 - q : q;
          size_t sz = 1000 + (size_t)j * 17;
          uint8_t* b = arena + (size_t)q * bsz;
          pattern_fill(b, sz, seed + (uint64_t)j);
          reqs[q] = NULL;
          uint64_t until = now_ns() + 5000000000ull;
          while (reqs[q] == NULL && rv == 0) {
            reqs[q] = (void*)0x1;
            ncclResult_t res = net_isend(&c->n, l.sc, b, sz, mode == 1 ? 7 : 100 + j, mh, NULL, &reqs[q]);
            if (res != ncclSuccess) rv = fail(c, "isend returned %s", result_str(res));
            else if (reqs[q] == (void*)0x1) rv = fail(c, "isend left *request at 0x1");
            else if (reqs[q] == NULL && now_ns() > until) rv = fail(c, "isend returned NULL for 5 s");
          }
          for (int t = 0; mode == 2 && t < 50 && rv == 0 && !sent[q]; t++) {
            ncclResult_t res = net_test(&c->n, reqs[q], &sent[q], NULL);
            if (res != ncclSuccess) rv = fail(c, "test on send #%d of %d, before the next isend, returned %s", q, n, result_str(res));
            else if (sent[q]) memset(b, 0xa5, sz);
            else sched_yield();
          }
        }
        for (int q = 0; q < n && rv == 0; q++) {
          int done = sent[q];
          while (!done && rv == 0) {
            ncclResult_t res = net_test(&c->n, reqs[q], &done, NULL);
            if (res != ncclSuccess) rv = fail(c, "test on send returned %s", result_str(res));
            else if (!done && past_deadline(r)) rv = fail(c, "send #%d never completed", q);
            else if (!done && peer_failed(r)) rv = peer_gone(c, "sending");
            else if (!done) sched_yield();
          }
        }
      }
      if (rv == 0) {
        int k = ctl_barrier(r, CONN_TIMEOUT_S);
        if (k == -3) rv = peer_gone(c, "between groups");
      }
    }
  }
  net_deregmr(&c->n, comm, mh);
  buf_free(arena, bsz * 64);
  if (conf_unlink(c, &l) && rv == 0) rv = -1;
  if (rv == 0 && m == 1) snprintf(c->note, sizeof c->note, "(maxRecvs=1: only n=1 applies, tags checked)");
  else if (rv == 0) snprintf(c->note, sizeof c->note, "(n=2..%d)", m);
  return rv;
}

static int chk_fifo(conf_t* c) {
  link_t l;
  if (conf_link(c, &l, 0)) return -1;
  enum { N = 200 };
  size_t sizes[N], caps[N];
  for (int i = 0; i < N; i++) {
    sizes[i] = (size_t)(i * 7919) % 70001;
    caps[i] = 128 << 10;
  }
  int me = c->r->rank;
  /* one direction with receives bigger than sends; sizes differ per message,
   * so a reordering shows up as a size or data mismatch */
  stream_t s = {.label = "fifo", .send = me == 1, .comm = me == 1 ? l.sc : l.rc, .count = N, .sizes = sizes,
                .caps = me == 1 ? NULL : caps, .window = 8, .seed = 1200, .tag = 1};
  int rv = run_streams(c, &s, 1);
  if (conf_unlink(c, &l) && rv == 0) rv = -1;
  return rv;
}

static int chk_bidir(conf_t* c) {
  link_t l;
  if (conf_link(c, &l, 0)) return -1;
  size_t sizes[16];
  for (int i = 0; i < 16; i++) sizes[i] = (4u << 20) - (size_t)i * 4099;
  int rv = exchange(c, &l, "bidirectional", 16, sizes, NULL, 8, 1300);
  if (conf_unlink(c, &l) && rv == 0) rv = -1;
  return rv;
}

static int chk_multicomm(conf_t* c) {
  enum { NL = 4, N = 32 };
  link_t l[NL];
  int made = 0, rv = 0;
  for (; made < NL && rv == 0; made++)
    if (conf_link(c, &l[made], 0)) rv = -1;
  if (rv) made--;
  size_t sizes[N];
  for (int i = 0; i < N; i++) sizes[i] = (256u << 10) + (size_t)i * 31;
  if (rv == 0) {
    stream_t s[2 * NL];
    char labels[2 * NL][32];
    int me = c->r->rank;
    for (int k = 0; k < NL; k++) {
      snprintf(labels[2 * k], 32, "comm %d send", k);
      snprintf(labels[2 * k + 1], 32, "comm %d recv", k);
      s[2 * k] = (stream_t){.label = labels[2 * k], .send = 1, .comm = l[k].sc, .count = N, .sizes = sizes, .window = 4,
                            .seed = 1400 + (uint64_t)k * 100 + (uint64_t)me * 10000, .tag = me};
      s[2 * k + 1] = (stream_t){.label = labels[2 * k + 1], .send = 0, .comm = l[k].rc, .count = N, .sizes = sizes,
                                .window = 4, .seed = 1400 + (uint64_t)k * 100 + (uint64_t)(1 - me) * 10000, .tag = 1 - me};
    }
    rv = run_streams(c, s, 2 * NL);
  }
  for (int k = 0; k < made; k++)
    if (conf_unlink(c, &l[k]) && rv == 0) rv = -1;
  return rv;
}

static int chk_iflush(conf_t* c) {
  link_t l;
  if (conf_link(c, &l, 0)) return -1;
  int rv = 0;
  const ncclNet_v8_t* t = c->n.table;
  size_t sz = 65536;
  uint8_t* buf = buf_alloc(sz);
  void* mh = NULL;
  rank_t* r = c->r;
  stream_t s = {.label = "iflush", .send = r->rank == 1, .comm = r->rank == 1 ? l.sc : l.rc, .count = 1, .sizes = &sz,
                .window = 1, .seed = 1500, .tag = 1};
  rv = run_streams(c, &s, 1);
  if (rv == 0 && r->rank == 0) {
    if (t->iflush == NULL) {
      if (c->props.ptrSupport & (NCCL_PTR_CUDA | NCCL_PTR_DMABUF))
        rv = fail(c, "iflush is NULL but ptrSupport 0x%x allows GPU buffers, for which NCCL calls iflush", c->props.ptrSupport);
      else
        snprintf(c->note, sizeof c->note, "(iflush is NULL; NCCL never calls it for a host-only device)");
    } else {
      net_regmr(&c->n, l.rc, buf, sz, NCCL_PTR_HOST, &mh);
      void* data[1] = {buf};
      int sizes[1] = {(int)sz};
      void* mhs[1] = {mh};
      void* req = (void*)0x1;
      set_where(r, "iflush");
      ncclResult_t res = t->iflush(l.rc, 1, data, sizes, mhs, &req);
      if (res != ncclSuccess) rv = fail(c, "iflush on a host receive returned %s (must return a NULL request or one that completes)", result_str(res));
      else if (req == (void*)0x1) rv = fail(c, "iflush did not write *request");
      else if (req != NULL) {
        int done = 0;
        while (rv == 0 && !done) {
          res = net_test(&c->n, req, &done, NULL);
          if (res != ncclSuccess) rv = fail(c, "test(sizes=NULL) on the flush request returned %s", result_str(res));
          else if (!done && past_deadline(r)) rv = fail(c, "the flush request never completed");
          else if (!done) sched_yield();
        }
      }
      net_deregmr(&c->n, l.rc, mh);
    }
  }
  buf_free(buf, sz);
  if (rv == 0) {
    int k = ctl_barrier(r, CONN_TIMEOUT_S);
    if (k == -3) rv = peer_gone(c, "at the end");
  }
  if (conf_unlink(c, &l) && rv == 0) rv = -1;
  return rv;
}

static int chk_profiler(conf_t* c) {
  link_t l;
  if (conf_link(c, &l, 0)) return -1;
  enum { N = 16 };
  static char tokens[2][N]; /* their addresses are the phandles */
  void* ph[2][N];
  for (int i = 0; i < N; i++) {
    ph[0][i] = (i % 2 == 0) ? &tokens[0][i] : NULL; /* every other request carries no phandle */
    ph[1][i] = (i % 2 == 0) ? &tokens[1][i] : NULL;
  }
  prof_reset();
  size_t sizes[N];
  for (int i = 0; i < N; i++) sizes[i] = (size_t)(i * 5000);
  int me = c->r->rank;
  stream_t s[2];
  s[0] = (stream_t){.label = "profiled send", .send = 1, .comm = l.sc, .count = N, .sizes = sizes, .window = 4,
                    .seed = 1600 + (uint64_t)me, .tag = me, .phandles = ph[0]};
  s[1] = (stream_t){.label = "profiled recv", .send = 0, .comm = l.rc, .count = N, .sizes = sizes, .window = 4,
                    .seed = 1600 + (uint64_t)(1 - me), .tag = 1 - me, .phandles = ph[1]};
  int rv = run_streams(c, s, 2);
  if (conf_unlink(c, &l) && rv == 0) rv = -1;
  if (rv) return rv;
  if (atomic_load(&g_prof.null_starts))
    return fail(c, "%d profiler Start events had a NULL pHandle (NCCL passes NULL when it wants no event)",
                atomic_load(&g_prof.null_starts));
  if (atomic_load(&g_prof.unknown_stops)) return fail(c, "%d Stop events named an event that was never started", atomic_load(&g_prof.unknown_stops));
  if (atomic_load(&g_prof.double_stops)) return fail(c, "%d events were stopped twice", atomic_load(&g_prof.double_stops));
  if (atomic_load(&g_prof.starts) == 0)
    return fail(c, "no profiler events: %d requests carried a profiler handle but the callback passed to init was never called "
                   "(profiler events not implemented)", N);
  for (int d = 0; d < 2; d++)
    for (int i = 0; i < N; i += 2) {
      int open = 0, n = prof_events_for(ph[d][i], &open);
      if (n == 0) return fail(c, "%s #%d carried a phandle but got no Start event", d ? "irecv" : "isend", i);
      if (open) return fail(c, "%s #%d: %d of its %d events were never stopped (Start/Stop must pair)", d ? "irecv" : "isend", i, open, n);
    }
  snprintf(c->note, sizeof c->note, "(%d events, all paired)", atomic_load(&g_prof.starts));
  return 0;
}

/* Both ranks close with requests outstanding: rank 0 has receives matched by
 * sends still in flight, rank 1 has those sends plus receives nobody will ever
 * match. Close must return promptly on both; then a new link must work. */
static int chk_close_outstanding(conf_t* c) {
  rank_t* r = c->r;
  link_t l;
  if (conf_link(c, &l, 0)) return -1;
  int rv = 0;
  const size_t big = 32u << 20;
  const int nb = 4;
  uint8_t* buf = buf_alloc(big * (size_t)nb * 2);
  void *smh = NULL, *rmh = NULL;
  net_regmr(&c->n, l.sc, buf, big * (size_t)nb * 2, NCCL_PTR_HOST, &smh);
  net_regmr(&c->n, l.rc, buf, big * (size_t)nb * 2, NCCL_PTR_HOST, &rmh);
  void* req = NULL;
  char x;
  if (r->rank == 0) {
    /* receives for rank 1's sends, posted first so a rendezvous transport accepts them */
    for (int i = 0; i < nb && rv == 0; i++) rv = post_until(c, false, l.rc, buf + (size_t)i * big, big, rmh, &req);
    if (rv == 0 && ctl_send(r, "r", 1)) rv = fail(c, "control channel broken");
    if (rv == 0) {
      int k = ctl_recv(r, &x, 1, CONN_TIMEOUT_S); /* rank 1 has closed */
      if (k == -3) rv = peer_gone(c, "waiting for the peer to close");
      else if (k) rv = fail(c, "the other rank never reported its close");
    }
  } else {
    int k = ctl_recv(r, &x, 1, CONN_TIMEOUT_S);
    if (k == -3) rv = peer_gone(c, "before posting");
    else if (k) rv = fail(c, "no go-ahead from rank 0");
    for (int i = 0; i < nb && rv == 0; i++) rv = post_until(c, false, l.rc, buf + (size_t)(nb + i) * big, big, rmh, &req);
    for (int i = 0; i < nb && rv == 0; i++) rv = post_until(c, true, l.sc, buf + (size_t)i * big, big, smh, &req);
    for (int i = 0; i < 3 && rv == 0; i++) {
      int d;
      net_test(&c->n, req, &d, NULL); /* let some bytes move, not all */
    }
  }
  set_where(r, "closeSend/closeRecv with requests outstanding");
  net_deregmr(&c->n, l.sc, smh);
  net_deregmr(&c->n, l.rc, rmh);
  uint64_t t0 = now_ns();
  ncclResult_t a = net_close_send(&c->n, l.sc);
  double ms1 = ms_since(t0);
  t0 = now_ns();
  ncclResult_t b = net_close_recv(&c->n, l.rc);
  double ms2 = ms_since(t0);
  l.sc = l.rc = NULL;
  const char* what = r->rank == 0 ? "receives outstanding (peer closed mid-send)" : "sends and receives outstanding";
  if (rv == 0 && a != ncclSuccess) rv = fail(c, "closeSend with %s returned %s", what, result_str(a));
  if (rv == 0 && b != ncclSuccess) rv = fail(c, "closeRecv with %s returned %s", what, result_str(b));
  if (rv == 0 && ms1 > CLOSE_BOUND_MS) rv = fail(c, "closeSend with %s took %.0f ms (must not wait for the peer)", what, ms1);
  if (rv == 0 && ms2 > CLOSE_BOUND_MS) rv = fail(c, "closeRecv with %s took %.0f ms (must not wait for the peer)", what, ms2);
  if (r->rank == 1 && ctl_send(r, "c", 1) && rv == 0) rv = fail(c, "control channel broken");
  buf_free(buf, big * (size_t)nb * 2);
  if (rv == 0) {
    int k = ctl_barrier(r, CONN_TIMEOUT_S);
    if (k == -3) rv = peer_gone(c, "before reconnecting");
  }
  if (rv == 0) {
    if (conf_link(c, &l, 0)) return -1;
    size_t sizes[2] = {1u << 20, 12345};
    rv = exchange(c, &l, "after reconnect", 2, sizes, NULL, 2, 1700);
    if (conf_unlink(c, &l) && rv == 0) rv = -1;
  }
  return rv;
}

/* Rank 1 sends one message and closes its send comm as a peer that finished
 * (or aborted its communicator) does, its process alive. Rank 0 had two
 * receives posted: the first gets the message, which was on the wire before
 * the close; the second, which nothing will fill, must fail within the
 * deadline rather than stay pending (peer-killed covers a dead process). */
static int chk_peer_closed(conf_t* c) {
  rank_t* r = c->r;
  link_t l;
  if (conf_link(c, &l, 0)) return -1;
  const size_t small = 4096, big = 1u << 20;
  int rv = 0;
  uint8_t* buf = buf_alloc(small + big);
  void *smh = NULL, *rmh = NULL;
  net_regmr(&c->n, l.sc, buf, small + big, NCCL_PTR_HOST, &smh);
  net_regmr(&c->n, l.rc, buf, small + big, NCCL_PTR_HOST, &rmh);
  char x;
  if (r->rank == 1) {
    int k = ctl_recv(r, &x, 1, CONN_TIMEOUT_S); /* rank 0's receives are posted */
    if (k == -3) rv = peer_gone(c, "before sending");
    else if (k) rv = fail(c, "no go-ahead from rank 0");
    pattern_fill(buf, small, 0x70656572);
    void* sq = NULL;
    if (rv == 0) rv = post_until(c, true, l.sc, buf, small, smh, &sq);
    int done = 0;
    set_where(r, "sending the last message before the close");
    while (rv == 0 && !done) {
      int sz[1];
      ncclResult_t res = net_test(&c->n, sq, &done, sz);
      if (res != ncclSuccess) rv = fail(c, "test on the send before the close returned %s", result_str(res));
      else if (!done && past_deadline(r)) rv = fail(c, "the 4 KiB send before the close never completed");
      else if (!done) sched_yield();
    }
    net_deregmr(&c->n, l.sc, smh);
    set_where(r, "closeSend of a finished sender");
    ncclResult_t res = net_close_send(&c->n, l.sc);
    l.sc = NULL;
    if (rv == 0 && res != ncclSuccess) rv = fail(c, "closeSend returned %s", result_str(res));
    if (ctl_send(r, "c", 1) && rv == 0) rv = fail(c, "control channel broken");
  } else {
    void *rq1 = NULL, *rq2 = NULL;
    rv = post_until(c, false, l.rc, buf, small, rmh, &rq1);
    if (rv == 0) rv = post_until(c, false, l.rc, buf + small, big, rmh, &rq2);
    if (rv == 0 && ctl_send(r, "r", 1)) rv = fail(c, "control channel broken");
    if (rv == 0) {
      int k = ctl_recv(r, &x, 1, CONN_TIMEOUT_S); /* rank 1 has closed */
      if (k == -3) rv = peer_gone(c, "waiting for the peer to close");
      else if (k) rv = fail(c, "the other rank never reported its close");
    }
    set_where(r, "test on receives after the sender closed");
    int done = 0, size = -1;
    ncclResult_t res = ncclSuccess;
    while (rv == 0 && !done) {
      res = net_test(&c->n, rq1, &done, &size);
      if (res != ncclSuccess) rv = fail(c, "the receive of the message sent before the close failed with %s; it was on the wire and must arrive", result_str(res));
      else if (!done && past_deadline(r)) rv = fail(c, "the receive of the message sent before the close never completed");
      else if (!done) sched_yield();
    }
    if (rv == 0 && size != (int)small) rv = fail(c, "the message sent before the close arrived with size %d, not %zu", size, small);
    if (rv == 0 && pattern_check(buf, small, 0x70656572) >= 0) rv = fail(c, "the message sent before the close arrived with the wrong bytes");
    uint64_t t0 = now_ns();
    done = 0;
    res = ncclSuccess;
    while (rv == 0 && res == ncclSuccess && !done) {
      res = net_test(&c->n, rq2, &done, &size);
      if (res == ncclSuccess && !done && past_deadline(r)) break;
      if (res == ncclSuccess && !done) sched_yield();
    }
    double secs = (double)(now_ns() - t0) / 1e9;
    char ws[400];
    warn_suffix(ws, sizeof ws);
    if (rv == 0 && done && res == ncclSuccess)
      rv = fail(c, "a receive the closed sender never sent to reported success (size %d)", size);
    else if (rv == 0 && res == ncclSuccess)
      rv = fail(c, "test on a receive whose sender closed its comm still pending after %.1f s; it must return an error", secs);
    else if (rv == 0 && res != ncclSystemError && res != ncclRemoteError)
      rv = fail(c, "test on a receive whose sender closed returned %s; expected ncclSystemError or ncclRemoteError%s", result_str(res), ws);
    if (rv == 0) snprintf(c->note, sizeof c->note, "(the orphaned receive failed after %.3f s: %s)", secs, result_str(res));
    net_deregmr(&c->n, l.sc, smh);
  }
  net_deregmr(&c->n, l.rc, rmh);
  if (conf_unlink(c, &l) && rv == 0) rv = -1;
  buf_free(buf, small + big);
  return rv;
}

/* A word of the killed peer's send every KILLED_STRIDE bytes, so that a
 * receive that completes can be told apart: all of them landed, or not. */
#define KILLED_STRIDE (64u << 10)
static uint64_t killed_word(size_t off) { return 0x6b696c6c65640000ull ^ (uint64_t)off; }

/* Rank 1 dies (SIGKILL) right after starting a large send, with a large
 * receive of rank 0's data posted, leaving a forked child behind. Rank 0's receive must fail within the
 * deadline, unless every byte landed: an RDMA NIC may carry out writes
 * already posted while their process is being killed (our reading of one
 * completed receive over Soft-RoCE in the lane, 2026-11-26), and then the
 * receive is complete and right. Its send must end too (error, or success if
 * it all landed). */
static int chk_peer_killed(conf_t* c) {
  rank_t* r = c->r;
  link_t l;
  if (conf_link(c, &l, 0)) return -1;
  const size_t big = 512u << 20;
  int rv = 0;
  uint8_t* buf = buf_alloc(2 * big);
  void *smh = NULL, *rmh = NULL;
  net_regmr(&c->n, l.sc, buf, 2 * big, NCCL_PTR_HOST, &smh);
  net_regmr(&c->n, l.rc, buf, 2 * big, NCCL_PTR_HOST, &rmh);
  char x;
  if (r->rank == 1) {
    void *rq, *sq;
    for (size_t off = 0; off < big; off += KILLED_STRIDE) {
      uint64_t w = killed_word(off);
      memcpy(buf + off, &w, sizeof w);
    }
    if (post_until(c, false, l.rc, buf + big, big, rmh, &rq)) return -1;
    if (ctl_send(r, "r", 1)) return fail(c, "control channel broken");
    if (ctl_recv(r, &x, 1, CONN_TIMEOUT_S) != 0) return fail(c, "no go-ahead from rank 0");
    if (post_until(c, true, l.sc, buf, big, smh, &sq)) return -1;
    int d;
    net_test(&c->n, sq, &d, NULL);
    net_test(&c->n, rq, &d, NULL);
    /* As in a PyTorch job: a DataLoader worker forked after init, holding
     * every descriptor of this rank, outlives it, here past the check's
     * deadline. The peer must see the death all the same (until forkguard
     * it saw a live peer until the child exited). */
    /* Not the 1 GiB of message buffers: a fork copies pinned (registered)
     * pages at once, which would fill the lane's guest. A worker does not
     * need them, and the test is about descriptors. The child stays until
     * rank 0 has its verdict (or past the check's deadline): with ib it
     * keeps this rank's verbs context, and the 1 GiB that context pins,
     * alive while it lives. */
    madvise(buf, 2 * big, MADV_DONTFORK);
    fork_lingering_child(r->timeout + 30, &r->shm->res[0][r->check].state, RES_RUNNING);
    /* Report first: the parent expects this rank to die here. */
    atomic_store(&r->shm->expect_death[1], 1);
    atomic_store(&r->shm->res[1][r->check].state, RES_PASS);
    fflush(stdout);
    fflush(stderr);
    raise(SIGKILL);
    return 0;
  }
  void *rreq, *sreq;
  if (post_until(c, false, l.rc, buf, big, rmh, &rreq)) return -1;
  int k = ctl_recv(r, &x, 1, CONN_TIMEOUT_S); /* rank 1's receive is posted */
  if (k == -3) return peer_gone(c, "before sending");
  if (k) return fail(c, "no word from rank 1");
  if (post_until(c, true, l.sc, buf + big, big, smh, &sreq)) return -1;
  if (ctl_send(r, "k", 1)) return fail(c, "control channel broken");
  set_where(r, "test on requests whose peer was killed");
  ncclResult_t rres = ncclSuccess, sres = ncclSuccess;
  int rdone = 0, sdone = 0, rsize = -1;
  uint64_t t0 = now_ns();
  while ((rres == ncclSuccess && !rdone) || (sres == ncclSuccess && !sdone)) {
    int sz[1];
    if (rres == ncclSuccess && !rdone) rres = net_test(&c->n, rreq, &rdone, &rsize);
    if (sres == ncclSuccess && !sdone) sres = net_test(&c->n, sreq, &sdone, sz);
    if (past_deadline(r)) break;
    sched_yield();
  }
  double secs = (double)(now_ns() - t0) / 1e9;
  char ws[400];
  warn_suffix(ws, sizeof ws);
  bool landed = false;
  if (rdone && rres == ncclSuccess) {
    size_t bad = big;
    for (size_t off = 0; off < big && bad == big; off += KILLED_STRIDE) {
      uint64_t w;
      memcpy(&w, buf + off, sizeof w);
      if (w != killed_word(off)) bad = off;
    }
    if (rsize != (int)big)
      rv = fail(c, "the 512 MiB receive from a peer killed right after it started sending reported success with size %d", rsize);
    else if (bad != big)
      rv = fail(c, "the 512 MiB receive from a peer killed right after it started sending reported success, but the bytes at offset %zu are not the peer's: it must return an error", bad);
    else
      landed = true;
  } else if (rres == ncclSuccess) rv = fail(c, "test on a receive from a killed peer still pending after %.1f s; it must return an error", secs);
  else if (rres != ncclSystemError && rres != ncclRemoteError)
    rv = fail(c, "test on a receive from a killed peer returned %s; expected ncclSystemError or ncclRemoteError%s", result_str(rres), ws);
  else if (sres == ncclSuccess && !sdone) rv = fail(c, "test on a send to a killed peer still pending after %.1f s; it must end", secs);
  else if (sres != ncclSuccess && sres != ncclSystemError && sres != ncclRemoteError)
    rv = fail(c, "test on a send to a killed peer returned %s; expected ncclSystemError or ncclRemoteError%s", result_str(sres), ws);
  net_deregmr(&c->n, l.sc, smh);
  net_deregmr(&c->n, l.rc, rmh);
  uint64_t tc = now_ns();
  set_where(r, "closing comms of a dead peer");
  net_close_send(&c->n, l.sc);
  net_close_recv(&c->n, l.rc);
  if (rv == 0 && ms_since(tc) > 2 * CLOSE_BOUND_MS) rv = fail(c, "closing comms to a dead peer took %.0f ms", ms_since(tc));
  buf_free(buf, 2 * big);
  if (rv == 0)
    snprintf(c->note, sizeof c->note, "(after %.2f s: recv %s, send %s)", secs,
             landed ? "completed, every byte the peer sent before dying landed" : result_str(rres),
             sdone && sres == ncclSuccess ? "completed" : result_str(sres));
  return rv;
}

static int chk_finalize(conf_t* c) {
  ncclResult_t res = net_finalize(&c->n, c->n.ctx);
  if (res != ncclSuccess) return fail(c, "finalize(ctx) returned %s", result_str(res));
  c->inited = false;
  return 0;
}

/* ------------------------------------------------------- forked child init */

/* Hosts fork after NCCL is up: PyTorch's DataLoader workers (the default
 * "fork" start method), forked checkpoint writers. A child that then calls
 * init must get an answer, success or an error it can act on (NCCL falls back
 * to its internal transports), never a hang: a Go plugin's runtime does not
 * run in a forked child, and one whose transport had ended (after the last
 * finalize, as here from v11 on) blocked there forever. Rank 0 alone, after
 * finalize; the child reports through a pipe and is killed if it hangs. */
static int chk_fork_child_init(conf_t* c) {
  if (do_load(c) != 0) return -1;
  int p[2];
  if (pipe(p) != 0) return fail(c, "pipe: %s", strerror(errno));
  set_where(c->r, "fork, init in the child");
  pid_t pid = fork();
  if (pid < 0) {
    close(p[0]);
    close(p[1]);
    return fail(c, "fork: %s", strerror(errno));
  }
  if (pid == 0) {
    close(p[0]);
    net_t n = c->n;
    void* ctx = NULL;
    int res = (int)net_init(&n, &ctx, 0x4242, false);
    if (write(p[1], &res, sizeof res) != (ssize_t)sizeof res) _exit(2);
    if (res == ncclSuccess) net_finalize(&n, ctx);
    _exit(0);
  }
  close(p[1]);
  /* Bounded by the rank's deadline, at most 15 s: an answer is immediate. */
  double left = c->r->deadline_ns ? ((double)c->r->deadline_ns - (double)now_ns()) / 1e9 : 15;
  int wait_ms = left > 15 ? 15000 : left < 1 ? 1000 : (int)(left * 1000);
  struct pollfd pfd = {.fd = p[0], .events = POLLIN};
  int pr;
  while ((pr = poll(&pfd, 1, wait_ms)) < 0 && errno == EINTR) {
  }
  int res = -1;
  ssize_t got = pr > 0 ? read(p[0], &res, sizeof res) : 0; /* 0 at EOF: the child died */
  close(p[0]);
  if (pr == 0) {
    kill(pid, SIGKILL);
    waitpid_r(pid, NULL, 0);
    return fail(c, "init in a child forked after the plugin was loaded did not return within %d s: a worker process "
                   "that calls NCCL hangs (a Go plugin's runtime does not run in a forked child: refuse there)",
                wait_ms / 1000);
  }
  int st = 0;
  waitpid_r(pid, &st, 0);
  if (got != (ssize_t)sizeof res) return fail(c, "the forked child died in init (%s)", wait_status_str(st, c->note, sizeof c->note));
  snprintf(c->note, sizeof c->note, "(the child's init returned %s)", result_str((ncclResult_t)res));
  return 0;
}

/* ------------------------------------------------------------ host signals */

/* The process is NCCL's host's, and so are its signals. The Go runtime inside
 * the plugin keeps handlers the host installed before loading it (it only adds
 * SA_ONSTACK) and forwards faults in non-Go code to the host's handler; a
 * plugin that called signal.Notify, or installed a handler of its own, would
 * take the host's SIGTERM (torchrun's shutdown) or SIGCHLD (Python's
 * subprocess) away. conf_rank installs these handlers before it loads the
 * plugin; host-signals checks they still run, on every thread of the process
 * (a signal sent to the process lands on any thread, the runtime's included),
 * and that a fault in C code still reaches the host's SIGSEGV handler. */
static const int HOST_SIGS[] = {SIGUSR1, SIGUSR2, SIGHUP, SIGCHLD, SIGTERM};
#define NHOST_SIGS ((int)(sizeof HOST_SIGS / sizeof HOST_SIGS[0]))
static atomic_int g_host_sig_count[NSIG];
static atomic_int g_host_sig_tid[NSIG];
static sigjmp_buf g_segv_jmp;
static volatile sig_atomic_t g_segv_expected;
static volatile uintptr_t g_bad_addr = 8; /* volatile: the compiler cannot see it fault */

static void host_sig_handler(int sig) {
  atomic_store(&g_host_sig_tid[sig], (int)syscall(SYS_gettid));
  atomic_fetch_add(&g_host_sig_count[sig], 1);
}

static void host_segv_handler(int sig) {
  if (g_segv_expected) {
    g_segv_expected = 0;
    siglongjmp(g_segv_jmp, 1);
  }
  /* A real crash: die of it, as without this handler. */
  signal(sig, SIG_DFL);
  raise(sig);
}

static void install_host_handlers(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sigemptyset(&sa.sa_mask);
  sa.sa_handler = host_sig_handler;
  sa.sa_flags = SA_RESTART; /* no SA_ONSTACK: many hosts do not set it */
  for (int i = 0; i < NHOST_SIGS; i++) sigaction(HOST_SIGS[i], &sa, NULL);
  sa.sa_handler = host_segv_handler;
  sa.sa_flags = SA_NODEFER;
  sigaction(SIGSEGV, &sa, NULL);
}

static void restore_default_handlers(void) {
  for (int i = 0; i < NHOST_SIGS; i++) signal(HOST_SIGS[i], SIG_DFL);
  signal(SIGSEGV, SIG_DFL);
}

static int wait_host_sig(int sig, int before) {
  uint64_t t0 = now_ns();
  while (atomic_load(&g_host_sig_count[sig]) == before) {
    if (ms_since(t0) > 2000.0 * g_time_scale) return -1;
    sleep_ms(1);
  }
  return 0;
}

static int chk_host_signals(conf_t* c) {
  int rv = 0;
  for (int i = 0; i < NHOST_SIGS && rv == 0; i++) {
    struct sigaction cur;
    sigaction(HOST_SIGS[i], NULL, &cur);
    if (cur.sa_handler != host_sig_handler)
      rv = fail(c, "the host's %s handler, installed before dlopen, was replaced after init (signal.Notify or a handler of the plugin's own?)",
                strsignal(HOST_SIGS[i]));
  }
  /* Every thread, by id: the runtime's threads as well as this one. */
  pid_t me = (pid_t)syscall(SYS_gettid), pid = getpid();
  int threads = 0, others = 0;
  DIR* d = rv == 0 ? opendir("/proc/self/task") : NULL;
  if (rv == 0 && d == NULL) rv = fail(c, "cannot list /proc/self/task: %s", strerror(errno));
  for (struct dirent* e; rv == 0 && d != NULL && (e = readdir(d)) != NULL;) {
    if (e->d_name[0] == '.') continue;
    pid_t tid = (pid_t)atoi(e->d_name);
    threads++;
    others += tid != me;
    for (int i = 0; i < NHOST_SIGS && rv == 0; i++) {
      int sig = HOST_SIGS[i], before = atomic_load(&g_host_sig_count[sig]);
      if (syscall(SYS_tgkill, pid, tid, sig) != 0) {
        if (errno == ESRCH) break; /* the thread has exited meanwhile */
        rv = fail(c, "tgkill(%d, %s): %s", (int)tid, strsignal(sig), strerror(errno));
      } else if (wait_host_sig(sig, before) != 0) {
        rv = fail(c, "%s sent to thread %d (of %s) did not run the host's handler within 2 s: the plugin's threads block or take the host's signals",
                  strsignal(sig), (int)tid, tid == me ? "the caller" : "the plugin's threads");
      } else if (atomic_load(&g_host_sig_tid[sig]) != (int)tid) {
        rv = fail(c, "%s sent to thread %d ran the host's handler on thread %d", strsignal(sig), (int)tid,
                  atomic_load(&g_host_sig_tid[sig]));
      }
    }
  }
  if (d) closedir(d);
  if (rv == 0) {
    /* A fault in the host's own code after the runtime started: the runtime
     * must hand it to the host's handler, not treat it as its own. */
    if (sigsetjmp(g_segv_jmp, 1) == 0) {
      g_segv_expected = 1;
      *(volatile int*)g_bad_addr = 1;
      g_segv_expected = 0;
      rv = fail(c, "a write to address 8 did not fault");
    }
  }
  restore_default_handlers();
  /* A plugin that starts no thread (a C one may not) leaves only the caller to
   * check: that is no failure. */
  if (rv == 0 && others == 0)
    snprintf(c->note, sizeof c->note, "(%d signals on the only thread, the plugin started none; SIGSEGV forwarded)", NHOST_SIGS);
  else if (rv == 0)
    snprintf(c->note, sizeof c->note, "(%d signals on each of %d threads; SIGSEGV forwarded)", NHOST_SIGS, threads);
  return rv;
}

static const check_t CHECKS[] = {
    {"load", chk_load, 8, F_NOSETUP},
    {"makeVDevice-before-init", chk_vdevice_before_init, 9, F_NOSETUP},
    {"init", chk_init, 8, F_NOSETUP},
    {"devices", chk_devices, 8, 0},
    {"getProperties", chk_props, 8, 0},
    {"getProperties-invalid-dev", chk_props_invalid, 8, 0},
    {"makeVDevice-bad-ndevs", chk_vdevice_bad, 9, 0},
    {"connect-accept-nonblocking", chk_nonblocking, 8, 0},
    {"connect-accept-null-devcomm", chk_null_devptr, 8, 0},
    {"regMr", chk_regmr, 8, 0},
    {"request-marker-0x1", chk_marker, 8, 0},
    {"message-sizes", chk_sizes, 8, 0},
    {"message-1GiB", chk_1gib, 8, F_NEWEST},
    {"recv-larger-than-send", chk_recv_larger, 8, 0},
    {"send-larger-than-recv", chk_truncate, 8, 0},
    {"test-sizes-null", chk_sizes_null, 8, 0},
    {"requests-in-flight", chk_inflight, 8, 0},
    {"grouped-recv", chk_grouped, 8, 0},
    {"fifo-order", chk_fifo, 8, 0},
    {"bidirectional", chk_bidir, 8, 0},
    {"multi-comm", chk_multicomm, 8, 0},
    {"host-signals", chk_host_signals, 8, 0},
    {"iflush", chk_iflush, 8, 0},
    {"profiler-events", chk_profiler, 10, 0},
    {"close-outstanding-reconnect", chk_close_outstanding, 8, 0},
    {"peer-closed", chk_peer_closed, 8, 0},
    {"peer-killed", chk_peer_killed, 8, F_NOSYNC},
    {"finalize", chk_finalize, 11, F_SOLO0},
    {"fork-child-init", chk_fork_child_init, 8, F_SOLO0 | F_NOSETUP},
};
#define NCHECKS ((int)(sizeof CHECKS / sizeof CHECKS[0]))

static bool applies(const conf_arg_t* a, int i) {
  const check_t* k = &a->checks[i];
  if (a->version < k->minver) return false;
  if ((k->flags & F_NEWEST) && !a->with_1g) return false;
  if (a->only) {
    size_t nl = strlen(k->name);
    for (const char* p = a->only; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
      if (!strncmp(p, k->name, nl) && (p[nl] == ',' || p[nl] == 0)) return true;
    return false;
  }
  return true;
}

static int conf_rank(rank_t* r, void* arg) {
  conf_arg_t* a = arg;
  conf_t c = {.r = r, .version = a->version, .path = a->path};
  shm_t* s = r->shm;
  install_host_handlers(); /* before the plugin is loaded, as a host would */
  for (int i = a->first; i < a->nchecks; i++) {
    if (!applies(a, i)) continue;
    const check_t* k = &a->checks[i];
    check_result_t* res = &s->res[r->rank][i];
    if ((k->flags & F_SOLO0) && r->rank != 0) {
      atomic_store(&res->state, RES_NA);
      continue;
    }
    r->check = i;
    atomic_store(&s->cur_start_ns[r->rank], now_ns());
    atomic_store(&s->cur[r->rank], i);
    atomic_store(&res->state, RES_RUNNING);
    /* Internal waits give up before the parent's watchdog, so a slow plugin
     * gets a precise message rather than "hung". */
    r->deadline_ns = now_ns() + (uint64_t)(rank_budget(r->timeout) * 1e9);
    c.why[0] = 0;
    c.note[0] = 0;
    c.secondary = false;
    int rc = 0, setup_rc = 0;
    if (!(k->flags & F_NOSETUP)) rc = setup_rc = do_setup(&c);
    if (rc == 0) rc = k->fn(&c);
    if (rc != 0) {
      atomic_store(&s->abort_check[r->rank], i);
      snprintf(res->why, WHY_LEN, "%s", c.why[0] ? c.why : "failed (no reason recorded)");
      atomic_store(&res->secondary, c.secondary ? 1 : 0);
      atomic_store(&res->state, RES_FAIL);
    } else {
      snprintf(res->why, WHY_LEN, "%s", c.note);
      atomic_store(&res->state, RES_PASS);
    }
    if (!(k->flags & (F_NOSYNC | F_SOLO0))) {
      set_where(r, "end-of-check handshake");
      /* Wait as long as the other rank may still legitimately be in this
       * check (its deadline, a few seconds of skew), at least 15 s: with a
       * fixed 15 s, a rank still working on a slow but passing check was left
       * behind, and its END frame then failed the next check on both sides. */
      double left = r->timeout - (double)(now_ns() - atomic_load(&s->cur_start_ns[r->rank])) / 1e9 + 5;
      ctl_end_check(r, i, left > 15 ? left : 15);
    }
    atomic_store(&s->cur[r->rank], -1);
    r->check = -1;
    /* Without setup nothing else can run; report it once, not per check. */
    if ((rc != 0 && i == 0) || setup_rc != 0) {
      atomic_store(&s->fatal[r->rank], i + 1);
      break;
    }
  }
  return 0;
}

/* Prints one check's outcome from both ranks' results. Returns 1 pass, 0 fail. */
static int report(const conf_arg_t* a, shm_t* s, int i, const char* override) {
  const check_t* k = &a->checks[i];
  if (override) {
    printf("FAIL v%d %s: %s\n", a->version, k->name, override);
    return 0;
  }
  char why[2 * WHY_LEN + 64] = "";
  int failed = 0, prim = 0;
  for (int rk = 0; rk < 2; rk++)
    if (atomic_load(&s->res[rk][i].state) == RES_FAIL && !atomic_load(&s->res[rk][i].secondary)) prim++;
  bool same = atomic_load(&s->res[0][i].state) == RES_FAIL && atomic_load(&s->res[1][i].state) == RES_FAIL &&
              !strcmp(s->res[0][i].why, s->res[1][i].why);
  for (int rk = 0; rk < 2; rk++) {
    check_result_t* x = &s->res[rk][i];
    if (atomic_load(&x->state) != RES_FAIL) continue;
    failed = 1;
    if (prim && atomic_load(&x->secondary)) continue;
    if (same) { /* both ranks saw the same thing: say it once */
      snprintf(why, sizeof why, "%s", x->why);
      break;
    }
    size_t n = strlen(why);
    snprintf(why + n, sizeof why - n, "%s[rank %d] %s", n ? "; " : "", rk, x->why);
  }
  if (failed) {
    printf("FAIL v%d %s: %s\n", a->version, k->name, why);
    return 0;
  }
  const char* note = s->res[0][i].why[0] ? s->res[0][i].why : s->res[1][i].why;
  printf("PASS v%d %s%s%s\n", a->version, k->name, note[0] ? " " : "", note);
  return 1;
}

static bool settled(const conf_arg_t* a, shm_t* s, int i) {
  int s0 = atomic_load(&s->res[0][i].state), s1 = atomic_load(&s->res[1][i].state);
  bool f0 = s0 >= RES_PASS, f1 = s1 >= RES_PASS;
  if (a->checks[i].flags & F_SOLO0) return f0;
  return f0 && f1;
}

static void read_time_scale(void) {
  const char* v = getenv("NCCLNET_HARNESS_TIME_SCALE");
  if (v == NULL || *v == 0) return;
  if (parse_in_range(v, 1.0, 50.0, &g_time_scale) != 0)
    fprintf(stderr, "ncclnet-harness: ignoring NCCLNET_HARNESS_TIME_SCALE=%s (expected a number from 1 to 50)\n", v);
}

int cmd_conformance(const opts_t* o) {
  read_time_scale();
  setvbuf(stdout, NULL, _IOLBF, 0);
  shm_t* s = shm_create();
  if (s == NULL) {
    fprintf(stderr, "ncclnet-harness: cannot map shared memory\n");
    return 2;
  }
  if (o->only) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", o->only);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
      int found = 0;
      for (int i = 0; i < NCHECKS; i++) found |= !strcmp(CHECKS[i].name, t);
      if (!found) {
        fprintf(stderr, "ncclnet-harness: --only: no check named \"%s\"; checks are:", t);
        for (int i = 0; i < NCHECKS; i++) fprintf(stderr, " %s", CHECKS[i].name);
        fprintf(stderr, "\n");
        return 2;
      }
    }
  }
  int newest = 0;
  for (int v = 0; v < o->nversions; v++) newest = o->versions[v] > newest ? o->versions[v] : newest;
  uint64_t avail = mem_available();
  bool mem_ok = avail == 0 || avail >= (3ull << 30);
  if (!mem_ok)
    fprintf(stderr, "note: message-1GiB not run: only %.1f GiB of memory available (needs 3)\n", (double)avail / (1 << 30));
  int passed = 0, failed = 0;
  for (int vi = 0; vi < o->nversions; vi++) {
    conf_arg_t a = {.path = o->plugin, .only = o->only, .version = o->versions[vi], .first = 0, .checks = CHECKS, .nchecks = NCHECKS,
                    .with_1g = o->versions[vi] == newest && mem_ok};
    while (a.first < NCHECKS) {
      memset(s->res, 0, sizeof s->res);
      pair_outcome_t out;
      if (run_pair(s, conf_rank, &a, o->timeout > 0 ? o->timeout : 60, 0, &out) != 0) return 2;
      int next = NCHECKS;
      for (int i = a.first; i < NCHECKS; i++) {
        if (!applies(&a, i)) continue;
        if (settled(&a, s, i)) {
          if (report(&a, s, i, NULL)) passed++;
          else failed++;
          if (atomic_load(&s->fatal[0]) == i + 1 || atomic_load(&s->fatal[1]) == i + 1) {
            /* Setup failed: nothing later can run in this version. */
            for (int j = i + 1; j < NCHECKS; j++)
              if (applies(&a, j) && !settled(&a, s, j)) {
                report(&a, s, j, "not run: the plugin could not be set up (see the first failure of this version)");
                failed++;
              }
            next = -1;
            break;
          }
          continue;
        }
        /* The pair stopped inside check i. */
        char why[WHY_LEN + WHERE_LEN + 128], st[96];
        if (out.hung) {
          snprintf(why, sizeof why, "hung: rank %d still inside \"%s\" after %.0f s (both ranks killed)", out.hung_rank,
                   out.hung_where, out.hung_after);
        } else {
          int rk = -1;
          for (int q = 0; q < 2; q++)
            if (out.exited[q] && !(WIFEXITED(out.status[q]) && WEXITSTATUS(out.status[q]) == 0) &&
                !atomic_load(&s->expect_death[q]))
              rk = q;
          if (rk >= 0)
            snprintf(why, sizeof why, "rank %d %s inside \"%s\"", rk, wait_status_str(out.status[rk], st, sizeof st),
                     s->where[rk]);
          else
            snprintf(why, sizeof why, "a rank ended before finishing this check (last step \"%s\" / \"%s\")", s->where[0],
                     s->where[1]);
        }
        report(&a, s, i, why);
        failed++;
        next = i + 1;
        break;
      }
      if (next < 0) break;
      a.first = next;
    }
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
