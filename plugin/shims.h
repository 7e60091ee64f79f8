/* shims.h: what the C tables and the Go side share: handle tags, the profiler
 * plugin id, and the C helpers Go calls (declarations only: cgo forbids
 * definitions in the preamble of a file with //export). abi_cgo.go checks at
 * compile time that the Go side agrees with every constant here. */
#ifndef NCCL_GO_SHIMS_H
#define NCCL_GO_SHIMS_H
#include <stdint.h>
#include "../nccl/include/net.h"

/* Kind tags in the top byte of comm handles (plugin/slots.go). */
#define NCCL_GO_TAG_SEND 0x53
#define NCCL_GO_TAG_RECV 0x52
#define NCCL_GO_TAG_LISTEN 0x4c
/* pluginId of our profiler events: 'G' << 16 | descriptor version 1. */
#define NCCL_GO_PROF_PLUGIN_ID ((0x47 << 16) | 1)

void ncclGoLog(ncclDebugLogger_t fn, int level, unsigned long flags, const char* msg);
uintptr_t ncclGoProfStart(ncclProfilerCallback_t fn, uintptr_t phandle, int type, int dev, uint64_t size, int tag,
                          uintptr_t request);
void ncclGoProfStop(ncclProfilerCallback_t fn, uintptr_t event);
/* Points every table's makeVDevice at its shim, or at NULL for a transport
 * that cannot fuse devices (as NCCL's own socket transport leaves it). */
void ncclGoSetVDevice(int enabled);
/* Writes the version's ncclNetProperties_vN_t from the newest layout: the one
 * place where properties differ per API version. Returns 0, or -1 for a
 * version this library does not speak. */
int ncclGoPutProperties(int version, const ncclNetProperties_v12_t* src, void* dst);
#endif
