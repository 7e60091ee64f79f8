/*
 * netapi.c: loads a plugin the way NCCL's loader does and gives the rest of the
 * harness one call per entry point whatever the API version (int vs size_t
 * sizes, v10's connect config and profiler, v11+'s per-communicator ctx).
 * Also the logger and profiler callbacks handed to init().
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "harness.h"

/* The entries below sit at the same offset with the same signature in every
 * version, so they are called through the v8 view of the table. */
#define SAME_OFF(f)                                                                                   \
  _Static_assert(offsetof(ncclNet_v8_t, f) == offsetof(ncclNet_v9_t, f) &&                            \
                     offsetof(ncclNet_v8_t, f) == offsetof(ncclNet_v10_t, f) &&                       \
                     offsetof(ncclNet_v8_t, f) == offsetof(ncclNet_v11_t, f) &&                       \
                     offsetof(ncclNet_v8_t, f) == offsetof(ncclNet_v12_t, f),                         \
                 #f " moves between versions")
SAME_OFF(devices);
SAME_OFF(accept);
SAME_OFF(regMr);
SAME_OFF(deregMr);
SAME_OFF(iflush);
SAME_OFF(test);
SAME_OFF(closeSend);
SAME_OFF(closeRecv);
SAME_OFF(closeListen);

#define V8(n) ((const ncclNet_v8_t*)(n)->table)
#define V9(n) ((const ncclNet_v9_t*)(n)->table)
#define V10(n) ((const ncclNet_v10_t*)(n)->table)
#define V11(n) ((const ncclNet_v11_t*)(n)->table)
#define V12(n) ((const ncclNet_v12_t*)(n)->table)

/* ------------------------------------------------------------------ logger */

atomic_int g_warns;
atomic_int g_infos;
int g_rank = -1;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char last_warn[512];
static char transport[64];
static int log_level = -1;

/* Mirrors NCCL_DEBUG filtering, except that WARNs show when it is unset: a
 * harness run should always let a reader see what the plugin complained about
 * (stderr; stdout carries only results). NCCL_DEBUG=VERSION silences them. */
static int debug_level(void) {
  if (log_level >= 0) return log_level;
  const char* v = getenv("NCCL_DEBUG");
  int l = NCCL_LOG_WARN;
  if (v != NULL) {
    if (!strcasecmp(v, "VERSION")) l = NCCL_LOG_VERSION;
    else if (!strcasecmp(v, "WARN")) l = NCCL_LOG_WARN;
    else if (!strcasecmp(v, "INFO")) l = NCCL_LOG_INFO;
    else if (!strcasecmp(v, "TRACE")) l = NCCL_LOG_TRACE;
    else if (!strcasecmp(v, "ABORT")) l = NCCL_LOG_ABORT;
  }
  log_level = l;
  return l;
}

void harness_logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags;
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt ? fmt : "(null format)", ap);
  va_end(ap);
  if (level == NCCL_LOG_WARN) atomic_fetch_add(&g_warns, 1);
  if (level == NCCL_LOG_INFO) atomic_fetch_add(&g_infos, 1);
  pthread_mutex_lock(&log_mu);
  if (level == NCCL_LOG_WARN) {
    /* keep the start of long messages: that is where the reason is */
    size_t k = strnlen(msg, sizeof last_warn - 1);
    memcpy(last_warn, msg, k);
    last_warn[k] = 0;
  }
  if (level == NCCL_LOG_INFO) {
    /* the plugin's init line: "..., NCCL net API vN, transport <name>, ..." (a
     * fallback note such as "transport ib unavailable" must not match) */
    const char* t = strstr(msg, ", transport ");
    if (t != NULL) {
      t += strlen(", transport ");
      size_t k = 0;
      while (t[k] && (isalnum((unsigned char)t[k]) || t[k] == '-' || t[k] == '_') && k + 1 < sizeof transport) {
        transport[k] = t[k];
        k++;
      }
      transport[k] = 0;
    }
  }
  int show = (level == NCCL_LOG_WARN && debug_level() >= NCCL_LOG_WARN) ||
             (level != NCCL_LOG_WARN && level != NCCL_LOG_ABORT && (int)level <= debug_level() &&
              debug_level() != NCCL_LOG_ABORT);
  if (show) {
    const char* lv = level == NCCL_LOG_WARN ? "WARN" : level == NCCL_LOG_INFO ? "INFO" : "TRACE";
    fprintf(stderr, "[rank %d] NCCL %s %s (%s:%d)\n", g_rank, lv, msg, file ? file : "?", line);
  }
  pthread_mutex_unlock(&log_mu);
}

int harness_last_warn(char* out, size_t outlen) {
  pthread_mutex_lock(&log_mu);
  int n = snprintf(out, outlen, "%s", last_warn);
  pthread_mutex_unlock(&log_mu);
  return n;
}

void harness_transport_name(char* out, size_t outlen) {
  pthread_mutex_lock(&log_mu);
  snprintf(out, outlen, "%s", transport);
  pthread_mutex_unlock(&log_mu);
}

/* ---------------------------------------------------------------- profiler */

#define MAX_EVENTS 65536
typedef struct {
  void* phandle;
  int stopped;
} prof_event_t;
prof_counts_t g_prof;
static prof_event_t events[MAX_EVENTS];
static int nevents;
static pthread_mutex_t prof_mu = PTHREAD_MUTEX_INITIALIZER;

void prof_reset(void) {
  pthread_mutex_lock(&prof_mu);
  nevents = 0;
  atomic_store(&g_prof.starts, 0);
  atomic_store(&g_prof.null_starts, 0);
  atomic_store(&g_prof.stops, 0);
  atomic_store(&g_prof.double_stops, 0);
  atomic_store(&g_prof.unknown_stops, 0);
  pthread_mutex_unlock(&prof_mu);
}

int prof_events_for(void* p, int* open) {
  int n = 0, o = 0;
  pthread_mutex_lock(&prof_mu);
  for (int i = 0; i < nevents; i++) {
    if (events[i].phandle == p) {
      n++;
      if (!events[i].stopped) o++;
    }
  }
  pthread_mutex_unlock(&prof_mu);
  if (open) *open = o;
  return n;
}

/* Behaves like NCCL core: Start creates an event and returns its handle in
 * *eHandle; Stop finds the event through *eHandle. */
ncclResult_t harness_profiler(void** eHandle, int type, void* pHandle, int64_t pluginId, void* extData) {
  (void)pluginId;
  (void)extData;
  if (eHandle == NULL) return ncclInvalidArgument;
  ncclResult_t ret = ncclSuccess;
  pthread_mutex_lock(&prof_mu);
  if (type == ncclProfilerNetEventStart) {
    if (pHandle == NULL) {
      /* NCCL creates no event without a parent; record the violation. */
      atomic_fetch_add(&g_prof.null_starts, 1);
      *eHandle = NULL;
    } else if (nevents < MAX_EVENTS) {
      events[nevents].phandle = pHandle;
      events[nevents].stopped = 0;
      *eHandle = &events[nevents];
      nevents++;
      atomic_fetch_add(&g_prof.starts, 1);
    } else {
      *eHandle = NULL;
    }
  } else if (type == ncclProfilerNetEventStop || type == ncclProfilerNetEventUpdateAndStop) {
    prof_event_t* e = *eHandle;
    if (e == NULL || e < events || e >= events + nevents) {
      atomic_fetch_add(&g_prof.unknown_stops, 1);
      ret = ncclInvalidArgument;
    } else if (e->stopped) {
      atomic_fetch_add(&g_prof.double_stops, 1);
    } else {
      e->stopped = 1;
      atomic_fetch_add(&g_prof.stops, 1);
    }
  }
  pthread_mutex_unlock(&prof_mu);
  return ret;
}

/* ------------------------------------------------------------------ loader */

int net_load(net_t* n, const char* path, int version, char* err, size_t errlen) {
  memset(n, 0, sizeof *n);
  n->version = version;
  /* NCCL filters log levels itself, but plugins may skip formatting what
   * NCCL_DEBUG would drop; ask for INFO so the init line (which names the
   * transport) reaches us, and keep filtering display by the user's level. */
  if (debug_level() < NCCL_LOG_INFO) setenv("NCCL_DEBUG", "INFO", 1);
  n->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (n->dl == NULL) {
    snprintf(err, errlen, "dlopen(%s) failed: %s", path, dlerror());
    return -1;
  }
  char sym[32];
  snprintf(sym, sizeof sym, "ncclNetPlugin_v%d", version);
  n->table = dlsym(n->dl, sym);
  if (n->table == NULL) {
    snprintf(err, errlen, "%s does not export %s", path, sym);
    return -1;
  }
  n->name = V8(n)->name;
  return 0;
}

int net_probe_versions(const char* path, char* err, size_t errlen) {
  void* dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (dl == NULL) {
    snprintf(err, errlen, "dlopen(%s) failed: %s", path, dlerror());
    return -1;
  }
  int mask = 0;
  for (int v = HARNESS_MIN_VERSION; v <= HARNESS_MAX_VERSION; v++) {
    char sym[32];
    snprintf(sym, sizeof sym, "ncclNetPlugin_v%d", v);
    if (dlsym(dl, sym) != NULL) mask |= 1 << v;
  }
  return mask;
}

const char* net_missing_entry(const net_t* n) {
  const ncclNet_v8_t* t = V8(n);
  if (t->name == NULL) return "name";
  if (t->init == NULL) return "init";
  if (t->devices == NULL) return "devices";
  if (t->getProperties == NULL) return "getProperties";
  if (t->listen == NULL) return "listen";
  if (t->connect == NULL) return "connect";
  if (t->accept == NULL) return "accept";
  if (t->regMr == NULL) return "regMr";
  if (t->deregMr == NULL) return "deregMr";
  if (t->isend == NULL) return "isend";
  if (t->irecv == NULL) return "irecv";
  if (t->test == NULL) return "test";
  if (t->closeSend == NULL) return "closeSend";
  if (t->closeRecv == NULL) return "closeRecv";
  if (t->closeListen == NULL) return "closeListen";
  if (n->version >= 11 && V11(n)->finalize == NULL) return "finalize (NCCL calls it unconditionally from v11)";
  return "";
}

/* --------------------------------------------------------------- wrappers */

/* What NCCL hands over when no profiler plugin is loaded: a callback that
 * creates no event. */
static ncclResult_t noop_profiler(void** eHandle, int type, void* pHandle, int64_t pluginId, void* extData) {
  (void)type;
  (void)pHandle;
  (void)pluginId;
  (void)extData;
  if (eHandle) *eHandle = NULL;
  return ncclSuccess;
}

ncclResult_t net_init(net_t* n, void** ctx, uint64_t commId, bool with_profiler) {
  return net_init_with(n, ctx, commId, with_profiler ? harness_profiler : noop_profiler);
}

ncclResult_t net_init_with(net_t* n, void** ctx, uint64_t commId, ncclProfilerCallback_t prof) {
  switch (n->version) {
    case 8: *ctx = NULL; return V8(n)->init(harness_logger);
    case 9: *ctx = NULL; return V9(n)->init(harness_logger);
    case 10: *ctx = NULL; return V10(n)->init(harness_logger, prof);
    case 11: {
      ncclNetCommConfig_v11_t cfg = {NCCL_NET_TRAFFIC_CLASS_UNDEF};
      return V11(n)->init(ctx, commId, &cfg, harness_logger, prof);
    }
    default: {
      ncclNetCommConfig_v12_t cfg = {NCCL_NET_TRAFFIC_CLASS_UNDEF};
      return V12(n)->init(ctx, commId, &cfg, harness_logger, prof);
    }
  }
}

ncclResult_t net_finalize(net_t* n, void* ctx) {
  if (n->version < 11) return ncclSuccess;
  return V11(n)->finalize(ctx);
}

ncclResult_t net_devices(net_t* n, int* ndev) { return V8(n)->devices(ndev); }

size_t net_props_size(int version) {
  switch (version) {
    case 8: return sizeof(ncclNetProperties_v8_t);
    case 9: return sizeof(ncclNetProperties_v9_t);
    case 10: return sizeof(ncclNetProperties_v10_t);
    case 11: return sizeof(ncclNetProperties_v11_t);
    default: return sizeof(ncclNetProperties_v12_t);
  }
}

ncclResult_t net_props_raw(net_t* n, int dev, void* raw) {
  switch (n->version) {
    case 8: return V8(n)->getProperties(dev, raw);
    case 9: return V9(n)->getProperties(dev, raw);
    case 10: return V10(n)->getProperties(dev, raw);
    case 11: return V11(n)->getProperties(dev, raw);
    default: return V12(n)->getProperties(dev, raw);
  }
}

#define COMMON_PROPS(dst, src)                   \
  do {                                           \
    (dst)->name = (src)->name;                   \
    (dst)->pciPath = (src)->pciPath;             \
    (dst)->guid = (src)->guid;                   \
    (dst)->ptrSupport = (src)->ptrSupport;       \
    (dst)->regIsGlobal = (src)->regIsGlobal;     \
    (dst)->speed = (src)->speed;                 \
    (dst)->port = (src)->port;                   \
    (dst)->latency = (src)->latency;             \
    (dst)->maxComms = (src)->maxComms;           \
    (dst)->maxRecvs = (src)->maxRecvs;           \
    (dst)->netDeviceType = (src)->netDeviceType; \
    (dst)->netDeviceVersion = (src)->netDeviceVersion; \
  } while (0)

#define V9_PROPS(dst, src)                         \
  do {                                             \
    (dst)->forceFlush = (src)->forceFlush;         \
    (dst)->vndevs = (src)->vProps.ndevs;           \
    for (int i_ = 0; i_ < (int)(sizeof((src)->vProps.devs) / sizeof(int)); i_++) \
      (dst)->vdevs[i_] = (src)->vProps.devs[i_];   \
    (dst)->maxP2pBytes = (src)->maxP2pBytes;       \
    (dst)->maxCollBytes = (src)->maxCollBytes;     \
  } while (0)

/* Converts into hprops_t, filling fields the version lacks with what NCCL's
 * adapters would assume (v8: 1 GiB max message, maxRecvs as given, etc.). */
typedef union {
  ncclNetProperties_v8_t v8;
  ncclNetProperties_v9_t v9;
  ncclNetProperties_v11_t v11;
  ncclNetProperties_v12_t v12;
} props_u;

ncclResult_t net_props(net_t* n, int dev, hprops_t* p) {
  props_u u;
  memset(&u, 0, sizeof u);
  ncclResult_t r = net_props_raw(n, dev, &u);
  if (r != ncclSuccess) return r;
  net_props_convert(n->version, dev, &u, p);
  return ncclSuccess;
}

void net_props_convert(int version, int dev, const void* raw, hprops_t* p) {
  props_u u;
  memcpy(&u, raw, net_props_size(version));
  memset(p, 0, sizeof *p);
  p->maxMultiRequestSize = 1;
  p->railId = p->planeId = -1;
  switch (version) {
    case 8:
      COMMON_PROPS(p, &u.v8);
      p->vndevs = 1;
      p->vdevs[0] = dev;
      p->maxP2pBytes = NCCL_MAX_NET_SIZE;
      p->maxCollBytes = MAX_COLLNET_SIZE;
      break;
    case 9:
    case 10:
      COMMON_PROPS(p, &u.v9);
      V9_PROPS(p, &u.v9);
      break;
    case 11:
      COMMON_PROPS(p, &u.v11);
      V9_PROPS(p, &u.v11);
      p->maxMultiRequestSize = u.v11.maxMultiRequestSize;
      break;
    default:
      COMMON_PROPS(p, &u.v12);
      V9_PROPS(p, &u.v12);
      p->maxMultiRequestSize = u.v12.maxMultiRequestSize;
      p->railId = u.v12.railId;
      p->planeId = u.v12.planeId;
      break;
  }
}

ncclResult_t net_listen(net_t* n, int dev, void* handle, void** lc) {
  if (n->version >= 11) return V11(n)->listen(n->ctx, dev, handle, lc);
  return V8(n)->listen(dev, handle, lc);
}

ncclResult_t net_connect(net_t* n, int dev, ncclNetCommConfig_v10_t* cfg, void* handle, void** sc,
                         ncclNetDeviceHandle_v8_t** dh) {
  switch (n->version) {
    case 8: return V8(n)->connect(dev, handle, sc, dh);
    case 9: return V9(n)->connect(dev, handle, sc, dh);
    case 10: return V10(n)->connect(dev, cfg, handle, sc, dh);
    case 11: return V11(n)->connect(n->ctx, dev, handle, sc, dh);
    default: return V12(n)->connect(n->ctx, dev, handle, sc, dh);
  }
}

ncclResult_t net_accept(net_t* n, void* lc, void** rc, ncclNetDeviceHandle_v8_t** dh) {
  return V8(n)->accept(lc, rc, dh);
}

ncclResult_t net_regmr(net_t* n, void* comm, void* data, size_t size, int type, void** mh) {
  return V8(n)->regMr(comm, data, size, type, mh);
}

ncclResult_t net_deregmr(net_t* n, void* comm, void* mh) { return V8(n)->deregMr(comm, mh); }

ncclResult_t net_isend(net_t* n, void* sc, void* data, size_t size, int tag, void* mh, void* ph, void** req) {
  switch (n->version) {
    case 8:
      /* NCCL's v8 adapter refuses anything above 1 GiB before the plugin sees it. */
      if (size > NCCL_MAX_NET_SIZE) return ncclInternalError;
      return V8(n)->isend(sc, data, (int)size, tag, mh, req);
    case 9: return V9(n)->isend(sc, data, size, tag, mh, req);
    default: return V10(n)->isend(sc, data, size, tag, mh, ph, req);
  }
}

ncclResult_t net_irecv(net_t* n, void* rc, int nr, void** data, size_t* sizes, int* tags, void** mhs, void** phs,
                       void** req) {
  switch (n->version) {
    case 8: {
      int isz[64];
      if (nr > 64) return ncclInternalError;
      for (int i = 0; i < nr; i++) {
        if (sizes[i] > NCCL_MAX_NET_SIZE) return ncclInternalError;
        isz[i] = (int)sizes[i];
      }
      return V8(n)->irecv(rc, nr, data, isz, tags, mhs, req);
    }
    case 9: return V9(n)->irecv(rc, nr, data, sizes, tags, mhs, req);
    default: return V10(n)->irecv(rc, nr, data, sizes, tags, mhs, phs, req);
  }
}

ncclResult_t net_iflush(net_t* n, void* rc, int nr, void** data, int* sizes, void** mhs, void** req) {
  if (V8(n)->iflush == NULL) {
    *req = NULL;
    return ncclSuccess;
  }
  return V8(n)->iflush(rc, nr, data, sizes, mhs, req);
}

ncclResult_t net_test(net_t* n, void* req, int* done, int* sizes) { return V8(n)->test(req, done, sizes); }

size_t net_vdevice_props_size(int version) {
  if (version < 9) return 0;
  return version >= 12 ? sizeof(ncclNetVDeviceProps_v12_t) : sizeof(ncclNetVDeviceProps_v9_t);
}
int net_vdevice_max_devs(int version) {
  if (version < 9) return 0;
  return version >= 12 ? NCCL_NET_MAX_DEVS_PER_NIC_V12 : NCCL_NET_MAX_DEVS_PER_NIC_V9;
}
bool net_has_make_vdevice(const net_t* n) {
  switch (n->version) {
    case 8: return false;
    case 9: return V9(n)->makeVDevice != NULL;
    case 10: return V10(n)->makeVDevice != NULL;
    case 11: return V11(n)->makeVDevice != NULL;
    default: return V12(n)->makeVDevice != NULL;
  }
}
ncclResult_t net_make_vdevice(net_t* n, int* d, void* props) {
  if (!net_has_make_vdevice(n)) return ncclInternalError;
  switch (n->version) {
    case 9: return V9(n)->makeVDevice(d, props);
    case 10: return V10(n)->makeVDevice(d, props);
    case 11: return V11(n)->makeVDevice(d, props);
    default: return V12(n)->makeVDevice(d, props);
  }
}
ncclResult_t net_close_send(net_t* n, void* sc) { return V8(n)->closeSend(sc); }
ncclResult_t net_close_recv(net_t* n, void* rc) { return V8(n)->closeRecv(rc); }
ncclResult_t net_close_listen(net_t* n, void* lc) { return V8(n)->closeListen(lc); }
