/* shims.h: C helpers the Go side calls (declarations only: cgo forbids
 * definitions in the preamble of a file with //export). */
#ifndef NCCL_GO_SHIMS_H
#define NCCL_GO_SHIMS_H
#include <stdint.h>
#include "../nccl/include/net.h"

void ncclGoLog(ncclDebugLogger_t fn, int level, unsigned long flags, const char* msg);
uintptr_t ncclGoProfStart(ncclProfilerCallback_t fn, uintptr_t phandle, int type, int dev, uint64_t size, int tag,
                          uintptr_t request);
void ncclGoProfStop(ncclProfilerCallback_t fn, uintptr_t event);
void ncclGoDisableVDevice(void);
#endif
