/* loadcheck: load a plugin library the way NCCL does (dlopen RTLD_NOW|RTLD_LOCAL,
 * dlsym "ncclNetPlugin_v10") and call init, devices and getProperties(0), so a
 * freshly built transport is known to load before it meets NCCL.
 *
 *   loadcheck build/libnccl-net-<x>.so     -> exit 0 and one line per device
 */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>

#include "net.h"

static void logfn(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags, (void)line;
  if (level > NCCL_LOG_INFO) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "loadcheck: plugin %s (%s): ", level == NCCL_LOG_WARN ? "WARN" : "INFO", file ? file : "?");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s libnccl-net-<x>.so\n", argv[0]);
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "loadcheck: dlopen %s: %s\n", argv[1], dlerror());
    return 1;
  }
  const ncclNet_v10_t* net = (const ncclNet_v10_t*)dlsym(lib, "ncclNetPlugin_v10");
  if (!net) {
    fprintf(stderr, "loadcheck: %s does not export ncclNetPlugin_v10: %s\n", argv[1], dlerror());
    return 1;
  }
  ncclResult_t res = net->init(logfn, NULL);
  if (res != ncclSuccess) {
    fprintf(stderr, "loadcheck: init returned %d\n", (int)res);
    return 1;
  }
  int ndev = 0;
  res = net->devices(&ndev);
  if (res != ncclSuccess || ndev < 1) {
    fprintf(stderr, "loadcheck: devices returned %d with %d devices (NCCL needs at least one)\n", (int)res, ndev);
    return 1;
  }
  for (int d = 0; d < ndev; d++) {
    ncclNetProperties_v10_t p;
    res = net->getProperties(d, &p);
    if (res != ncclSuccess || p.name == NULL) {
      fprintf(stderr, "loadcheck: getProperties(%d) returned %d\n", d, (int)res);
      return 1;
    }
    printf("loadcheck: %s: NCCL_NET name \"%s\", device %d \"%s\", %d Mbps, ptrSupport 0x%x, maxRecvs %d\n", argv[1],
           net->name, d, p.name, p.speed, p.ptrSupport, p.maxRecvs);
  }
  return 0;
}
