package plugin

/*
#include "shims.h"
*/
import "C"

import (
	"unsafe"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// This file is the C boundary: every //export below is reached from a C shim in
// tables.c. Each has the same prologue (guard) and does only what needs C
// types: checks pointers NCCL passes, converts arguments, always writes the
// out-parameters NCCL reads, and calls the pure-Go glue. Arguments NCCL could
// get wrong are checked here once; the glue and the transports trust them.
// Handles travel as uintptr_t so no Go pointer ever reaches C.

// guard is the prologue of every export, deferred first: a panic inside the
// entry becomes ncclInternalError with a WARN instead of unwinding into
// NCCL's C frames.
func guard(entry string, res *C.ncclResult_t) {
	if r := recover(); r != nil {
		*res = cres(panicResult(entry, r))
	}
}

func cres(r nccl.Result) C.ncclResult_t { return C.ncclResult_t(r) }

// nullArg is the answer to a NULL pointer NCCL must never pass.
func nullArg(call, what string) C.ncclResult_t {
	return cres(fail(call, nccl.Errorf(nccl.InvalidArgument, "%s is NULL", what)))
}

//export goNetInit
func goNetInit(version C.int, ctx *C.uintptr_t, trafficClass C.int, logFn C.ncclDebugLogger_t, profFn C.ncclProfilerCallback_t) (res C.ncclResult_t) {
	defer guard("init", &res)
	if ctx != nil {
		*ctx = 0
	}
	if logFn != nil {
		setSink(cSink{fn: logFn})
	}
	if profFn != nil {
		setProfiler(cProfiler{fn: profFn})
	}
	h, r := netInit(int(version), ctx != nil, int(trafficClass))
	if ctx != nil {
		*ctx = C.uintptr_t(h)
	}
	return cres(r)
}

//export goNetFinalize
func goNetFinalize(ctx C.uintptr_t) (res C.ncclResult_t) {
	defer guard("finalize", &res)
	return cres(netFinalize(uintptr(ctx)))
}

//export goNetDevices
func goNetDevices(ndev *C.int) (res C.ncclResult_t) {
	defer guard("devices", &res)
	if ndev == nil {
		return nullArg("devices", "ndev")
	}
	n, r := netDevices()
	*ndev = C.int(n)
	return cres(r)
}

//export goNetGetProperties
func goNetGetProperties(version C.int, dev C.int, props unsafe.Pointer) (res C.ncclResult_t) {
	defer guard("getProperties", &res)
	if props == nil {
		return nullArg("getProperties", "props")
	}
	p, r := netProperties(int(dev))
	if r != nccl.Success {
		return cres(r)
	}
	if err := putProperties(int(version), p, props); err != nil {
		return cres(fail("getProperties", err))
	}
	return cres(nccl.Success)
}

//export goNetMakeVDevice
func goNetMakeVDevice(maxDevs C.int, d *C.int, ndevs C.int, devs *C.int) (res C.ncclResult_t) {
	defer guard("makeVDevice", &res)
	if d == nil || (devs == nil && ndevs > 0) || ndevs < 0 {
		return cres(fail("makeVDevice", nccl.Errorf(nccl.InvalidArgument, "bad arguments (NULL index or props, or ndevs=%d)", int(ndevs))))
	}
	// NCCL's devs array holds maxDevs entries (this version's
	// NCCL_NET_MAX_DEVS_PER_NIC): reading past it could fault, and a fault
	// in Go code is fatal, not a recoverable panic.
	if ndevs < 1 || ndevs > maxDevs || maxDevs > 64 {
		return cres(fail("makeVDevice", nccl.Errorf(nccl.InvalidUsage, "cannot fuse %d devices; this API version allows 1 to %d", int(ndevs), int(maxDevs))))
	}
	list := make([]int, int(ndevs))
	for i, v := range unsafe.Slice(devs, int(ndevs)) {
		list[i] = int(v)
	}
	v, r := netMakeVDevice(list, int(maxDevs))
	if r == nccl.Success {
		*d = C.int(v)
	}
	return cres(r)
}

//export goNetListen
func goNetListen(ctx C.uintptr_t, dev C.int, handle unsafe.Pointer, listenComm *C.uintptr_t) (res C.ncclResult_t) {
	defer guard("listen", &res)
	if handle == nil || listenComm == nil {
		return nullArg("listen", "handle or listenComm")
	}
	*listenComm = 0
	h, r := netListenCtx(uintptr(ctx), int(dev), (*nccl.Handle)(handle))
	*listenComm = C.uintptr_t(h)
	return cres(r)
}

//export goNetConnect
func goNetConnect(ctx C.uintptr_t, dev C.int, trafficClass C.int, handle unsafe.Pointer, sendComm *C.uintptr_t) (res C.ncclResult_t) {
	defer guard("connect", &res)
	if handle == nil || sendComm == nil {
		return nullArg("connect", "handle or sendComm")
	}
	*sendComm = 0
	tc := int(trafficClass)
	if ctx != 0 {
		var err error
		if tc, err = trafficClassOf(uintptr(ctx)); err != nil {
			return cres(fail("connect", err))
		}
	}
	h, r := netConnect(int(dev), tc, (*nccl.Handle)(handle))
	*sendComm = C.uintptr_t(h)
	return cres(r)
}

//export goNetAccept
func goNetAccept(listenComm C.uintptr_t, recvComm *C.uintptr_t) (res C.ncclResult_t) {
	defer guard("accept", &res)
	if recvComm == nil {
		return nullArg("accept", "recvComm")
	}
	*recvComm = 0
	h, r := netAccept(uintptr(listenComm))
	*recvComm = C.uintptr_t(h)
	return cres(r)
}

//export goNetRegMr
func goNetRegMr(comm C.uintptr_t, data unsafe.Pointer, size C.size_t, typ C.int, mhandle *C.uintptr_t) (res C.ncclResult_t) {
	defer guard("regMr", &res)
	if mhandle == nil {
		return nullArg("regMr", "mhandle")
	}
	*mhandle = 0
	mh, r := netRegMr(uintptr(comm), data, int(size), int(typ))
	*mhandle = C.uintptr_t(mh)
	return cres(r)
}

//export goNetRegMrDmaBuf
func goNetRegMrDmaBuf(comm C.uintptr_t, data unsafe.Pointer, size C.size_t, typ C.int, offset C.uint64_t, fd C.int, mhandle *C.uintptr_t) (res C.ncclResult_t) {
	defer guard("regMrDmaBuf", &res)
	if mhandle == nil {
		return nullArg("regMrDmaBuf", "mhandle")
	}
	*mhandle = 0
	mh, r := netRegMrDmaBuf(uintptr(comm), data, int(size), int(typ), uint64(offset), int(fd))
	*mhandle = C.uintptr_t(mh)
	return cres(r)
}

//export goNetDeregMr
func goNetDeregMr(comm C.uintptr_t, mhandle C.uintptr_t) (res C.ncclResult_t) {
	defer guard("deregMr", &res)
	return cres(netDeregMr(uintptr(comm), uintptr(mhandle)))
}

//export goNetIsend
func goNetIsend(comm C.uintptr_t, data unsafe.Pointer, size C.longlong, tag C.int, mhandle C.uintptr_t, phandle C.uintptr_t, request *C.uintptr_t) (res C.ncclResult_t) {
	defer guard("isend", &res)
	if request == nil {
		return nullArg("isend", "request")
	}
	*request = 0 // NCCL may have preset 0x1; never leave it there
	h, r := netIsend(uintptr(comm), data, int64(size), int(tag), uintptr(mhandle), uintptr(phandle))
	*request = C.uintptr_t(h)
	return cres(r)
}

// recvArgs hands a grouped receive's or flush's C arrays to the glue's one
// check (commEntry.setRecvBufs), which copies them into e.bufs.
func recvArgs(call string, e *commEntry, n C.int, data *unsafe.Pointer, sizes64 *C.size_t, sizes32 *C.int, tags *C.int, mhandles *C.uintptr_t) error {
	if err := e.checkRecvCount(call, int(n)); err != nil {
		return err
	}
	if data == nil || (sizes64 == nil && sizes32 == nil) {
		return nccl.Errorf(nccl.InvalidArgument, "%s with a NULL data or sizes array", call)
	}
	cnt := int(n)
	dp := unsafe.Slice(data, cnt)
	for i := 0; i < cnt; i++ {
		var size int64
		if sizes64 != nil {
			size = int64(min(uint64(unsafe.Slice(sizes64, cnt)[i]), nccl.MaxNetSize+1)) // size_t: no sign to lose
		} else {
			size = int64(unsafe.Slice(sizes32, cnt)[i])
		}
		tag, mh := 0, uintptr(0)
		if tags != nil {
			tag = int(unsafe.Slice(tags, cnt)[i])
		}
		if mhandles != nil {
			mh = uintptr(unsafe.Slice(mhandles, cnt)[i])
		}
		if err := e.setRecvBuf(call, i, dp[i], size, tag, mh); err != nil {
			return err
		}
	}
	return nil
}

//export goNetIrecv
func goNetIrecv(comm C.uintptr_t, n C.int, data *unsafe.Pointer, sizes64 *C.size_t, sizes32 *C.int, tags *C.int, mhandles *C.uintptr_t, phandles *C.uintptr_t, request *C.uintptr_t) (res C.ncclResult_t) {
	defer guard("irecv", &res)
	if request == nil {
		return nullArg("irecv", "request")
	}
	*request = 0 // NCCL presets 0x1 for LL/LL128; always overwrite
	e, err := lookup(uintptr(comm), tagRecv)
	if err != nil {
		return cres(fail("irecv", err))
	}
	if err := recvArgs("irecv", e, n, data, sizes64, sizes32, tags, mhandles); err != nil {
		return cres(e.callFailed("irecv", err))
	}
	var ph []uintptr
	if phandles != nil {
		ph = unsafe.Slice((*uintptr)(unsafe.Pointer(phandles)), int(n))
	}
	h, r := e.irecv(int(n), ph)
	*request = C.uintptr_t(h)
	return cres(r)
}

//export goNetIflush
func goNetIflush(comm C.uintptr_t, n C.int, data *unsafe.Pointer, sizes *C.int, mhandles *C.uintptr_t, request *C.uintptr_t) (res C.ncclResult_t) {
	defer guard("iflush", &res)
	if request == nil {
		return nullArg("iflush", "request")
	}
	*request = 0
	e, err := lookup(uintptr(comm), tagRecv)
	if err != nil {
		return cres(fail("iflush", err))
	}
	if err := recvArgs("iflush", e, n, data, nil, sizes, nil, mhandles); err != nil {
		return cres(e.callFailed("iflush", err))
	}
	h, r := e.iflush(int(n))
	*request = C.uintptr_t(h)
	return cres(r)
}

//export goNetTest
func goNetTest(request C.uintptr_t, done *C.int, sizes *C.int) (res C.ncclResult_t) {
	defer guard("test", &res)
	if done == nil {
		return nullArg("test", "done")
	}
	*done = 0
	d, r := netTest(uintptr(request), (*int32)(unsafe.Pointer(sizes)))
	if d {
		*done = 1
	}
	return cres(r)
}

//export goNetClose
func goNetClose(comm C.uintptr_t, tag C.int) (res C.ncclResult_t) {
	defer guard("close", &res)
	return cres(netClose(uintptr(comm), uint8(tag)))
}

//export goNetSetNetAttr
func goNetSetNetAttr(ctx C.uintptr_t, sendPeers, recvPeers C.int) (res C.ncclResult_t) {
	defer guard("setNetAttr", &res)
	// Hints only (NCCL sends them per transfer); no transport uses them yet.
	// The level check comes first because building Tracef's arguments
	// allocates even when it then returns at once, and this runs on NCCL's
	// progress thread.
	if maxLevel.Load() < levelTrace {
		return cres(nccl.Success)
	}
	log.Tracef(nccl.SubsysNet, "NET/Go : setNetAttr ctx %#x maxConcurrentPeers send %d recv %d", uintptr(ctx), int(sendPeers), int(recvPeers))
	return cres(nccl.Success)
}
