/*
 * harness.h: shared declarations of ncclnet-harness, the C program that loads an
 * NCCL net plugin exactly as NCCL does (dlopen + dlsym of ncclNetPlugin_vN) and
 * checks its conformance, moves data with it and benchmarks it.
 *
 * Process model: a Go c-shared library cannot run Go code in a child after
 * fork(), so the parent never loads the plugin. It creates the shared memory and
 * the control socketpair, forks two ranks, and each rank dlopen()s the plugin
 * itself. The parent only watches: a rank stuck in a plugin call turns into a
 * failure naming the check and the step it was in.
 */
#ifndef NCCLNET_HARNESS_H
#define NCCLNET_HARNESS_H

#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "net.h"

#define HARNESS_MAX_VERSIONS 5
#define HARNESS_MIN_VERSION 8
#define HARNESS_MAX_VERSION 12

/* ---------------------------------------------------------------- util.c */

uint64_t now_ns(void);
/* waitpid that retries EINTR: the host (or a test's signal storm) may have
 * handlers without SA_RESTART. */
pid_t waitpid_r(pid_t pid, int* st, int flags);
double now_s(void);
void sleep_ms(int ms);
/* Page-aligned, zeroed-on-demand buffer (mmap), so 1 GiB buffers don't fault all at once. */
void* buf_alloc(size_t len);
void buf_free(void* p, size_t len);
/* Forks a child that holds every descriptor of the caller, never calls the
 * plugin, outlives the caller, and exits after secs, or once *until (when not
 * NULL) stops being `running` (a DataLoader worker). */
void fork_lingering_child(double secs, atomic_int* until, int running);
/* Every byte of a message is a function of (seed, offset), so any received
 * range can be checked without keeping a copy of what was sent. */
void pattern_fill(void* buf, size_t len, uint64_t seed);
/* Returns the offset of the first wrong byte, or -1 when all len bytes match. */
long long pattern_check(const void* buf, size_t len, uint64_t seed);
/* Messages sent again and again from a ring of buffers, each filled once with
 * its slot's pattern: ring_stamp writes message msg's index, keyed per place,
 * over the first word of every 4 KiB and the last full word, so a buffer that
 * still holds an earlier message, or got only part of this one, fails
 * ring_check (the pattern of seed elsewhere) like a wrong byte. ring_msg reads
 * back which message the first word names (UINT64_MAX under 8 bytes). */
void ring_stamp(void* buf, size_t len, uint64_t msg);
long long ring_check(const void* buf, size_t len, uint64_t seed, uint64_t msg);
uint64_t ring_msg(const void* buf, size_t len);
/* Sends (out) or receives exactly len bytes, retrying EINTR; with MSG_DONTWAIT
 * in flags, EAGAIN busy-polls with sched_yield(). 0, or -1 on error or on EOF
 * before len bytes. send() always adds MSG_NOSIGNAL. The buffer is only read
 * when out. */
int sock_io_all(int fd, void* buf, size_t len, bool out, int flags);
/* This process's thread count from /proc/self/status (-1 when unknown). */
int count_threads(void);
/* Available memory in bytes from /proc/meminfo (0 when unknown). */
uint64_t mem_available(void);
const char* result_str(ncclResult_t r);
/* strtod of all of s, within [lo, hi]: 0, or -1 leaving *out alone. An empty s
 * reads as 0 (callers that refuse it check *s). */
int parse_in_range(const char* s, double lo, double hi, double* out);
int parse_size(const char* s, size_t* out);
void fmt_size(char* out, size_t outlen, size_t bytes);
/* Decimals to print v with so that the figure agrees with its verdict
 * against target (at least 2, at most 6). */
int verdict_precision(double v, double target, bool higher_better);

/* --------------------------------------------------------------- netapi.c */

/* One field set covering every version's ncclNetProperties_vN_t. */
typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport, regIsGlobal, forceFlush, speed, port;
  float latency;
  int maxComms, maxRecvs;
  int netDeviceType, netDeviceVersion;
  int vndevs;
  int vdevs[NCCL_NET_MAX_DEVS_PER_NIC_V12];
  size_t maxP2pBytes, maxCollBytes;
  int maxMultiRequestSize;
  int railId, planeId;
} hprops_t;

typedef struct {
  int version;
  void* dl;
  const void* table; /* ncclNet_vN_t for version N */
  const char* name;
  void* ctx;         /* v11+: this process's communicator context */
} net_t;

/* Logger and profiler state of this process (a rank). */
extern atomic_int g_warns;
extern atomic_int g_infos;
int harness_last_warn(char* out, size_t outlen);
/* The transport the plugin announced in an INFO line ("... transport X ..."), or "". */
void harness_transport_name(char* out, size_t outlen);
void harness_logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
extern int g_rank; /* prefix for log lines */

typedef struct {
  atomic_int starts;        /* Start events with a non-NULL pHandle */
  atomic_int null_starts;   /* Start events with pHandle == NULL (must stay 0) */
  atomic_int stops;         /* Stop / UpdateAndStop of a known event */
  atomic_int double_stops;  /* Stop of an event already stopped */
  atomic_int unknown_stops; /* Stop of an eHandle we never handed out */
} prof_counts_t;
extern prof_counts_t g_prof;
void prof_reset(void);
/* Number of Start events recorded for pHandle p, and how many of them are still open. */
int prof_events_for(void* p, int* open);
ncclResult_t harness_profiler(void** eHandle, int type, void* pHandle, int64_t pluginId, void* extData);

/* dlopen(path, RTLD_NOW|RTLD_LOCAL) + dlsym("ncclNetPlugin_v<version>"). */
int net_load(net_t* n, const char* path, int version, char* err, size_t errlen);
/* Which ncclNetPlugin_vN symbols the library exports (bit N set). dlopen()s in
 * the calling process, so the parent must never call it. */
int net_probe_versions(const char* path, char* err, size_t errlen);
/* Entries NCCL calls unconditionally for this version that are NULL ("" when none). */
const char* net_missing_entry(const net_t* n);

/* v11+: init(ctx, commId, config) per communicator; older: init(logger[, profiler]) and *ctx = NULL. */
ncclResult_t net_init(net_t* n, void** ctx, uint64_t commId, bool with_profiler);
/* The same with the profiler callback of the caller's choice (v10+; ignored below). */
ncclResult_t net_init_with(net_t* n, void** ctx, uint64_t commId, ncclProfilerCallback_t prof);
ncclResult_t net_finalize(net_t* n, void* ctx); /* ncclSuccess no-op below v11 */
ncclResult_t net_devices(net_t* n, int* ndev);
ncclResult_t net_props(net_t* n, int dev, hprops_t* p);
size_t net_props_size(int version);
ncclResult_t net_props_raw(net_t* n, int dev, void* raw);
/* Reads a raw ncclNetProperties_v<version>_t as filled by the plugin (fields the
 * version lacks get what NCCL's adapters assume). */
void net_props_convert(int version, int dev, const void* raw, hprops_t* p);
ncclResult_t net_listen(net_t* n, int dev, void* handle, void** lc);
ncclResult_t net_connect(net_t* n, int dev, ncclNetCommConfig_v10_t* cfg, void* handle, void** sc,
                         ncclNetDeviceHandle_v8_t** dh);
ncclResult_t net_accept(net_t* n, void* lc, void** rc, ncclNetDeviceHandle_v8_t** dh);
ncclResult_t net_regmr(net_t* n, void* comm, void* data, size_t size, int type, void** mh);
ncclResult_t net_deregmr(net_t* n, void* comm, void* mh);
ncclResult_t net_isend(net_t* n, void* sc, void* data, size_t size, int tag, void* mh, void* ph, void** req);
ncclResult_t net_irecv(net_t* n, void* rc, int nr, void** data, size_t* sizes, int* tags, void** mhs, void** phs,
                       void** req);
ncclResult_t net_iflush(net_t* n, void* rc, int nr, void** data, int* sizes, void** mhs, void** req);
ncclResult_t net_test(net_t* n, void* req, int* done, int* sizes);
/* v9+: the version's makeVDevice with a raw ncclNetVDeviceProps_v<version>_t
 * (net_vdevice_props_size bytes, 0 below v9); ncclInternalError when the
 * entry is NULL (net_has_make_vdevice tells). */
size_t net_vdevice_props_size(int version);
int net_vdevice_max_devs(int version);
bool net_has_make_vdevice(const net_t* n);
ncclResult_t net_make_vdevice(net_t* n, int* d, void* props);
ncclResult_t net_close_send(net_t* n, void* sc);
ncclResult_t net_close_recv(net_t* n, void* rc);
ncclResult_t net_close_listen(net_t* n, void* lc);

/* ----------------------------------------------------------------- proc.c */

#define MAX_CHECKS 64
#define WHY_LEN 480
#define WHERE_LEN 160

enum { RES_NONE = 0, RES_RUNNING, RES_PASS, RES_FAIL, RES_NA };

typedef struct {
  atomic_int state;
  atomic_int secondary; /* failed only because the other rank failed */
  char why[WHY_LEN];
} check_result_t;

/* A one-slot mailbox from one rank's thread to the same-numbered thread of the
 * other rank (the concurrent mode sets up links from several threads at once,
 * which the single control socket cannot serve). The owner writes data and
 * then bumps seq; the reader copies it and bumps ack; the owner writes again
 * only once ack == seq. */
#define MBOX_MAX 24
#define MBOX_DATA 160
typedef struct {
  atomic_uint seq;
  atomic_uint ack;
  char data[MBOX_DATA];
} mbox_t;

/* Lives in a MAP_SHARED mapping created by the parent before fork. */
typedef struct {
  atomic_int cur[2];               /* check index each rank is running, -1 = none */
  atomic_ullong cur_start_ns[2];   /* when it started (CLOCK_MONOTONIC, system-wide) */
  atomic_ullong beat_ns[2];        /* last time a rank was back in harness code (polling loops);
                                      a rank blocked inside a plugin call stops beating */
  atomic_int abort_check[2];       /* check index a rank failed (peer loops bail out), -1 */
  atomic_int expect_death[2];      /* a rank about to kill itself on purpose (peer-killed check) */
  atomic_int fatal[2];             /* a rank could not even start (dlopen, init) */
  char fatal_why[2][WHY_LEN];
  char where[2][WHERE_LEN];        /* step a rank is in, for hang reports */
  check_result_t res[2][MAX_CHECKS];
  char text[2][4096];              /* free-form result text from a rank (transfer, bench) */
  atomic_int aux[2][4];            /* per-check side channel a rank can poll without blocking */
  mbox_t mbox[2][MBOX_MAX];        /* [owner rank][channel] (concurrent mode) */
} shm_t;

typedef struct {
  int rank;
  int ctl;        /* this rank's end of the control socketpair */
  shm_t* shm;
  int check;      /* index of the running check (conformance) */
  double timeout; /* seconds a check (or a whole run) may take */
  uint64_t deadline_ns; /* internal loops give up here, before the parent's watchdog fires */
  int peer_end;   /* check index whose end marker the peer already sent, -1 */
} rank_t;

typedef int (*rank_fn)(rank_t* r, void* arg);

typedef struct {
  int exited[2];      /* 1 when waitpid() saw the rank end */
  int status[2];      /* its wait status */
  int hung;           /* 1 when the watchdog killed the ranks */
  int hung_rank;      /* which rank was stuck */
  char hung_where[WHERE_LEN];
  double hung_after;
  int stopped;        /* the signal number in harness_stop_signal that ended the pair, 0 */
} pair_outcome_t;

/* A program's SIGINT/SIGTERM handler may set this (to the signal number):
 * run_pair then kills both ranks, reaps them and returns with out->stopped
 * set, shm->where still saying what each rank was doing. 0 by default. */
extern volatile sig_atomic_t harness_stop_signal;

shm_t* shm_create(void);
/* Forks rank 0 and rank 1 running fn, watches them. A check (shm->cur) running
 * longer than per_check seconds, or the whole pair running longer than total
 * seconds (0 = unlimited), kills both. */
int run_pair(shm_t* shm, rank_fn fn, void* arg, double per_check, double total, pair_outcome_t* out);
const char* wait_status_str(int status, char* buf, size_t len);

void set_where(rank_t* r, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
/* The control channel carries handles, ports and small values between ranks.
 * Every wait is bounded and gives up early when the peer failed the check. */
int ctl_send(rank_t* r, const void* buf, size_t len);
int ctl_recv(rank_t* r, void* buf, size_t len, double timeout_s);
int ctl_barrier(rank_t* r, double timeout_s);
/* Marks the end of check idx and waits for the peer's marker, discarding
 * whatever the peer sent for that check that this rank did not read (it may
 * have left the check early), so the next check starts in step. */
int ctl_end_check(rank_t* r, int idx, double timeout_s);
/* true when the other rank failed the current check (so waiting for it is pointless). */
bool peer_failed(rank_t* r);
bool past_deadline(rank_t* r);
/* A rank's own deadline inside a --timeout of secs: 2 s short of it, so the
 * rank reports what it waited for before the watchdog calls it a hang (80 %
 * of it for timeouts of 4 s and less, never negative). */
double rank_budget(double secs);

/* ------------------------------------------------------------ commands */

/* faults.c: parses its own arguments (argv[2] is the scenario). */
int cmd_faults(int argc, char** argv);

/* bench --rounds: 1 lets a caller (the Soft-RoCE lane) alternate the plugin with its own reference. */
#define BENCH_MAX_ROUNDS 9

typedef struct {
  const char* plugin;
  int versions[HARNESS_MAX_VERSIONS];
  int nversions;
  double timeout;
  int version;        /* transfer / bench */
  size_t size;
  int iters;
  int size_set, iters_set; /* bench, concurrent: given on the command line */
  int plugin_only;          /* bench: no TCP baselines */
  size_t bw_bytes;          /* bench: bytes per bandwidth measurement, 0 = BW_BYTES */
  int rounds;               /* bench: rounds per figure, 0 = ROUNDS, at most BENCH_MAX_ROUNDS */
  double linger;
  const char* bench_what;
  const char* only;   /* conformance: comma-separated check names to run (NULL = all) */
  int verbose;
  int threads;        /* concurrent: progress threads per rank */
} opts_t;

int cmd_conformance(const opts_t* o);
int cmd_transfer(const opts_t* o);
int cmd_bench(const opts_t* o);
int cmd_concurrent(const opts_t* o);

/* Mailbox (shm_t.mbox) between thread `ch` of this rank and of the other one.
 * Both wait at most until the rank's deadline and give up when the other rank
 * failed (-3) or the deadline passed (-2). */
int mbox_post(rank_t* r, int ch, const void* data, size_t len);
int mbox_take(rank_t* r, int ch, void* data, size_t len);

/* Chooses the version for transfer/bench: --version, else the newest exported. */
int pick_version(const opts_t* o, shm_t* shm, char* err, size_t errlen);
/* The start of transfer and bench: line-buffered stdout (scripts read it as it
 * comes), the shared memory, the version (pick_version), empty text slots. 0, or
 * the command's exit code (2: no shared memory; 1: no usable version, said on
 * stderr after "CMD: "). */
int cmd_start(const opts_t* o, const char* cmd, shm_t** shm, int* version);

/* --------------------------------------------- shared by transfer and bench */

/* A connected pair of comms between the two ranks, both directions. */
typedef struct {
  void* lc;
  void* sc;
  void* rc;
  int dev;
} link_t;

/* Both ranks: listen, swap handles, then alternate connect/accept (never
 * blocking on either) until both comms exist. Errors go to why. */
int link_up(rank_t* r, net_t* n, link_t* l, int dev, double timeout_s, char* why, size_t whylen);
/* Both ranks: dlopen, init (with a no-op profiler, as NCCL without a profiler
 * plugin), devices > 0, properties of device 0. */
int rank_open(rank_t* r, net_t* n, const char* path, int version, hprops_t* p, char* why, size_t whylen);
void rank_close(net_t* n);
/* Posts one isend/irecv (n = 1), retrying while the plugin returns a NULL
 * request, until the rank's deadline. */
ncclResult_t post_one(rank_t* r, net_t* n, bool send, void* comm, void* buf, size_t size, int tag, void* mh,
                      void** req);
/* Polls test until done; -1 on error or deadline (why says which). */
int wait_one(rank_t* r, net_t* n, void* req, int* size, char* why, size_t whylen);
void link_down(net_t* n, link_t* l);

/* ------------------------------------------------------------------ tcp.c */

/* Plain TCP baselines for bench: TCP_NODELAY sockets; *_all block, *_poll
 * busy-poll with MSG_DONTWAIT and sched_yield() on EAGAIN. */
int tcp_listen(int* port);
int tcp_accept(int lfd, double timeout_s);
int tcp_connect(int port, double timeout_s);
int tcp_send_all(int fd, const void* buf, size_t len);
int tcp_recv_all(int fd, void* buf, size_t len);
int tcp_send_poll(int fd, const void* buf, size_t len);
int tcp_recv_poll(int fd, void* buf, size_t len);

#endif
