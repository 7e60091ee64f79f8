/*
 * badplugin.c: a deliberately broken NCCL net plugin (v8 table only) for the
 * harness self-test. Each defect is one NCCL relies on not happening, so the
 * matching conformance check must report FAIL; a harness that passes this
 * plugin's checks is broken.
 *
 *   - getProperties: relative pciPath, and success for a device that does not exist
 *   - connect: ncclSystemError, or with BADPLUGIN_HANG=1 it never returns
 *     (the watchdog must turn that into "hung")
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "net.h"

static ncclResult_t b_init(ncclDebugLogger_t log) {
  (void)log;
  return ncclSuccess;
}
static ncclResult_t b_devices(int* n) {
  *n = 1;
  return ncclSuccess;
}
static ncclResult_t b_props(int dev, ncclNetProperties_v8_t* p) {
  (void)dev; /* defect: no range check */
  memset(p, 0, sizeof *p);
  p->name = "bad0";
  p->pciPath = "pci0000:00/0000:00:01.0"; /* defect: not absolute */
  p->ptrSupport = NCCL_PTR_HOST;
  p->speed = 1000;
  p->maxComms = 1;
  p->maxRecvs = 1;
  return ncclSuccess;
}
static int token;
static ncclResult_t b_listen(int dev, void* h, void** lc) {
  (void)dev;
  memset(h, 0, NCCL_NET_HANDLE_MAXSIZE);
  *lc = &token;
  return ncclSuccess;
}
static ncclResult_t b_connect(int dev, void* h, void** sc, ncclNetDeviceHandle_v8_t** dh) {
  (void)dev;
  (void)h;
  (void)dh;
  *sc = NULL;
  const char* hang = getenv("BADPLUGIN_HANG");
  if (hang && *hang == '1')
    for (;;) pause(); /* defect: blocks */
  return ncclSystemError;
}
static ncclResult_t b_accept(void* lc, void** rc, ncclNetDeviceHandle_v8_t** dh) {
  (void)lc;
  (void)dh;
  *rc = NULL;
  return ncclSuccess;
}
static ncclResult_t b_regmr(void* c, void* d, size_t s, int t, void** mh) {
  (void)c, (void)d, (void)s, (void)t;
  *mh = NULL;
  return ncclSuccess;
}
static ncclResult_t b_dereg(void* c, void* mh) {
  (void)c, (void)mh;
  return ncclSuccess;
}
static ncclResult_t b_isend(void* sc, void* d, int s, int t, void* mh, void** req) {
  (void)sc, (void)d, (void)s, (void)t, (void)mh, (void)req;
  return ncclInternalError;
}
static ncclResult_t b_irecv(void* rc, int n, void** d, int* s, int* t, void** mh, void** req) {
  (void)rc, (void)n, (void)d, (void)s, (void)t, (void)mh, (void)req;
  return ncclInternalError;
}
static ncclResult_t b_test(void* req, int* done, int* sizes) {
  (void)req, (void)sizes;
  *done = 0;
  return ncclInternalError;
}
static ncclResult_t b_close(void* c) {
  (void)c;
  return ncclSuccess;
}

__attribute__((visibility("default"))) const ncclNet_v8_t ncclNetPlugin_v8 = {
    "Bad", b_init, b_devices, b_props, b_listen, b_connect, b_accept, b_regmr, NULL, b_dereg,
    b_isend, b_irecv, NULL, b_test, b_close, b_close, b_close, NULL, NULL,
};
