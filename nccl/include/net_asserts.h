/*
 * net_asserts.h: every size and offset of the NCCL net ABI that NCCL's loader and
 * adapters depend on, pinned for LP64 (x86-64, aarch64). A mismatch is a build error,
 * never a silent memory corruption inside NCCL.
 */
#ifndef NCCL_GO_NET_ASSERTS_H
#define NCCL_GO_NET_ASSERTS_H
#include <stddef.h>
#include "net_v8.h"
#include "net_v9.h"
#include "net_v10.h"
#include "net_v11.h"
#include "net_v12.h"

#define NCCL_GO_ASSERT_OFF(T, f, off) _Static_assert(offsetof(T, f) == (off), #T "." #f " must be at offset " #off)
#define NCCL_GO_ASSERT_SIZE(T, sz) _Static_assert(sizeof(T) == (sz), "sizeof(" #T ") must be " #sz)

_Static_assert(sizeof(void*) == 8, "libnccl-net-go supports LP64 targets only");
NCCL_GO_ASSERT_SIZE(ncclResult_t, 4);
NCCL_GO_ASSERT_SIZE(ncclNetDeviceType, 4);

/* Device handle, v7..v12 */
NCCL_GO_ASSERT_OFF(ncclNetDeviceHandle_v8_t, netDeviceType, 0);
NCCL_GO_ASSERT_OFF(ncclNetDeviceHandle_v8_t, netDeviceVersion, 4);
NCCL_GO_ASSERT_OFF(ncclNetDeviceHandle_v8_t, handle, 8);
NCCL_GO_ASSERT_OFF(ncclNetDeviceHandle_v8_t, size, 16);
NCCL_GO_ASSERT_OFF(ncclNetDeviceHandle_v8_t, needsProxyProgress, 24);
NCCL_GO_ASSERT_SIZE(ncclNetDeviceHandle_v8_t, 32);

NCCL_GO_ASSERT_SIZE(ncclNetVDeviceProps_v9_t, 20);
NCCL_GO_ASSERT_SIZE(ncclNetVDeviceProps_v12_t, 36);
NCCL_GO_ASSERT_SIZE(ncclNetCommConfig_v10_t, 4);

/* Properties v8 */
NCCL_GO_ASSERT_OFF(ncclNetProperties_v8_t, name, 0);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v8_t, pciPath, 8);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v8_t, guid, 16);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v8_t, ptrSupport, 24);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v8_t, regIsGlobal, 28);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v8_t, speed, 32);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v8_t, port, 36);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v8_t, latency, 40);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v8_t, maxComms, 44);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v8_t, maxRecvs, 48);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v8_t, netDeviceType, 52);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v8_t, netDeviceVersion, 56);
NCCL_GO_ASSERT_SIZE(ncclNetProperties_v8_t, 64);

/* Properties v9 == v10 */
NCCL_GO_ASSERT_OFF(ncclNetProperties_v9_t, ptrSupport, 24);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v9_t, regIsGlobal, 28);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v9_t, forceFlush, 32);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v9_t, speed, 36);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v9_t, port, 40);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v9_t, latency, 44);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v9_t, maxComms, 48);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v9_t, maxRecvs, 52);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v9_t, netDeviceType, 56);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v9_t, netDeviceVersion, 60);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v9_t, vProps, 64);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v9_t, maxP2pBytes, 88);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v9_t, maxCollBytes, 96);
NCCL_GO_ASSERT_SIZE(ncclNetProperties_v9_t, 104);
NCCL_GO_ASSERT_SIZE(ncclNetProperties_v10_t, 104);

/* Properties v11 */
NCCL_GO_ASSERT_OFF(ncclNetProperties_v11_t, vProps, 64);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v11_t, maxP2pBytes, 88);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v11_t, maxCollBytes, 96);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v11_t, maxMultiRequestSize, 104);
NCCL_GO_ASSERT_SIZE(ncclNetProperties_v11_t, 112);

/* Properties v12 */
NCCL_GO_ASSERT_OFF(ncclNetProperties_v12_t, vProps, 64);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v12_t, maxP2pBytes, 104);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v12_t, maxCollBytes, 112);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v12_t, maxMultiRequestSize, 120);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v12_t, railId, 124);
NCCL_GO_ASSERT_OFF(ncclNetProperties_v12_t, planeId, 126);
NCCL_GO_ASSERT_SIZE(ncclNetProperties_v12_t, 128);

/* setNetAttr argument */
NCCL_GO_ASSERT_OFF(ncclNetAttr_v11_t, sendCommAttr, 0);
NCCL_GO_ASSERT_OFF(ncclNetAttr_v11_t, recvCommAttr, 16);
NCCL_GO_ASSERT_OFF(ncclNetAttr_v11_t, op, 32);
NCCL_GO_ASSERT_OFF(ncclNetAttr_v11_t, algo, 36);
NCCL_GO_ASSERT_OFF(ncclNetAttr_v11_t, proto, 40);
NCCL_GO_ASSERT_SIZE(ncclNetAttr_v11_t, 44);

/* Function tables: every entry is a pointer, in this order. */
#define NCCL_GO_ASSERT_TABLE_COMMON(T)          \
  NCCL_GO_ASSERT_OFF(T, name, 0);               \
  NCCL_GO_ASSERT_OFF(T, init, 8);               \
  NCCL_GO_ASSERT_OFF(T, devices, 16);           \
  NCCL_GO_ASSERT_OFF(T, getProperties, 24);     \
  NCCL_GO_ASSERT_OFF(T, listen, 32);            \
  NCCL_GO_ASSERT_OFF(T, connect, 40);           \
  NCCL_GO_ASSERT_OFF(T, accept, 48);            \
  NCCL_GO_ASSERT_OFF(T, regMr, 56);             \
  NCCL_GO_ASSERT_OFF(T, regMrDmaBuf, 64);       \
  NCCL_GO_ASSERT_OFF(T, deregMr, 72);           \
  NCCL_GO_ASSERT_OFF(T, isend, 80);             \
  NCCL_GO_ASSERT_OFF(T, irecv, 88);             \
  NCCL_GO_ASSERT_OFF(T, iflush, 96);            \
  NCCL_GO_ASSERT_OFF(T, test, 104);             \
  NCCL_GO_ASSERT_OFF(T, closeSend, 112);        \
  NCCL_GO_ASSERT_OFF(T, closeRecv, 120);        \
  NCCL_GO_ASSERT_OFF(T, closeListen, 128);      \
  NCCL_GO_ASSERT_OFF(T, getDeviceMr, 136);      \
  NCCL_GO_ASSERT_OFF(T, irecvConsumed, 144)

NCCL_GO_ASSERT_TABLE_COMMON(ncclNet_v8_t);
NCCL_GO_ASSERT_SIZE(ncclNet_v8_t, 152);
NCCL_GO_ASSERT_TABLE_COMMON(ncclNet_v9_t);
NCCL_GO_ASSERT_OFF(ncclNet_v9_t, makeVDevice, 152);
NCCL_GO_ASSERT_SIZE(ncclNet_v9_t, 160);
NCCL_GO_ASSERT_TABLE_COMMON(ncclNet_v10_t);
NCCL_GO_ASSERT_OFF(ncclNet_v10_t, makeVDevice, 152);
NCCL_GO_ASSERT_SIZE(ncclNet_v10_t, 160);
NCCL_GO_ASSERT_TABLE_COMMON(ncclNet_v11_t);
NCCL_GO_ASSERT_OFF(ncclNet_v11_t, makeVDevice, 152);
NCCL_GO_ASSERT_OFF(ncclNet_v11_t, finalize, 160);
NCCL_GO_ASSERT_OFF(ncclNet_v11_t, setNetAttr, 168);
NCCL_GO_ASSERT_SIZE(ncclNet_v11_t, 176);
NCCL_GO_ASSERT_TABLE_COMMON(ncclNet_v12_t);
NCCL_GO_ASSERT_OFF(ncclNet_v12_t, makeVDevice, 152);
NCCL_GO_ASSERT_OFF(ncclNet_v12_t, finalize, 160);
NCCL_GO_ASSERT_OFF(ncclNet_v12_t, setNetAttr, 168);
NCCL_GO_ASSERT_SIZE(ncclNet_v12_t, 176);

#endif
