/*
 * faultyplugin.c: a small NCCL net plugin (v8 table, plain TCP over loopback)
 * that works, unless told to have one of the defects the fault lane exists to
 * catch. scripts/faults/selftest.sh runs `ncclnet-harness faults` against it
 * and requires a PASS without defects and the matching FAIL with each one:
 * proof that the lane's checks can fail.
 *
 *   FAULTY_IGNORE_PEER=1  test() never reports a dead connection: a request on
 *                         it stays pending for ever (kill must find hangs)
 *   FAULTY_LEAK=1         closeSend/closeRecv/closeListen leave the socket open
 *                         (stray and abort must find the descriptors)
 *   FAULTY_STRAY=1        accept() hands out the first connection that arrives,
 *                         stray or not (stray must find the real one failing)
 *   FAULTY_DEAD_DONE=1    a receive whose peer died reports success with what
 *                         it had (the conformance check peer-killed must find
 *                         the bytes that never came)
 *   FAULTY_FORK_KEEPS=1   a child forked from the host keeps the plugin's
 *                         sockets, so a killed rank's children keep its
 *                         connections alive (peer-killed, whose dying rank
 *                         leaves a forked child behind, must find the hang)
 *
 * Wire: none. A connection carries the payload bytes of each message in
 * order; both sides post the same sizes. One receive buffer per irecv.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net.h"

#define MAXREQ 16
#define MAGIC 0xfa017c0ffee5ull

typedef struct comm comm_t;
typedef struct {
  comm_t* c;
  char* buf;
  size_t size, off;
  int used, done, failed;
} req_t;

struct comm {
  int fd;
  int send;
  req_t reqs[MAXREQ];
  int head, count; /* FIFO of posted requests */
};

typedef struct {
  int fd;
} listen_t;

static int env_on(const char* k) {
  const char* v = getenv(k);
  return v != NULL && *v == '1';
}

/* The plugin's sockets, closed in a forked child (what forkguard does for
 * ours): a child must not keep a dead or closed rank's connections alive. */
#define MAXFD 4096
static unsigned char mine[MAXFD];
static void own(int fd) {
  if (fd >= 0 && fd < MAXFD) mine[fd] = 1;
}
static void disown(int fd) {
  if (fd >= 0 && fd < MAXFD) mine[fd] = 0;
}
static void child_closes(void) {
  for (int fd = 0; fd < MAXFD; fd++)
    if (mine[fd]) close(fd);
}
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void install_atfork(void) { pthread_atfork(NULL, NULL, child_closes); }

static ncclResult_t f_init(ncclDebugLogger_t log) {
  (void)log;
  if (!env_on("FAULTY_FORK_KEEPS")) pthread_once(&atfork_once, install_atfork);
  return ncclSuccess;
}

static ncclResult_t f_devices(int* n) {
  *n = 1;
  return ncclSuccess;
}

static ncclResult_t f_props(int dev, ncclNetProperties_v8_t* p) {
  if (dev != 0) return ncclInvalidArgument;
  memset(p, 0, sizeof *p);
  p->name = "faulty0";
  p->pciPath = "/sys/devices/virtual/net/lo";
  p->ptrSupport = NCCL_PTR_HOST;
  p->speed = 10000;
  p->maxComms = 1024;
  p->maxRecvs = 1;
  return ncclSuccess;
}

static ncclResult_t f_listen(int dev, void* handle, void** lc) {
  (void)dev;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr*)&a, sizeof a) != 0 || listen(fd, 64) != 0 ||
      getsockname(fd, (struct sockaddr*)&a, &al) != 0) {
    if (fd >= 0) close(fd);
    return ncclSystemError;
  }
  uint64_t m = MAGIC;
  memset(handle, 0, NCCL_NET_HANDLE_MAXSIZE);
  memcpy(handle, &m, 8);
  memcpy((char*)handle + 8, &a.sin_port, 2);
  listen_t* l = calloc(1, sizeof *l);
  l->fd = fd;
  own(fd);
  *lc = l;
  return ncclSuccess;
}

static comm_t* new_comm(int fd, int send) {
  comm_t* c = calloc(1, sizeof *c);
  c->fd = fd;
  own(fd);
  c->send = send;
  return c;
}

static ncclResult_t f_connect(int dev, void* handle, void** sc, ncclNetDeviceHandle_v8_t** dh) {
  (void)dev;
  (void)dh;
  *sc = NULL;
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  memcpy(&a.sin_port, (char*)handle + 8, 2);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ncclSystemError;
  if (connect(fd, (struct sockaddr*)&a, sizeof a) != 0) {
    close(fd);
    return ncclSystemError;
  }
  /* A greeting tells the acceptor this is a real peer (stray filtering); it
   * differs from the handle, whose bytes a stray may replay. */
  uint64_t m = ~MAGIC;
  if (send(fd, &m, 8, MSG_NOSIGNAL) != 8) {
    close(fd);
    return ncclSystemError;
  }
  *sc = new_comm(fd, 1);
  return ncclSuccess;
}

static ncclResult_t f_accept(void* lcp, void** rc, ncclNetDeviceHandle_v8_t** dh) {
  (void)dh;
  listen_t* l = lcp;
  *rc = NULL;
  for (;;) {
    int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? ncclSuccess : ncclSystemError;
    if (env_on("FAULTY_STRAY")) {
      *rc = new_comm(fd, 0);
      return ncclSuccess;
    }
    /* The greeting must come at once (loopback); anything else is a stray. */
    uint64_t m = 0;
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 200) == 1 && recv(fd, &m, 8, MSG_DONTWAIT) == 8 && m == ~MAGIC) {
      *rc = new_comm(fd, 0);
      return ncclSuccess;
    }
    close(fd);
  }
}

static ncclResult_t f_regmr(void* c, void* d, size_t s, int t, void** mh) {
  (void)c, (void)d, (void)s;
  if (t != NCCL_PTR_HOST) return ncclInternalError;
  *mh = (void*)0x100;
  return ncclSuccess;
}

static ncclResult_t f_deregmr(void* c, void* mh) {
  (void)c, (void)mh;
  return ncclSuccess;
}

static ncclResult_t post(comm_t* c, void* data, size_t size, void** request) {
  *request = NULL;
  if (c->count == MAXREQ) return ncclSuccess; /* NCCL retries */
  req_t* r = &c->reqs[(c->head + c->count) % MAXREQ];
  memset(r, 0, sizeof *r);
  r->c = c;
  r->buf = data;
  r->size = size;
  r->used = 1;
  c->count++;
  *request = r;
  return ncclSuccess;
}

static ncclResult_t f_isend(void* sc, void* data, int size, int tag, void* mh, void** request) {
  (void)tag, (void)mh;
  return post(sc, data, (size_t)size, request);
}

static ncclResult_t f_irecv(void* rc, int n, void** data, int* sizes, int* tags, void** mh, void** request) {
  (void)tags, (void)mh;
  if (n != 1) return ncclInvalidArgument;
  return post(rc, data[0], (size_t)sizes[0], request);
}

/* Moves bytes for the requests at the head of the FIFO, in order. */
static void progress(comm_t* c) {
  while (c->count > 0) {
    req_t* r = &c->reqs[c->head];
    if (r->done || r->failed) break;
    while (r->off < r->size) {
      ssize_t k = c->send ? send(c->fd, r->buf + r->off, r->size - r->off, MSG_DONTWAIT | MSG_NOSIGNAL)
                          : recv(c->fd, r->buf + r->off, r->size - r->off, MSG_DONTWAIT);
      if (k > 0) {
        r->off += (size_t)k;
        continue;
      }
      if (k < 0 && (errno == EAGAIN || errno == EINTR)) return;
      r->failed = 1; /* EOF or a reset: the peer is gone */
      return;
    }
    r->done = 1;
    return;
  }
}

static ncclResult_t f_test(void* request, int* done, int* sizes) {
  req_t* r = request;
  comm_t* c = r->c;
  *done = 0;
  progress(c);
  if (r->failed) {
    if (env_on("FAULTY_IGNORE_PEER")) return ncclSuccess; /* defect: pending for ever */
    if (!(c->send == 0 && env_on("FAULTY_DEAD_DONE"))) return ncclSystemError;
    r->done = 1; /* defect: a receive cut short counts as complete */
  }
  if (!r->done) return ncclSuccess;
  *done = 1;
  if (sizes) sizes[0] = (int)r->size;
  r->used = 0;
  /* Requests complete in order (the driver tests the oldest first). */
  while (c->count > 0 && !c->reqs[c->head].used) {
    c->head = (c->head + 1) % MAXREQ;
    c->count--;
  }
  return ncclSuccess;
}

static ncclResult_t close_comm(void* cp) {
  comm_t* c = cp;
  if (!env_on("FAULTY_LEAK")) {
    disown(c->fd);
    close(c->fd);
  }
  free(c);
  return ncclSuccess;
}

static ncclResult_t f_close_listen(void* lcp) {
  listen_t* l = lcp;
  if (!env_on("FAULTY_LEAK")) {
    disown(l->fd);
    close(l->fd);
  }
  free(l);
  return ncclSuccess;
}

__attribute__((visibility("default"))) const ncclNet_v8_t ncclNetPlugin_v8 = {
    .name = "Faulty",
    .init = f_init,
    .devices = f_devices,
    .getProperties = f_props,
    .listen = f_listen,
    .connect = f_connect,
    .accept = f_accept,
    .regMr = f_regmr,
    .deregMr = f_deregmr,
    .isend = f_isend,
    .irecv = f_irecv,
    .test = f_test,
    .closeSend = close_comm,
    .closeRecv = close_comm,
    .closeListen = f_close_listen,
};
