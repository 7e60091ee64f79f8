package plugin

import (
	"fmt"
	"unsafe"

	"github.com/libnccl-net-go/libnccl-net-go/metrics"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// countMetrics is NCCL_GO_METRICS (default on); off leaves only the transport's
// own work on the data path, for measuring what counting costs.
var countMetrics = true

// reqState is the glue's view of one in-flight request, indexed by the
// transport's request id. Only NCCL's progress thread for the comm touches it.
type reqState struct {
	active   bool
	flush    bool
	n        int32 // buffers of a grouped receive
	size     int64 // bytes posted (send) or capacity (receive)
	start    int64 // metrics.Now() at post
	nextWarn int64 // stall WARN schedule
	period   int64
	stalled  bool
	events   int8 // profiler events started (0..maxProfEvents)
}

const maxProfEvents = 8

// commEntry is a listen, send or recv comm as the glue tracks it.
type commEntry struct {
	tag      uint8
	slot     uint32
	gen      uint32
	dev      int
	listener nccl.Listener
	comm     nccl.Comm
	send     nccl.SendComm
	recv     nccl.RecvComm
	m        *metrics.Device
	peer     string

	reqs   []reqState
	events [][maxProfEvents]uintptr // profiler event handles, allocated when a profiler is present
	bufs   [maxABIRecvs]nccl.RecvBuffer
	sizes  [maxABIRecvs]int
}

func newDataEntry(tag uint8, dev int) *commEntry {
	return &commEntry{tag: tag, dev: dev, m: deviceMetrics(dev), reqs: make([]reqState, nccl.MaxRequestID+1)}
}

func (e *commEntry) register() (uintptr, error) {
	slot, gen, ok := comms.add(e)
	if !ok {
		return 0, nccl.Errorf(nccl.InternalError, "too many open comms (%d)", maxSlots)
	}
	e.slot, e.gen = slot, gen
	if pa, ok := e.comm.(nccl.PeerAddresser); ok && e.comm != nil {
		e.peer = pa.PeerAddr()
	}
	if e.peer == "" {
		e.peer = "unknown peer"
	}
	return commHandle(e.tag, gen, slot), nil
}

// lookup resolves a comm handle from NCCL. It is on the data path: two atomic
// loads and a few compares, no locks.
func lookup(h uintptr, want uint8) (*commEntry, error) {
	tag, gen, slot := splitCommHandle(h)
	if tag != want {
		return nil, badHandle(h, want)
	}
	e := comms.get(slot)
	if e == nil || e.gen != gen || e.tag != want {
		return nil, badHandle(h, want)
	}
	return e, nil
}

func badHandle(h uintptr, want uint8) error {
	kind := map[uint8]string{tagSend: "send comm", tagRecv: "recv comm", tagListen: "listen comm"}[want]
	return nccl.Errorf(nccl.InternalError, "invalid or closed %s handle %#x", kind, h)
}

// lookupAny resolves a send or recv comm (regMr takes either).
func lookupAny(h uintptr) (*commEntry, error) {
	tag, _, _ := splitCommHandle(h)
	if tag == tagSend || tag == tagRecv {
		return lookup(h, tag)
	}
	return nil, nccl.Errorf(nccl.InternalError, "invalid comm handle %#x", h)
}

func (e *commEntry) dir() metrics.Dir {
	if e.tag == tagSend {
		return metrics.Send
	}
	return metrics.Recv
}

func (e *commEntry) deviceName() string { return e.m.Name }

// startReq records a request the transport accepted.
func (e *commEntry) startReq(id nccl.Request, flush bool, n int, size int64) (*reqState, error) {
	if id < 0 || id > nccl.MaxRequestID {
		return nil, nccl.Errorf(nccl.InternalError, "transport returned request id %d outside [0,%d]", id, nccl.MaxRequestID)
	}
	r := &e.reqs[id]
	if r.active {
		return nil, nccl.Errorf(nccl.InternalError, "transport reused request id %d while it was still in flight", id)
	}
	*r = reqState{active: true, flush: flush, n: int32(n), size: size}
	if countMetrics || stallWarn > 0 {
		r.start = metrics.Now()
		r.nextWarn = r.start + stallWarn
		r.period = stallWarn
	}
	if countMetrics {
		e.m.RequestPosted(e.dir())
	}
	return r, nil
}

// abandonRequests settles the books for requests NCCL will never test (close
// during ncclCommAbort).
func (e *commEntry) abandonRequests() {
	for id := range e.reqs {
		r := &e.reqs[id]
		if !r.active {
			continue
		}
		r.active = false
		if countMetrics {
			e.m.RequestAbandoned(e.dir())
		}
		e.profStopAll(id, r)
	}
}

func (e *commEntry) requestHandle(id nccl.Request, flush bool) uintptr {
	return requestHandle(e.gen, e.slot, int32(id), flush)
}

func netRegMr(h uintptr, data unsafe.Pointer, size int, ptrType int) (uintptr, nccl.Result) {
	e, err := lookupAny(h)
	if err != nil {
		return 0, fail("regMr", err)
	}
	if size < 0 {
		return 0, fail("regMr", nccl.Errorf(nccl.InvalidArgument, "negative size %d", size))
	}
	mh, err := e.comm.RegMr(data, size, nccl.PtrType(ptrType))
	if err != nil {
		return 0, fail("regMr", err)
	}
	return uintptr(mh), nccl.Success
}

func netRegMrDmaBuf(h uintptr, data unsafe.Pointer, size int, ptrType int, offset uint64, fd int) (uintptr, nccl.Result) {
	e, err := lookupAny(h)
	if err != nil {
		return 0, fail("regMrDmaBuf", err)
	}
	reg, ok := e.comm.(nccl.DMABufRegistrar)
	if !ok {
		return 0, fail("regMrDmaBuf", nccl.Errorf(nccl.InternalError, "device %s does not support dma-buf registration (ptrSupport has no NCCL_PTR_DMABUF); set NCCL_DMABUF_ENABLE=0", e.deviceName()))
	}
	mh, err := reg.RegMrDMABuf(data, size, nccl.PtrType(ptrType), offset, fd)
	if err != nil {
		return 0, fail("regMrDmaBuf", err)
	}
	return uintptr(mh), nccl.Success
}

func netDeregMr(h uintptr, mh uintptr) nccl.Result {
	if mh == 0 {
		return nccl.Success // NCCL deregisters failed (NULL) registrations too
	}
	e, err := lookupAny(h)
	if err != nil {
		return fail("deregMr", err)
	}
	if err := e.comm.DeregMr(nccl.MemHandle(mh)); err != nil {
		return fail("deregMr", err)
	}
	return nccl.Success
}

// netIsend posts a send. req is 0 when the transport asks NCCL to retry.
func netIsend(h uintptr, data unsafe.Pointer, size int64, tag int, mh uintptr, phandle uintptr) (uintptr, nccl.Result) {
	e, err := lookup(h, tagSend)
	if err != nil {
		return 0, fail("isend", err)
	}
	if size < 0 || size > nccl.MaxNetSize {
		return 0, e.callFailed("isend", nccl.Errorf(nccl.InvalidArgument, "message size %d outside [0, %d]", size, int64(nccl.MaxNetSize)))
	}
	id, err := e.send.Isend(data, int(size), tag, nccl.MemHandle(mh))
	if err != nil {
		return 0, e.callFailed("isend", err)
	}
	if id == nccl.NoRequest {
		return 0, nccl.Success
	}
	r, err := e.startReq(id, false, 1, size)
	if err != nil {
		return 0, e.callFailed("isend", err)
	}
	if phandle != 0 {
		e.profStart(int(id), r, phandle, profSend, size, tag)
	}
	return e.requestHandle(id, false), nccl.Success
}

// netIrecv posts a grouped receive whose buffers the cgo layer already copied
// into e.bufs[:n]; phandles has n entries or is nil.
func (e *commEntry) irecv(n int, phandles []uintptr) (uintptr, nccl.Result) {
	if n < 1 || n > maxABIRecvs {
		return 0, e.callFailed("irecv", nccl.Errorf(nccl.InvalidArgument, "grouped receive of %d buffers; expected 1 to %d", n, maxABIRecvs))
	}
	var total int64
	for i := 0; i < n; i++ {
		if e.bufs[i].Size < 0 || e.bufs[i].Size > nccl.MaxNetSize {
			return 0, e.callFailed("irecv", nccl.Errorf(nccl.InvalidArgument, "receive buffer %d has size %d outside [0, %d]", i, e.bufs[i].Size, int64(nccl.MaxNetSize)))
		}
		total += int64(e.bufs[i].Size)
	}
	id, err := e.recv.Irecv(e.bufs[:n])
	if err != nil {
		return 0, e.callFailed("irecv", err)
	}
	if id == nccl.NoRequest {
		return 0, nccl.Success
	}
	r, err := e.startReq(id, false, n, total)
	if err != nil {
		return 0, e.callFailed("irecv", err)
	}
	for i, ph := range phandles {
		if ph != 0 {
			e.profStart(int(id), r, ph, profRecv, int64(e.bufs[i].Size), e.bufs[i].Tag)
		}
	}
	return e.requestHandle(id, false), nccl.Success
}

// iflush flushes e.bufs[:n] (Size = bytes received).
func (e *commEntry) iflush(n int) (uintptr, nccl.Result) {
	if n < 1 || n > maxABIRecvs {
		return 0, e.callFailed("iflush", nccl.Errorf(nccl.InvalidArgument, "flush of %d buffers; expected 1 to %d", n, maxABIRecvs))
	}
	id, err := e.recv.Iflush(e.bufs[:n])
	if err != nil {
		return 0, e.callFailed("iflush", err)
	}
	if id == nccl.NoRequest {
		return 0, nccl.Success // NCCL counts a NULL flush request as done
	}
	if _, err := e.startReq(id, true, n, 0); err != nil {
		return 0, e.callFailed("iflush", err)
	}
	if countMetrics {
		e.m.Flushed()
	}
	return e.requestHandle(id, true), nccl.Success
}

func (e *commEntry) callFailed(call string, err error) nccl.Result {
	res := nccl.ResultOf(err)
	if countMetrics {
		e.m.CallFailed(e.dir(), metrics.KindOf(res))
	}
	log.Warnf("NET/Go : %s on %s comm with %s (device %s) failed: %v (%v)", call, e.dir(), e.peer, e.deviceName(), err, res)
	return res
}

// netTest tests a request. sizes (NCCL's int array, may be nil) receives one
// int per buffer of a receive, or one for a send.
func netTest(req uintptr, sizes *int32) (done bool, res nccl.Result) {
	ok, gen16, slot, id, flush := splitRequestHandle(req)
	if !ok {
		return false, fail("test", nccl.Errorf(nccl.InternalError, "invalid request handle %#x", req))
	}
	e := comms.get(slot)
	if e == nil || e.gen&0xffff != gen16 || (e.tag != tagSend && e.tag != tagRecv) {
		return false, fail("test", nccl.Errorf(nccl.InternalError, "request %#x belongs to a closed comm", req))
	}
	r := &e.reqs[id]
	if !r.active || r.flush != flush {
		return false, fail("test", nccl.Errorf(nccl.InternalError, "request %#x is not in flight (already reported done?)", req))
	}
	var err error
	var sent int
	if e.tag == tagSend {
		done, sent, err = e.send.Test(nccl.Request(id))
	} else {
		n := int(r.n)
		var out []int
		if !flush {
			out = e.sizes[:n]
		}
		done, err = e.recv.Test(nccl.Request(id), out)
	}
	if err != nil {
		r.active = false
		res = nccl.ResultOf(err)
		if countMetrics {
			e.m.RequestFailed(e.dir(), metrics.KindOf(res))
		}
		e.profStopAll(int(id), r)
		log.Warnf("NET/Go : %s request of %d bytes with %s (device %s) failed: %v (%v)", e.dir(), r.size, e.peer, e.deviceName(), err, res)
		return false, res
	}
	if !done {
		if stallWarn > 0 {
			e.checkStall(r)
		}
		return false, nccl.Success
	}
	r.active = false
	var bytes int
	if e.tag == tagSend {
		bytes = sent
		if sizes != nil {
			*sizes = int32(sent)
		}
	} else if !flush {
		var out []int32
		if sizes != nil {
			out = unsafe.Slice(sizes, int(r.n))
		}
		for i := 0; i < int(r.n); i++ {
			bytes += e.sizes[i]
			if out != nil {
				out[i] = int32(e.sizes[i])
			}
		}
	}
	if countMetrics && !flush {
		e.m.RequestDone(e.dir(), bytes, r.start)
	} else if countMetrics {
		e.m.RequestAbandoned(e.dir()) // a flush moves no bytes; only settle in-flight
	}
	if r.stalled {
		log.Warnf("NET/Go : stalled %s request of %d bytes with %s (device %s) completed after %.1fs",
			e.dir(), r.size, e.peer, e.deviceName(), float64(metrics.Now()-r.start)/1e9)
	}
	e.profStopAll(int(id), r)
	return true, nccl.Success
}

func (e *commEntry) checkStall(r *reqState) {
	now := metrics.Now()
	if now < r.nextWarn {
		return
	}
	if !r.stalled {
		r.stalled = true
		if countMetrics {
			e.m.Stalled(e.dir())
		}
	}
	log.Warnf("NET/Go : %s request of %d bytes with %s (device %s) pending for %.1fs; the peer may be stuck or gone (NCCL_GO_STALL_WARN sets this threshold)",
		e.dir(), r.size, e.peer, e.deviceName(), float64(now-r.start)/1e9)
	r.period *= 2
	if r.period > maxStallPeriod {
		r.period = maxStallPeriod
	}
	r.nextWarn = now + r.period
}

// String is for debugging handles in WARNs.
func (e *commEntry) String() string { return fmt.Sprintf("%s comm slot %d", e.dir(), e.slot) }
