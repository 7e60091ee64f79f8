/*
 * tables.c: the exported NCCL net plugin tables and their per-version shims.
 *
 * NCCL dlsym()s the data objects ncclNetPlugin_v12 ... _v8 (highest first). Every
 * version is a thin adapter onto one set of Go entries (exports_cgo.go): integer
 * vs size_t sizes, v10's connect config and profiler, v11+'s per-communicator
 * init(ctx)/finalize. Handles are integers (uintptr_t) on the Go side.
 *
 * Build-time knobs (CGO_CFLAGS):
 *   NCCL_GO_PLUGIN_NAME   the name NCCL_NET matches (default "Go"); set by
 *                         scripts/build-plugin.sh --name for vendor builds.
 *                         The glue's own log lines then read "NET/<name> :".
 *   NCCL_GO_PLUGIN_LIB    the library's name in NCCL's log (the file field;
 *                         default "libnccl-net-go"), from --out.
 *   NCCL_GO_ONLY_V9_V10   export only ncclNetPlugin_v10 and _v9 (to exercise
 *                         NCCL's adapters for older plugins).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <unistd.h>
#include "shims.h"
#include "_cgo_export.h"

#ifndef NCCL_GO_PLUGIN_NAME
#define NCCL_GO_PLUGIN_NAME "Go"
#endif
#ifndef NCCL_GO_PLUGIN_LIB
#define NCCL_GO_PLUGIN_LIB "libnccl-net-go"
#endif

#define EXPORT __attribute__((visibility("default")))

/* ---- helpers called from Go ---- */

/* The glue writes its own lines as "NET/Go : ..."; in a vendor's library
 * (built with another --name) they carry that name instead, so that its users
 * see one plugin, not two. */
static const char gluePrefix[] = "NET/Go : ";

void ncclGoLog(ncclDebugLogger_t fn, int level, unsigned long flags, const char* msg) {
  const char* name = "";
  if (strcmp(NCCL_GO_PLUGIN_NAME, "Go") != 0 && strncmp(msg, gluePrefix, sizeof gluePrefix - 1) == 0) {
    name = NCCL_GO_PLUGIN_NAME;
    msg += sizeof gluePrefix - 1;
  }
  if (fn == NULL) {
    if (level == NCCL_LOG_WARN) fprintf(stderr, "NCCL WARN %s%s%s%s\n", name[0] ? "NET/" : "", name, name[0] ? " : " : "", msg);
    return;
  }
  if (name[0]) {
    fn((ncclDebugLogLevel)level, flags, NCCL_GO_PLUGIN_LIB, 0, "NET/%s : %s", name, msg);
  } else {
    fn((ncclDebugLogLevel)level, flags, NCCL_GO_PLUGIN_LIB, 0, "%s", msg);
  }
}

/* Event descriptor handed to NCCL's profiler as extData (docs/metrics.md). It is
 * valid only during the callback. */
typedef struct {
  uint8_t type;     /* 1 send, 2 recv, 3 flush */
  int32_t device;   /* plugin device index */
  uint64_t size;    /* bytes posted */
  int32_t tag;      /* NCCL tag (the sender's rank) */
  uint64_t request; /* the request handle returned to NCCL */
} ncclGoProfilerNetDesc_v1_t;

uintptr_t ncclGoProfStart(ncclProfilerCallback_t fn, uintptr_t phandle, int type, int dev, uint64_t size, int tag,
                          uintptr_t request) {
  void* event = NULL;
  ncclGoProfilerNetDesc_v1_t desc = {(uint8_t)type, dev, size, tag, request};
  if (fn(&event, ncclProfilerNetEventStart, (void*)phandle, NCCL_GO_PROF_PLUGIN_ID, &desc) != ncclSuccess) return 0;
  return (uintptr_t)event;
}

void ncclGoProfStop(ncclProfilerCallback_t fn, uintptr_t event) {
  void* e = (void*)event;
  if (e != NULL) fn(&e, ncclProfilerNetEventStop, NULL, NCCL_GO_PROF_PLUGIN_ID, NULL);
}

/* ---- a child forked from the process that loaded the library ----
 * The Go runtime does not run in a child forked (without exec) from a process
 * in which it runs: only the forking thread exists there, and the runtime
 * waits for threads that are gone. A call into Go from such a child blocks
 * forever as soon as it needs another goroutine or thread (init that starts
 * a transport, connect, accept, finalize). PyTorch forks DataLoader workers
 * and checkpoint writers after NCCL is up; none should call NCCL, but one
 * that does must get an error it can act on (NCCL falls back to its internal
 * transports when init fails), not a hang. So every call but the data path
 * and setNetAttr (NCCL's progress thread makes those, on comms and contexts
 * an init in this process made; they take no lock and start nothing) is
 * refused here, in C, before it enters Go. The pid is the library's at load
 * time: getpid() tells a forked child whatever created it (fork, clone). */
static pid_t loadPid;
static ncclDebugLogger_t forkLogFn; /* NCCL's logger, for calls that carry none */

__attribute__((constructor)) static void ncclGoRecordLoadPid(void) { loadPid = getpid(); }

/* ---- the host's address-space limit, before the Go runtime starts ----
 * The Go runtime reserves about 1 GiB of address space when the library is
 * loaded (page-allocator summaries, the heap arena map, thread stacks) and,
 * if RLIMIT_AS (ulimit -v) leaves less, exits the whole process with
 * "fatal error: failed to reserve page summary memory" or "out of memory
 * allocating heap arena map", which names no limit. Nothing can stop that
 * from here, but this constructor runs before the runtime's initialiser
 * (a prioritised .init_array entry comes first) and says what to change.
 * Measured: 840 MiB of room loaded and moved data, 735 MiB did not. */
#define NCCL_GO_AS_NEEDED (1ULL << 30)
__attribute__((constructor(101))) static void ncclGoAddressSpacePreflight(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return;
  unsigned long pages = 0;
  FILE* f = fopen("/proc/self/statm", "r");
  if (f != NULL) {
    if (fscanf(f, "%lu", &pages) != 1) pages = 0;
    fclose(f);
  }
  unsigned long long used = (unsigned long long)pages * (unsigned long long)sysconf(_SC_PAGESIZE);
  unsigned long long lim = (unsigned long long)rl.rlim_cur;
  if (lim > used && lim - used >= NCCL_GO_AS_NEEDED) return;
  fprintf(stderr,
          "NCCL WARN NET/Go : the address-space limit (ulimit -v, RLIMIT_AS) is %llu MiB and this process already maps "
          "%llu MiB; the Go runtime in %s.so needs about %llu MiB more and exits the process if it cannot reserve it "
          "(\"fatal error: failed to reserve page summary memory\"): raise or remove ulimit -v, or do not load this "
          "plugin (unset NCCL_NET_PLUGIN)\n",
          lim >> 20, used >> 20, NCCL_GO_PLUGIN_LIB, NCCL_GO_AS_NEEDED >> 20);
}

static int forkedChild(const char* call, ncclDebugLogger_t logFn) {
  pid_t pid = getpid();
  if (pid == loadPid) return 0;
  if (logFn == NULL) logFn = __atomic_load_n(&forkLogFn, __ATOMIC_RELAXED);
  char msg[512];
  snprintf(msg, sizeof msg,
           "NET/Go : %s failed: this process (pid %d) is a child forked from pid %d, which loaded the plugin; the Go "
           "runtime does not run in a forked child: create communicators in the parent, or start workers with the "
           "spawn or forkserver method (ncclInvalidUsage)",
           call, (int)pid, (int)loadPid);
  ncclGoLog(logFn, NCCL_LOG_WARN, ~0UL, msg);
  return 1;
}

/* For init: remembers NCCL's logger for the calls that carry none. */
static int forkedChildInit(ncclDebugLogger_t logFn) {
  if (logFn != NULL && getpid() == loadPid) __atomic_store_n(&forkLogFn, logFn, __ATOMIC_RELAXED);
  return forkedChild("init", logFn);
}

#define REFUSE_IN_FORKED_CHILD(call)                      \
  do {                                                    \
    if (forkedChild(call, NULL)) return ncclInvalidUsage; \
  } while (0)
#define REFUSE_INIT_IN_FORKED_CHILD(logFn)               \
  do {                                                   \
    if (forkedChildInit(logFn)) return ncclInvalidUsage; \
  } while (0)

/* ---- shims shared by all versions ---- */

static ncclResult_t s_devices(int* ndev) {
  REFUSE_IN_FORKED_CHILD("devices");
  return goNetDevices(ndev);
}
static ncclResult_t s_listen(int dev, void* handle, void** listenComm) {
  REFUSE_IN_FORKED_CHILD("listen");
  return goNetListen(0, dev, handle, (uintptr_t*)listenComm);
}
static ncclResult_t s_accept(void* listenComm, void** recvComm, ncclNetDeviceHandle_v8_t** recvDevComm) {
  (void)recvDevComm; /* host plugin: no device offload, leave NCCL's pointer alone */
  REFUSE_IN_FORKED_CHILD("accept");
  return goNetAccept((uintptr_t)listenComm, (uintptr_t*)recvComm);
}
static ncclResult_t s_regMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  REFUSE_IN_FORKED_CHILD("regMr");
  return goNetRegMr((uintptr_t)comm, data, size, type, (uintptr_t*)mhandle);
}
static ncclResult_t s_regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                                  void** mhandle) {
  REFUSE_IN_FORKED_CHILD("regMrDmaBuf");
  return goNetRegMrDmaBuf((uintptr_t)comm, data, size, type, offset, fd, (uintptr_t*)mhandle);
}
static ncclResult_t s_deregMr(void* comm, void* mhandle) {
  REFUSE_IN_FORKED_CHILD("deregMr");
  return goNetDeregMr((uintptr_t)comm, (uintptr_t)mhandle);
}
static ncclResult_t s_iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request) {
  return goNetIflush((uintptr_t)recvComm, n, data, sizes, (uintptr_t*)mhandles, (uintptr_t*)request);
}
static ncclResult_t s_test(void* request, int* done, int* sizes) {
  return goNetTest((uintptr_t)request, done, sizes);
}
static ncclResult_t s_closeSend(void* c) {
  REFUSE_IN_FORKED_CHILD("closeSend");
  return goNetClose((uintptr_t)c, NCCL_GO_TAG_SEND);
}
static ncclResult_t s_closeRecv(void* c) {
  REFUSE_IN_FORKED_CHILD("closeRecv");
  return goNetClose((uintptr_t)c, NCCL_GO_TAG_RECV);
}
static ncclResult_t s_closeListen(void* c) {
  REFUSE_IN_FORKED_CHILD("closeListen");
  return goNetClose((uintptr_t)c, NCCL_GO_TAG_LISTEN);
}

/* ---- v8 (NCCL 2.20-2.23): int sizes, init(logger) ---- */

static ncclResult_t v8_init(ncclDebugLogger_t logFn) {
  REFUSE_INIT_IN_FORKED_CHILD(logFn);
  return goNetInit(8, NULL, NCCL_NET_TRAFFIC_CLASS_UNDEF, logFn, NULL);
}
static ncclResult_t v8_getProperties(int dev, ncclNetProperties_v8_t* props) {
  REFUSE_IN_FORKED_CHILD("getProperties");
  return goNetGetProperties(8, dev, props);
}
static ncclResult_t v8_connect(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v8_t** sendDevComm) {
  (void)sendDevComm;
  REFUSE_IN_FORKED_CHILD("connect");
  return goNetConnect(0, dev, NCCL_NET_TRAFFIC_CLASS_UNDEF, handle, (uintptr_t*)sendComm);
}
static ncclResult_t v8_isend(void* sendComm, void* data, int size, int tag, void* mhandle, void** request) {
  return goNetIsend((uintptr_t)sendComm, data, size, tag, (uintptr_t)mhandle, 0, (uintptr_t*)request);
}
static ncclResult_t v8_irecv(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles, void** request) {
  return goNetIrecv((uintptr_t)recvComm, n, data, NULL, sizes, tags, (uintptr_t*)mhandles, NULL, (uintptr_t*)request);
}

/* ---- v9 (NCCL 2.24-2.25): size_t sizes, makeVDevice ---- */

static ncclResult_t v9_getProperties(int dev, ncclNetProperties_v9_t* props) {
  REFUSE_IN_FORKED_CHILD("getProperties");
  return goNetGetProperties(9, dev, props);
}
static ncclResult_t v9_isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request) {
  return goNetIsend((uintptr_t)sendComm, data, (long long)size, tag, (uintptr_t)mhandle, 0, (uintptr_t*)request);
}
static ncclResult_t v9_irecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                             void** request) {
  return goNetIrecv((uintptr_t)recvComm, n, data, sizes, NULL, tags, (uintptr_t*)mhandles, NULL, (uintptr_t*)request);
}
/* A NULL props reaches Go as ndevs -1, which it refuses with a WARN. */
static ncclResult_t v9_makeVDevice(int* d, ncclNetVDeviceProps_v9_t* props) {
  REFUSE_IN_FORKED_CHILD("makeVDevice");
  return goNetMakeVDevice(NCCL_NET_MAX_DEVS_PER_NIC_V9, d, props ? props->ndevs : -1, props ? props->devs : NULL);
}

/* ---- v10 (NCCL 2.26-2.27): profiler, connect config, phandles ---- */

static ncclResult_t v10_init(ncclDebugLogger_t logFn, ncclProfilerCallback_t profFn) {
  REFUSE_INIT_IN_FORKED_CHILD(logFn);
  return goNetInit(10, NULL, NCCL_NET_TRAFFIC_CLASS_UNDEF, logFn, profFn);
}
static ncclResult_t v10_getProperties(int dev, ncclNetProperties_v10_t* props) {
  REFUSE_IN_FORKED_CHILD("getProperties");
  return goNetGetProperties(10, dev, props);
}
static ncclResult_t v10_connect(int dev, ncclNetCommConfig_v10_t* config, void* handle, void** sendComm,
                                ncclNetDeviceHandle_v10_t** sendDevComm) {
  (void)sendDevComm;
  /* config is NULL for NCCL's GDR probe and bootstrap connections */
  int tc = config ? config->trafficClass : NCCL_NET_TRAFFIC_CLASS_UNDEF;
  REFUSE_IN_FORKED_CHILD("connect");
  return goNetConnect(0, dev, tc, handle, (uintptr_t*)sendComm);
}
static ncclResult_t v10_isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                              void** request) {
  return goNetIsend((uintptr_t)sendComm, data, (long long)size, tag, (uintptr_t)mhandle, (uintptr_t)phandle,
                    (uintptr_t*)request);
}
static ncclResult_t v10_irecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                              void** phandles, void** request) {
  return goNetIrecv((uintptr_t)recvComm, n, data, sizes, NULL, tags, (uintptr_t*)mhandles, (uintptr_t*)phandles,
                    (uintptr_t*)request);
}

/* ---- v11 (NCCL 2.28-2.29) and v12 (2.30+): per-communicator init/finalize ---- */

/* v11+ must hand back a context: without somewhere to put it, refuse (Go
 * would take a NULL ctx for a v10-style init). */
static ncclResult_t noCtx(ncclDebugLogger_t logFn) {
  ncclGoLog(logFn, NCCL_LOG_WARN, ~0UL, "NET/Go : init failed: ctx is NULL (ncclInvalidArgument)");
  return ncclInvalidArgument;
}
static ncclResult_t v11_init(void** ctx, uint64_t commId, ncclNetCommConfig_v11_t* config, ncclDebugLogger_t logFn,
                             ncclProfilerCallback_t profFn) {
  (void)commId;
  if (ctx == NULL) return noCtx(logFn);
  REFUSE_INIT_IN_FORKED_CHILD(logFn);
  return goNetInit(11, (uintptr_t*)ctx, config ? config->trafficClass : NCCL_NET_TRAFFIC_CLASS_UNDEF, logFn, profFn);
}
static ncclResult_t v12_init(void** ctx, uint64_t commId, ncclNetCommConfig_v12_t* config, ncclDebugLogger_t logFn,
                             ncclProfilerCallback_t profFn) {
  (void)commId;
  if (ctx == NULL) return noCtx(logFn);
  REFUSE_INIT_IN_FORKED_CHILD(logFn);
  return goNetInit(12, (uintptr_t*)ctx, config ? config->trafficClass : NCCL_NET_TRAFFIC_CLASS_UNDEF, logFn, profFn);
}
static ncclResult_t v11_getProperties(int dev, ncclNetProperties_v11_t* props) {
  REFUSE_IN_FORKED_CHILD("getProperties");
  return goNetGetProperties(11, dev, props);
}
static ncclResult_t v12_getProperties(int dev, ncclNetProperties_v12_t* props) {
  REFUSE_IN_FORKED_CHILD("getProperties");
  return goNetGetProperties(12, dev, props);
}
static ncclResult_t v11_listen(void* ctx, int dev, void* handle, void** listenComm) {
  /* The context lets its finalize close the listen comms NCCL never closes. */
  REFUSE_IN_FORKED_CHILD("listen");
  return goNetListen((uintptr_t)ctx, dev, handle, (uintptr_t*)listenComm);
}
static ncclResult_t v11_connect(void* ctx, int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v11_t** sendDevComm) {
  (void)sendDevComm;
  REFUSE_IN_FORKED_CHILD("connect");
  return goNetConnect((uintptr_t)ctx, dev, NCCL_NET_TRAFFIC_CLASS_UNDEF, handle, (uintptr_t*)sendComm);
}
static ncclResult_t v11_makeVDevice(int* d, ncclNetVDeviceProps_v11_t* props) {
  REFUSE_IN_FORKED_CHILD("makeVDevice");
  return goNetMakeVDevice(NCCL_NET_MAX_DEVS_PER_NIC_V11, d, props ? props->ndevs : -1, props ? props->devs : NULL);
}
static ncclResult_t v12_makeVDevice(int* d, ncclNetVDeviceProps_v12_t* props) {
  REFUSE_IN_FORKED_CHILD("makeVDevice");
  return goNetMakeVDevice(NCCL_NET_MAX_DEVS_PER_NIC_V12, d, props ? props->ndevs : -1, props ? props->devs : NULL);
}
static ncclResult_t v11_finalize(void* ctx) {
  REFUSE_IN_FORKED_CHILD("finalize");
  return goNetFinalize((uintptr_t)ctx);
}
static ncclResult_t v11_setNetAttr(void* ctx, ncclNetAttr_v11_t* attr) {
  if (attr == NULL) return ncclSuccess;
  return goNetSetNetAttr((uintptr_t)ctx, attr->sendCommAttr.maxConcurrentPeers, attr->recvCommAttr.maxConcurrentPeers);
}

/* ---- the exported tables ----
 * Not const: the first init sets makeVDevice to NULL when the chosen transport
 * cannot fuse devices, as NCCL's own socket transport leaves it (before NCCL
 * reads it: NCCL looks at makeVDevice only after init returned). */

#ifndef NCCL_GO_ONLY_V9_V10
EXPORT ncclNet_v12_t ncclNetPlugin_v12 = {
  NCCL_GO_PLUGIN_NAME, v12_init, s_devices, v12_getProperties, v11_listen, v11_connect, s_accept, s_regMr,
  s_regMrDmaBuf, s_deregMr, v10_isend, v10_irecv, s_iflush, s_test, s_closeSend, s_closeRecv, s_closeListen,
  NULL /* getDeviceMr */, NULL /* irecvConsumed */, v12_makeVDevice, v11_finalize, v11_setNetAttr,
};

EXPORT ncclNet_v11_t ncclNetPlugin_v11 = {
  NCCL_GO_PLUGIN_NAME, v11_init, s_devices, v11_getProperties, v11_listen, v11_connect, s_accept, s_regMr,
  s_regMrDmaBuf, s_deregMr, v10_isend, v10_irecv, s_iflush, s_test, s_closeSend, s_closeRecv, s_closeListen,
  NULL, NULL, v11_makeVDevice, v11_finalize, v11_setNetAttr,
};
#endif

EXPORT ncclNet_v10_t ncclNetPlugin_v10 = {
  NCCL_GO_PLUGIN_NAME, v10_init, s_devices, v10_getProperties, s_listen, v10_connect, s_accept, s_regMr,
  s_regMrDmaBuf, s_deregMr, v10_isend, v10_irecv, s_iflush, s_test, s_closeSend, s_closeRecv, s_closeListen,
  NULL, NULL, v9_makeVDevice,
};

static ncclResult_t v9_init(ncclDebugLogger_t logFn) {
  REFUSE_INIT_IN_FORKED_CHILD(logFn);
  return goNetInit(9, NULL, NCCL_NET_TRAFFIC_CLASS_UNDEF, logFn, NULL);
}

EXPORT ncclNet_v9_t ncclNetPlugin_v9 = {
  NCCL_GO_PLUGIN_NAME, v9_init, s_devices, v9_getProperties, s_listen, v8_connect, s_accept, s_regMr,
  s_regMrDmaBuf, s_deregMr, v9_isend, v9_irecv, s_iflush, s_test, s_closeSend, s_closeRecv, s_closeListen,
  NULL, NULL, v9_makeVDevice,
};

#ifndef NCCL_GO_ONLY_V9_V10
EXPORT ncclNet_v8_t ncclNetPlugin_v8 = {
  NCCL_GO_PLUGIN_NAME, v8_init, s_devices, v8_getProperties, s_listen, v8_connect, s_accept, s_regMr,
  s_regMrDmaBuf, s_deregMr, v8_isend, v8_irecv, s_iflush, s_test, s_closeSend, s_closeRecv, s_closeListen,
  NULL, NULL,
};
#endif

void ncclGoSetVDevice(int enabled) {
#ifndef NCCL_GO_ONLY_V9_V10
  ncclNetPlugin_v12.makeVDevice = enabled ? v12_makeVDevice : NULL;
  ncclNetPlugin_v11.makeVDevice = enabled ? v11_makeVDevice : NULL;
#endif
  ncclNetPlugin_v10.makeVDevice = enabled ? v9_makeVDevice : NULL;
  ncclNetPlugin_v9.makeVDevice = enabled ? v9_makeVDevice : NULL;
}

/* ---- properties per version ----
 * The Go side fills the newest layout once; older ones are the same fields in
 * the same order, minus what later versions added (nccl-net-api.md §1.5), so
 * each step down drops fields, as NCCL's adapters do going up. */

#define PUT_V8_FIELDS(d, s)                                                                  \
  do {                                                                                       \
    (d)->name = (s)->name;                                                                   \
    (d)->pciPath = (s)->pciPath;                                                             \
    (d)->guid = (s)->guid;                                                                   \
    (d)->ptrSupport = (s)->ptrSupport;                                                       \
    (d)->regIsGlobal = (s)->regIsGlobal;                                                     \
    (d)->speed = (s)->speed;                                                                 \
    (d)->port = (s)->port;                                                                   \
    (d)->latency = (s)->latency;                                                             \
    (d)->maxComms = (s)->maxComms;                                                           \
    (d)->maxRecvs = (s)->maxRecvs;                                                           \
    (d)->netDeviceType = (s)->netDeviceType;                                                 \
    (d)->netDeviceVersion = (s)->netDeviceVersion;                                           \
  } while (0)

#define PUT_V9_FIELDS(d, s)                                                                  \
  do {                                                                                       \
    PUT_V8_FIELDS(d, s);                                                                     \
    (d)->forceFlush = (s)->forceFlush;                                                       \
    int n_ = (int)(sizeof((d)->vProps.devs) / sizeof((d)->vProps.devs[0]));                  \
    (d)->vProps.ndevs = (s)->vProps.ndevs < n_ ? (s)->vProps.ndevs : n_;                     \
    for (int i_ = 0; i_ < (d)->vProps.ndevs; i_++) (d)->vProps.devs[i_] = (s)->vProps.devs[i_]; \
    (d)->maxP2pBytes = (s)->maxP2pBytes;                                                     \
    (d)->maxCollBytes = (s)->maxCollBytes;                                                   \
  } while (0)

int ncclGoPutProperties(int version, const ncclNetProperties_v12_t* s, void* dst) {
  switch (version) {
    case 8: {
      ncclNetProperties_v8_t* d = dst;
      memset(d, 0, sizeof *d);
      PUT_V8_FIELDS(d, s);
      return 0;
    }
    case 9:
    case 10: {
      ncclNetProperties_v9_t* d = dst; /* v10 is the v9 layout */
      memset(d, 0, sizeof *d);
      PUT_V9_FIELDS(d, s);
      return 0;
    }
    case 11: {
      ncclNetProperties_v11_t* d = dst;
      memset(d, 0, sizeof *d);
      PUT_V9_FIELDS(d, s);
      d->maxMultiRequestSize = s->maxMultiRequestSize;
      return 0;
    }
    case 12:
      memcpy(dst, s, sizeof *s);
      return 0;
  }
  return -1;
}
