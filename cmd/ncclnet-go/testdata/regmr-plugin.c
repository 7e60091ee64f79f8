/*
 * A plugin that forwards every call to a real one (the library named by
 * REGMR_PLUGIN_REAL) but makes regMr slow or small: REGMR_PLUGIN_SLEEP=SEC
 * sleeps before every registration, REGMR_PLUGIN_MAX=BYTES refuses (with
 * ncclSystemError) a registration larger than that. The self-test must name
 * the step a slow registration is in, and register only the memory it uses.
 * Exports only ncclNetPlugin_v8.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "net.h"

static const ncclNet_v8_t* real;

static ncclResult_t c_init(ncclDebugLogger_t log) {
  const char* path = getenv("REGMR_PLUGIN_REAL");
  void* dl = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
  real = dl ? dlsym(dl, "ncclNetPlugin_v8") : NULL;
  if (real == NULL) {
    fprintf(stderr, "regmr-plugin: cannot load REGMR_PLUGIN_REAL=%s: %s\n", path ? path : "(unset)", dlerror());
    return ncclSystemError;
  }
  return real->init(log);
}
static ncclResult_t c_devices(int* n) { return real->devices(n); }
static ncclResult_t c_props(int d, ncclNetProperties_v8_t* p) { return real->getProperties(d, p); }
static ncclResult_t c_listen(int d, void* h, void** l) { return real->listen(d, h, l); }
static ncclResult_t c_connect(int d, void* h, void** s, ncclNetDeviceHandle_v8_t** dh) { return real->connect(d, h, s, dh); }
static ncclResult_t c_accept(void* l, void** r, ncclNetDeviceHandle_v8_t** dh) { return real->accept(l, r, dh); }
static ncclResult_t c_regmr(void* c, void* d, size_t s, int t, void** m) {
  const char* sl = getenv("REGMR_PLUGIN_SLEEP");
  if (sl != NULL) sleep((unsigned)atoi(sl));
  const char* max = getenv("REGMR_PLUGIN_MAX");
  if (max != NULL && s > strtoull(max, NULL, 10)) {
    fprintf(stderr, "regmr-plugin: refusing to register %zu bytes (REGMR_PLUGIN_MAX=%s)\n", s, max);
    return ncclSystemError;
  }
  return real->regMr(c, d, s, t, m);
}
static ncclResult_t c_deregmr(void* c, void* m) { return real->deregMr(c, m); }
static ncclResult_t c_isend(void* c, void* d, int s, int t, void* m, void** r) { return real->isend(c, d, s, t, m, r); }
static ncclResult_t c_irecv(void* c, int n, void** d, int* s, int* t, void** m, void** r) {
  return real->irecv(c, n, d, s, t, m, r);
}
static ncclResult_t c_iflush(void* c, int n, void** d, int* s, void** m, void** r) { return real->iflush(c, n, d, s, m, r); }
static ncclResult_t c_test(void* r, int* done, int* s) { return real->test(r, done, s); }
static ncclResult_t c_close_send(void* c) { return real->closeSend(c); }
static ncclResult_t c_close_recv(void* c) { return real->closeRecv(c); }
static ncclResult_t c_close_listen(void* c) { return real->closeListen(c); }

const ncclNet_v8_t ncclNetPlugin_v8 = {
    .name = "RegMr",
    .init = c_init,
    .devices = c_devices,
    .getProperties = c_props,
    .listen = c_listen,
    .connect = c_connect,
    .accept = c_accept,
    .regMr = c_regmr,
    .deregMr = c_deregmr,
    .isend = c_isend,
    .irecv = c_irecv,
    .iflush = c_iflush,
    .test = c_test,
    .closeSend = c_close_send,
    .closeRecv = c_close_recv,
    .closeListen = c_close_listen,
};
