package plugin

/*
#include <stdlib.h>
#include "shims.h"
*/
import "C"

import (
	"sync"
	"unsafe"

	"github.com/libnccl-net-go/libnccl-net-go/internal/abi"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// This file is the C boundary: every //export below is reached from a C shim in
// tables.c, converts C arguments, recovers panics and calls the pure-Go glue.
// Handles travel as uintptr_t so no Go pointer ever reaches C.

func init() {
	nccl.SetEnvLookup(cLookupEnv)
}

// cLookupEnv reads the live C environment: NCCL applies nccl.conf with setenv
// after our runtime copied os.Environ.
func cLookupEnv(name string) (string, bool) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	v := C.getenv(cs)
	if v == nil {
		return "", false
	}
	return C.GoString(v), true
}

type cSink struct{ fn C.ncclDebugLogger_t }

func (s cSink) log(level int, flags uint64, msg string) {
	cs := C.CString(msg)
	C.ncclGoLog(s.fn, C.int(level), C.ulong(flags), cs)
	C.free(unsafe.Pointer(cs))
}

type cProfiler struct{ fn C.ncclProfilerCallback_t }

func (p cProfiler) start(phandle uintptr, typ int, dev int, size int64, tag int, req uintptr) uintptr {
	return uintptr(C.ncclGoProfStart(p.fn, C.uintptr_t(phandle), C.int(typ), C.int(dev), C.uint64_t(size), C.int(tag), C.uintptr_t(req)))
}

func (p cProfiler) stop(ev uintptr) { C.ncclGoProfStop(p.fn, C.uintptr_t(ev)) }

//export goNetInit
func goNetInit(version C.int, ctx *C.uintptr_t, trafficClass C.int, logFn C.ncclDebugLogger_t, profFn C.ncclProfilerCallback_t) (res C.ncclResult_t) {
	r := nccl.InternalError
	defer func() { res = C.ncclResult_t(r) }()
	defer recoverResult("init", &r)
	if ctx != nil {
		*ctx = 0
	}
	if logFn != nil {
		setSink(cSink{fn: logFn})
	}
	if profFn != nil {
		profiler = cProfiler{fn: profFn}
	}
	h, rr := netInit(int(version), ctx != nil, int(trafficClass))
	if rr == nccl.Success {
		if t, err := readyTransport(); err == nil {
			if _, ok := t.(nccl.VDeviceMaker); !ok {
				// NCCL's socket transport sets makeVDevice to NULL, which every
				// NCCL version handles; do the same for non-fusing transports.
				C.ncclGoDisableVDevice()
			}
		}
	}
	if ctx != nil {
		*ctx = C.uintptr_t(h)
	}
	r = rr
	return
}

//export goNetFinalize
func goNetFinalize(ctx C.uintptr_t) (res C.ncclResult_t) {
	r := nccl.InternalError
	defer func() { res = C.ncclResult_t(r) }()
	defer recoverResult("finalize", &r)
	r = netFinalize(uintptr(ctx))
	return
}

//export goNetDevices
func goNetDevices(ndev *C.int) (res C.ncclResult_t) {
	r := nccl.InternalError
	defer func() { res = C.ncclResult_t(r) }()
	defer recoverResult("devices", &r)
	if ndev == nil {
		r = fail("devices", nccl.Errorf(nccl.InvalidArgument, "ndev is NULL"))
		return
	}
	n, rr := netDevices()
	*ndev = C.int(n)
	r = rr
	return
}

// cStrings keeps name/pciPath strings alive forever: NCCL stores the pointers
// (name is its topology key) and never frees them.
var cStrings struct {
	sync.Mutex
	m map[string]*C.char
}

func persistentCString(s string) *C.char {
	if s == "" {
		return nil
	}
	cStrings.Lock()
	defer cStrings.Unlock()
	if cStrings.m == nil {
		cStrings.m = map[string]*C.char{}
	}
	if p, ok := cStrings.m[s]; ok {
		return p
	}
	p := C.CString(s)
	cStrings.m[s] = p
	return p
}

//export goNetGetProperties
func goNetGetProperties(version C.int, dev C.int, props unsafe.Pointer) (res C.ncclResult_t) {
	r := nccl.InternalError
	defer func() { res = C.ncclResult_t(r) }()
	defer recoverResult("getProperties", &r)
	if props == nil {
		r = fail("getProperties", nccl.Errorf(nccl.InvalidArgument, "props is NULL"))
		return
	}
	p, rr := netProperties(int(dev))
	if rr != nccl.Success {
		r = rr
		return
	}
	name := persistentCString(p.Name)
	pci := persistentCString(p.PCIPath)
	b2i := func(b bool) C.int {
		if b {
			return 1
		}
		return 0
	}
	switch version {
	case 8:
		q := (*C.ncclNetProperties_v8_t)(props)
		*q = C.ncclNetProperties_v8_t{}
		q.name, q.pciPath, q.guid = name, pci, C.uint64_t(p.GUID)
		q.ptrSupport, q.regIsGlobal = C.int(p.PtrSupport), b2i(p.RegIsGlobal)
		q.speed, q.port, q.latency = C.int(p.Speed), C.int(p.Port), C.float(p.Latency)
		q.maxComms, q.maxRecvs = C.int(p.MaxComms), C.int(p.MaxRecvs)
		q.netDeviceType, q.netDeviceVersion = C.NCCL_NET_DEVICE_HOST, 0
	case 9, 10:
		q := (*C.ncclNetProperties_v9_t)(props)
		*q = C.ncclNetProperties_v9_t{}
		q.name, q.pciPath, q.guid = name, pci, C.uint64_t(p.GUID)
		q.ptrSupport, q.regIsGlobal, q.forceFlush = C.int(p.PtrSupport), b2i(p.RegIsGlobal), b2i(p.ForceFlush)
		q.speed, q.port, q.latency = C.int(p.Speed), C.int(p.Port), C.float(p.Latency)
		q.maxComms, q.maxRecvs = C.int(p.MaxComms), C.int(p.MaxRecvs)
		q.netDeviceType, q.netDeviceVersion = C.NCCL_NET_DEVICE_HOST, 0
		q.vProps.ndevs = C.int(fillDevs(q.vProps.devs[:], p.VDevs))
		q.maxP2pBytes, q.maxCollBytes = C.size_t(p.MaxP2PBytes), C.size_t(p.MaxCollBytes)
	case 11:
		q := (*C.ncclNetProperties_v11_t)(props)
		*q = C.ncclNetProperties_v11_t{}
		q.name, q.pciPath, q.guid = name, pci, C.uint64_t(p.GUID)
		q.ptrSupport, q.regIsGlobal, q.forceFlush = C.int(p.PtrSupport), b2i(p.RegIsGlobal), b2i(p.ForceFlush)
		q.speed, q.port, q.latency = C.int(p.Speed), C.int(p.Port), C.float(p.Latency)
		q.maxComms, q.maxRecvs = C.int(p.MaxComms), C.int(p.MaxRecvs)
		q.netDeviceType, q.netDeviceVersion = C.NCCL_NET_DEVICE_HOST, 0
		q.vProps.ndevs = C.int(fillDevs(q.vProps.devs[:], p.VDevs))
		q.maxP2pBytes, q.maxCollBytes = C.size_t(p.MaxP2PBytes), C.size_t(p.MaxCollBytes)
		q.maxMultiRequestSize = C.int(p.MaxMultiRequestSize)
	case 12:
		q := (*C.ncclNetProperties_v12_t)(props)
		*q = C.ncclNetProperties_v12_t{}
		q.name, q.pciPath, q.guid = name, pci, C.uint64_t(p.GUID)
		q.ptrSupport, q.regIsGlobal, q.forceFlush = C.int(p.PtrSupport), b2i(p.RegIsGlobal), b2i(p.ForceFlush)
		q.speed, q.port, q.latency = C.int(p.Speed), C.int(p.Port), C.float(p.Latency)
		q.maxComms, q.maxRecvs = C.int(p.MaxComms), C.int(p.MaxRecvs)
		q.netDeviceType, q.netDeviceVersion = C.NCCL_NET_DEVICE_HOST, 0
		q.vProps.ndevs = C.int(fillDevs(q.vProps.devs[:], p.VDevs))
		q.maxP2pBytes, q.maxCollBytes = C.size_t(p.MaxP2PBytes), C.size_t(p.MaxCollBytes)
		q.maxMultiRequestSize = C.int(p.MaxMultiRequestSize)
		q.railId, q.planeId = C.int16_t(abi.ID(p.RailID.Get())), C.int16_t(abi.ID(p.PlaneID.Get()))
	default:
		r = fail("getProperties", nccl.Errorf(nccl.InternalError, "unknown API version %d", int(version)))
		return
	}
	r = nccl.Success
	return
}

func fillDevs(dst []C.int, devs []int) int {
	n := min(len(devs), len(dst))
	for i := 0; i < n; i++ {
		dst[i] = C.int(devs[i])
	}
	return n
}

//export goNetMakeVDevice
func goNetMakeVDevice(maxDevs C.int, d *C.int, ndevs C.int, devs *C.int) (res C.ncclResult_t) {
	r := nccl.InternalError
	defer func() { res = C.ncclResult_t(r) }()
	defer recoverResult("makeVDevice", &r)
	if d == nil || (devs == nil && ndevs > 0) || ndevs < 0 || ndevs > 64 {
		r = fail("makeVDevice", nccl.Errorf(nccl.InvalidArgument, "bad arguments (ndevs=%d)", int(ndevs)))
		return
	}
	list := make([]int, int(ndevs))
	for i, v := range unsafe.Slice(devs, int(ndevs)) {
		list[i] = int(v)
	}
	v, rr := netMakeVDevice(list, int(maxDevs))
	if rr == nccl.Success {
		*d = C.int(v)
	}
	r = rr
	return
}

//export goNetListen
func goNetListen(dev C.int, handle unsafe.Pointer, listenComm *C.uintptr_t) (res C.ncclResult_t) {
	r := nccl.InternalError
	defer func() { res = C.ncclResult_t(r) }()
	defer recoverResult("listen", &r)
	if handle == nil || listenComm == nil {
		r = fail("listen", nccl.Errorf(nccl.InvalidArgument, "NULL handle or listenComm"))
		return
	}
	*listenComm = 0
	h, rr := netListen(int(dev), (*nccl.Handle)(handle))
	*listenComm = C.uintptr_t(h)
	r = rr
	return
}

//export goNetConnect
func goNetConnect(ctx C.uintptr_t, dev C.int, trafficClass C.int, handle unsafe.Pointer, sendComm *C.uintptr_t) (res C.ncclResult_t) {
	r := nccl.InternalError
	defer func() { res = C.ncclResult_t(r) }()
	defer recoverResult("connect", &r)
	if handle == nil || sendComm == nil {
		r = fail("connect", nccl.Errorf(nccl.InvalidArgument, "NULL handle or sendComm"))
		return
	}
	*sendComm = 0
	tc := int(trafficClass)
	if ctx != 0 {
		var err error
		if tc, err = trafficClassOf(uintptr(ctx)); err != nil {
			r = fail("connect", err)
			return
		}
	}
	h, rr := netConnect(int(dev), tc, (*nccl.Handle)(handle))
	*sendComm = C.uintptr_t(h)
	r = rr
	return
}

//export goNetAccept
func goNetAccept(listenComm C.uintptr_t, recvComm *C.uintptr_t) (res C.ncclResult_t) {
	r := nccl.InternalError
	defer func() { res = C.ncclResult_t(r) }()
	defer recoverResult("accept", &r)
	if recvComm == nil {
		r = fail("accept", nccl.Errorf(nccl.InvalidArgument, "recvComm is NULL"))
		return
	}
	*recvComm = 0
	h, rr := netAccept(uintptr(listenComm))
	*recvComm = C.uintptr_t(h)
	r = rr
	return
}

//export goNetRegMr
func goNetRegMr(comm C.uintptr_t, data unsafe.Pointer, size C.size_t, typ C.int, mhandle *C.uintptr_t) (res C.ncclResult_t) {
	r := nccl.InternalError
	defer func() { res = C.ncclResult_t(r) }()
	defer recoverResult("regMr", &r)
	if mhandle == nil {
		r = fail("regMr", nccl.Errorf(nccl.InvalidArgument, "mhandle is NULL"))
		return
	}
	*mhandle = 0
	mh, rr := netRegMr(uintptr(comm), data, int(size), int(typ))
	*mhandle = C.uintptr_t(mh)
	r = rr
	return
}

//export goNetRegMrDmaBuf
func goNetRegMrDmaBuf(comm C.uintptr_t, data unsafe.Pointer, size C.size_t, typ C.int, offset C.uint64_t, fd C.int, mhandle *C.uintptr_t) (res C.ncclResult_t) {
	r := nccl.InternalError
	defer func() { res = C.ncclResult_t(r) }()
	defer recoverResult("regMrDmaBuf", &r)
	if mhandle == nil {
		r = fail("regMrDmaBuf", nccl.Errorf(nccl.InvalidArgument, "mhandle is NULL"))
		return
	}
	*mhandle = 0
	mh, rr := netRegMrDmaBuf(uintptr(comm), data, int(size), int(typ), uint64(offset), int(fd))
	*mhandle = C.uintptr_t(mh)
	r = rr
	return
}

//export goNetDeregMr
func goNetDeregMr(comm C.uintptr_t, mhandle C.uintptr_t) (res C.ncclResult_t) {
	r := nccl.InternalError
	defer func() { res = C.ncclResult_t(r) }()
	defer recoverResult("deregMr", &r)
	r = netDeregMr(uintptr(comm), uintptr(mhandle))
	return
}

//export goNetIsend
func goNetIsend(comm C.uintptr_t, data unsafe.Pointer, size C.longlong, tag C.int, mhandle C.uintptr_t, phandle C.uintptr_t, request *C.uintptr_t) (res C.ncclResult_t) {
	r := nccl.InternalError
	defer func() { res = C.ncclResult_t(r) }()
	defer recoverResult("isend", &r)
	if request == nil {
		r = fail("isend", nccl.Errorf(nccl.InvalidArgument, "request is NULL"))
		return
	}
	*request = 0 // NCCL may have preset 0x1; never leave it there
	h, rr := netIsend(uintptr(comm), data, int64(size), int(tag), uintptr(mhandle), uintptr(phandle))
	*request = C.uintptr_t(h)
	r = rr
	return
}

//export goNetIrecv
func goNetIrecv(comm C.uintptr_t, n C.int, data *unsafe.Pointer, sizes64 *C.size_t, sizes32 *C.int, tags *C.int, mhandles *C.uintptr_t, phandles *C.uintptr_t, request *C.uintptr_t) (res C.ncclResult_t) {
	r := nccl.InternalError
	defer func() { res = C.ncclResult_t(r) }()
	defer recoverResult("irecv", &r)
	if request == nil {
		r = fail("irecv", nccl.Errorf(nccl.InvalidArgument, "request is NULL"))
		return
	}
	*request = 0 // NCCL presets 0x1 for LL/LL128; always overwrite
	e, err := lookup(uintptr(comm), tagRecv)
	if err != nil {
		r = fail("irecv", err)
		return
	}
	cnt := int(n)
	if cnt < 1 || cnt > maxABIRecvs || data == nil || (sizes64 == nil && sizes32 == nil) {
		r = e.callFailed("irecv", nccl.Errorf(nccl.InvalidArgument, "bad grouped receive: n=%d (expected 1 to %d) or NULL arrays", cnt, maxABIRecvs))
		return
	}
	dp := unsafe.Slice(data, cnt)
	for i := 0; i < cnt; i++ {
		b := &e.bufs[i]
		b.Data = dp[i]
		if sizes64 != nil {
			b.Size = int(unsafe.Slice(sizes64, cnt)[i])
		} else {
			b.Size = int(unsafe.Slice(sizes32, cnt)[i])
		}
		b.Tag = 0
		if tags != nil {
			b.Tag = int(unsafe.Slice(tags, cnt)[i])
		}
		b.MH = 0
		if mhandles != nil {
			b.MH = nccl.MemHandle(unsafe.Slice(mhandles, cnt)[i])
		}
	}
	var ph []uintptr
	if phandles != nil {
		ph = unsafe.Slice((*uintptr)(unsafe.Pointer(phandles)), cnt)
	}
	h, rr := e.irecv(cnt, ph)
	*request = C.uintptr_t(h)
	r = rr
	return
}

//export goNetIflush
func goNetIflush(comm C.uintptr_t, n C.int, data *unsafe.Pointer, sizes *C.int, mhandles *C.uintptr_t, request *C.uintptr_t) (res C.ncclResult_t) {
	r := nccl.InternalError
	defer func() { res = C.ncclResult_t(r) }()
	defer recoverResult("iflush", &r)
	if request == nil {
		r = fail("iflush", nccl.Errorf(nccl.InvalidArgument, "request is NULL"))
		return
	}
	*request = 0
	e, err := lookup(uintptr(comm), tagRecv)
	if err != nil {
		r = fail("iflush", err)
		return
	}
	cnt := int(n)
	if cnt < 1 || cnt > maxABIRecvs || data == nil || sizes == nil {
		r = e.callFailed("iflush", nccl.Errorf(nccl.InvalidArgument, "bad flush: n=%d (expected 1 to %d) or NULL arrays", cnt, maxABIRecvs))
		return
	}
	dp, sp := unsafe.Slice(data, cnt), unsafe.Slice(sizes, cnt)
	for i := 0; i < cnt; i++ {
		e.bufs[i] = nccl.RecvBuffer{Data: dp[i], Size: int(sp[i])}
		if mhandles != nil {
			e.bufs[i].MH = nccl.MemHandle(unsafe.Slice(mhandles, cnt)[i])
		}
	}
	h, rr := e.iflush(cnt)
	*request = C.uintptr_t(h)
	r = rr
	return
}

//export goNetTest
func goNetTest(request C.uintptr_t, done *C.int, sizes *C.int) (res C.ncclResult_t) {
	r := nccl.InternalError
	defer func() { res = C.ncclResult_t(r) }()
	defer recoverResult("test", &r)
	if done == nil {
		r = fail("test", nccl.Errorf(nccl.InvalidArgument, "done is NULL"))
		return
	}
	*done = 0
	d, rr := netTest(uintptr(request), (*int32)(unsafe.Pointer(sizes)))
	if d {
		*done = 1
	}
	r = rr
	return
}

//export goNetClose
func goNetClose(comm C.uintptr_t, tag C.int) (res C.ncclResult_t) {
	r := nccl.InternalError
	defer func() { res = C.ncclResult_t(r) }()
	defer recoverResult("close", &r)
	r = netClose(uintptr(comm), uint8(tag))
	return
}

//export goNetSetNetAttr
func goNetSetNetAttr(ctx C.uintptr_t, sendPeers, recvPeers C.int) (res C.ncclResult_t) {
	r := nccl.InternalError
	defer func() { res = C.ncclResult_t(r) }()
	defer recoverResult("setNetAttr", &r)
	// Hints only (NCCL sends them per transfer); no transport uses them yet.
	log.Tracef(nccl.SubsysNet, "NET/Go : setNetAttr ctx %#x maxConcurrentPeers send %d recv %d", uintptr(ctx), int(sendPeers), int(recvPeers))
	r = nccl.Success
	return
}
