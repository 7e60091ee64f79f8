package plugin

import (
	"unsafe"

	"github.com/libnccl-net-go/libnccl-net-go/internal/clock"
	"github.com/libnccl-net-go/libnccl-net-go/metrics"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// The data path: isend, irecv, iflush and test run on NCCL's progress thread
// for the comm, in a tight polling loop. Each is a handle lookup (two atomic
// loads), a request slot from the comm's own table, the transport's call and
// a few counter updates: no lock, no allocation, no goroutine.

// postReq records a request the transport accepted in slot idx.
func (e *commEntry) postReq(idx int, id nccl.Request, flush bool, n int, size int64) *reqState {
	r := &e.reqs.slots[idx]
	// Field by field: the slot keeps its generation, and events is already 0
	// (profStopAll runs whenever a request ends).
	r.id, r.active, r.flush, r.stalled, r.n, r.size = id, true, flush, false, int32(n), size
	if e.counting || e.stallWarn > 0 {
		r.start = clock.Now()
		r.warn.start(r.start, e.stallWarn)
	}
	if e.counting {
		e.m.RequestPosted(e.dir())
	}
	return r
}

// refused handles a post the transport did not take into slot idx (err set,
// or id < 0): the slot is freed and the result is NCCL's answer, success with
// a NULL request (retry) for nccl.NoRequest, else the error. Off the fast
// path, which is one comparison.
func (e *commEntry) refused(call string, idx int, id nccl.Request, err error) nccl.Result {
	e.reqs.release(idx)
	if err == nil && id != nccl.NoRequest {
		err = nccl.Errorf(nccl.InternalError, "transport returned request id %d; ids are non-negative (nccl.NoRequest asks NCCL to retry)", id)
	}
	if err != nil {
		return e.callFailed(call, err)
	}
	return nccl.Success
}

// abandonRequests settles the books for requests NCCL will never test (close
// during ncclCommAbort). It runs on the service thread after NCCL stopped the
// comm's progress thread.
func (e *commEntry) abandonRequests() {
	for idx := range e.reqs.slots {
		r := &e.reqs.slots[idx]
		if !r.active {
			continue
		}
		if e.counting {
			e.m.RequestAbandoned(e.dir())
		}
		e.profStopAll(idx, r)
		e.reqs.release(idx)
	}
}

func (e *commEntry) requestHandle(idx int) uintptr {
	return requestHandle(e.gen, e.slot, e.reqs.slots[idx].gen, idx)
}

func netRegMr(h uintptr, data unsafe.Pointer, size int, ptrType int) (uintptr, nccl.Result) {
	if _, err := acquire(); err != nil {
		return 0, fail("regMr", err)
	}
	defer state.mu.RUnlock()
	e, err := lookupAny(h)
	if err != nil {
		return 0, fail("regMr", err)
	}
	if err := checkRegRange(data, size); err != nil {
		return 0, fail("regMr", err)
	}
	mh, err := e.comm.RegMr(data, size, nccl.PtrType(ptrType))
	if err != nil {
		return 0, fail("regMr", err)
	}
	return uintptr(mh), nccl.Success
}

func netRegMrDmaBuf(h uintptr, data unsafe.Pointer, size int, ptrType int, offset uint64, fd int) (uintptr, nccl.Result) {
	if _, err := acquire(); err != nil {
		return 0, fail("regMrDmaBuf", err)
	}
	defer state.mu.RUnlock()
	e, err := lookupAny(h)
	if err != nil {
		return 0, fail("regMrDmaBuf", err)
	}
	if err := checkRegRange(data, size); err != nil {
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

// checkRegRange rejects a registration no memory can back: a size_t of 2^63
// or more (negative once converted to int) or a range past the end of the
// address space. A wrapping range used to reach the transport: ib's MR cache
// took its small wrapped end for a hit on any registration below it and
// returned a handle for memory it never covered.
func checkRegRange(data unsafe.Pointer, size int) error {
	if size < 0 {
		return nccl.Errorf(nccl.InvalidArgument, "size %d (as size_t: %d) is larger than any buffer", size, uint64(size))
	}
	if uintptr(size) > ^uintptr(0)-uintptr(data) {
		return nccl.Errorf(nccl.InvalidArgument, "range %p + %d bytes wraps past the end of the address space", data, size)
	}
	return nil
}

func netDeregMr(h uintptr, mh uintptr) nccl.Result {
	if mh == 0 {
		return nccl.Success // NCCL deregisters failed (NULL) registrations too
	}
	if _, err := acquire(); err != nil {
		return fail("deregMr", err)
	}
	defer state.mu.RUnlock()
	e, err := lookupAny(h)
	if err != nil {
		return fail("deregMr", err)
	}
	if err := e.comm.DeregMr(nccl.MemHandle(mh)); err != nil {
		return fail("deregMr", err)
	}
	return nccl.Success
}

// netIsend posts a send. The request is 0 when NCCL must retry: the transport
// cannot start the send yet, or the comm's request slots are all in flight.
func netIsend(h uintptr, data unsafe.Pointer, size int64, tag int, mh uintptr, phandle uintptr) (uintptr, nccl.Result) {
	e, err := lookup(h, tagSend)
	if err != nil {
		return 0, fail("isend", err)
	}
	if size < 0 || size > nccl.MaxNetSize {
		return 0, e.callFailed("isend", nccl.Errorf(nccl.InvalidArgument, "message size %d outside [0, %d]", size, int64(nccl.MaxNetSize)))
	}
	if data == nil && size > 0 {
		// The socket transport would fail the whole connection with EFAULT
		// ("bad address"), naming no culprit.
		return 0, e.callFailed("isend", nccl.Errorf(nccl.InvalidArgument, "NULL buffer for a message of %d bytes", size))
	}
	idx, ok := e.reqs.alloc()
	if !ok {
		return 0, nccl.Success
	}
	id, err := e.send.Isend(data, int(size), tag, nccl.MemHandle(mh))
	refreshSchedPosted(id, err)
	if err != nil || id < 0 {
		if err == nil && id == nccl.NoRequest && e.stallWarn > 0 {
			// Only a refusal with nothing else in flight is this comm's
			// whole story; pending requests have their own stall checks.
			if len(e.reqs.slots)-e.reqs.nfree == 1 {
				e.waitRefused(size)
			} else if e.wait.since != 0 && !e.wait.warned {
				e.wait = sendWait{}
			}
		}
		return 0, e.refused("isend", idx, id, err)
	}
	if e.wait.since != 0 {
		e.waitOver()
	}
	r := e.postReq(idx, id, false, 1, size)
	if phandle != 0 {
		e.profStart(idx, r, phandle, profSend, size, tag)
	}
	return e.requestHandle(idx), nccl.Success
}

// checkRecvCount and setRecvBuf are the one check of a grouped receive's (or
// flush's) arguments, made as NCCL's call enters the glue: n within the
// device's MaxRecvs, every size in [0, MaxNetSize], a NULL buffer only for 0
// bytes. irecv, iflush and the transport trust what passed.
func (e *commEntry) checkRecvCount(call string, n int) error {
	if n < 1 || n > e.maxRecvs {
		return nccl.Errorf(nccl.InvalidArgument, "%s of %d buffers; device %s takes 1 to %d (its maxRecvs)", call, n, e.deviceName(), e.maxRecvs)
	}
	return nil
}

func (e *commEntry) setRecvBuf(call string, i int, data unsafe.Pointer, size int64, tag int, mh uintptr) error {
	if size < 0 || size > nccl.MaxNetSize {
		return nccl.Errorf(nccl.InvalidArgument, "%s buffer %d has size %d outside [0, %d]", call, i, size, int64(nccl.MaxNetSize))
	}
	if data == nil && size > 0 {
		// Only a 0-byte buffer may be NULL. The socket transport read a
		// message for a NULL buffer and discarded it, and test reported
		// its size as received.
		return nccl.Errorf(nccl.InvalidArgument, "%s buffer %d is NULL with size %d", call, i, size)
	}
	e.bufs[i] = nccl.RecvBuffer{Data: data, Size: int(size), Tag: tag, MH: nccl.MemHandle(mh)}
	return nil
}

// irecv posts a grouped receive of the n buffers in e.bufs (checked above);
// phandles has n entries or is nil.
func (e *commEntry) irecv(n int, phandles []uintptr) (uintptr, nccl.Result) {
	idx, ok := e.reqs.alloc()
	if !ok {
		return 0, nccl.Success
	}
	id, err := e.recv.Irecv(e.bufs[:n])
	refreshSchedPosted(id, err)
	if err != nil || id < 0 {
		return 0, e.refused("irecv", idx, id, err)
	}
	var total int64
	for i := 0; i < n; i++ {
		total += int64(e.bufs[i].Size)
	}
	r := e.postReq(idx, id, false, n, total)
	for i, ph := range phandles {
		if ph != 0 {
			e.profStart(idx, r, ph, profRecv, int64(e.bufs[i].Size), e.bufs[i].Tag)
		}
	}
	return e.requestHandle(idx), nccl.Success
}

// iflush flushes e.bufs[:n] (Size = bytes received), checked as for irecv.
func (e *commEntry) iflush(n int) (uintptr, nccl.Result) {
	idx, ok := e.reqs.alloc()
	if !ok {
		// NCCL counts a NULL flush request as done, so a full table cannot
		// answer NULL as isend and irecv do: the GPU would read unflushed data.
		return 0, e.callFailed("iflush", nccl.Errorf(nccl.InternalError, "all %d request slots of this comm are in flight; a flush cannot wait for one", len(e.reqs.slots)))
	}
	id, err := e.recv.Iflush(e.bufs[:n])
	refreshSchedPosted(id, err)
	// A NULL flush request from the transport is one NCCL counts as done.
	if err != nil || id < 0 {
		return 0, e.refused("iflush", idx, id, err)
	}
	e.postReq(idx, id, true, n, 0)
	if e.counting {
		e.m.Flushed()
	}
	return e.requestHandle(idx), nccl.Success
}

func (e *commEntry) callFailed(call string, err error) nccl.Result {
	res := nccl.ResultOf(err)
	if e.counting {
		e.m.CallFailed(e.dir(), metrics.KindOf(res))
	}
	log.Warnf("NET/Go : %s on %s comm with %s (device %s) failed: %v (%v)", call, e.dir(), e.peer, e.deviceName(), err, res)
	return res
}

// lookupRequest resolves a request handle from NCCL. Anything NCCL may hand
// back wrongly (a forged value, NCCL's 0x1 marker, a request already reported
// done, one of a closed comm) is an ncclInvalidArgument, never a panic.
func lookupRequest(req uintptr) (*commEntry, int, error) {
	ok, commGen, commSlot, gen, idx := splitRequestHandle(req)
	if !ok {
		return nil, 0, nccl.Errorf(nccl.InvalidArgument, "%#x is not a request handle of this plugin", req)
	}
	// The handle carries 16 bits of the comm's generation: compare those.
	e, gen32 := comms.Peek(commSlot)
	if e == nil || gen32&0xffff != commGen || (e.tag != tagSend && e.tag != tagRecv) {
		return nil, 0, nccl.Errorf(nccl.InvalidArgument, "request %#x belongs to a closed or unknown comm", req)
	}
	if idx >= len(e.reqs.slots) {
		return nil, 0, nccl.Errorf(nccl.InvalidArgument, "request %#x names slot %d; its comm has %d", req, idx, len(e.reqs.slots))
	}
	if r := &e.reqs.slots[idx]; !r.active || r.gen != gen {
		return nil, 0, nccl.Errorf(nccl.InvalidArgument, "request %#x is not in flight (reported done already, or abandoned at close)", req)
	}
	return e, idx, nil
}

// netTest tests a request. sizes (NCCL's int array, may be nil) receives one
// int per buffer of a receive, or one for a send.
func netTest(req uintptr, sizes *int32) (done bool, res nccl.Result) {
	e, idx, err := lookupRequest(req)
	if err != nil {
		return false, fail("test", err)
	}
	r := &e.reqs.slots[idx]
	refreshSched()
	var sent int
	if e.tag == tagSend {
		done, sent, err = e.send.Test(r.id)
	} else {
		var out []int
		if !r.flush {
			out = e.sizes[:r.n]
		}
		done, err = e.recv.Test(r.id, out)
	}
	if err != nil {
		res = nccl.ResultOf(err)
		if e.counting {
			e.m.RequestFailed(e.dir(), metrics.KindOf(res))
		}
		log.Warnf("NET/Go : %s request of %d bytes with %s (device %s) failed: %v (%v)", e.dir(), r.size, e.peer, e.deviceName(), err, res)
		e.profStopAll(idx, r)
		e.reqs.release(idx)
		return false, res
	}
	if !done {
		// The stall check reads the clock. NCCL's proxy tests a pending
		// request about a million times a second; a WARN due after seconds
		// is found as well when every 32nd test looks for it.
		if e.stallWarn > 0 {
			if r.polls++; r.polls%stallCheckEvery == 0 {
				e.checkStall(r)
			}
		}
		return false, nccl.Success
	}
	var bytes int
	if e.tag == tagSend {
		bytes = sent
		if sizes != nil {
			*sizes = int32(sent)
		}
	} else if !r.flush {
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
	if e.counting && !r.flush {
		e.m.RequestDone(e.dir(), bytes, r.start)
	} else if e.counting {
		e.m.RequestAbandoned(e.dir()) // a flush moves no bytes; only settle in-flight
	}
	if r.stalled {
		log.Warnf("NET/Go : stalled %s request of %d bytes with %s (device %s) completed after %.1fs",
			e.dir(), r.size, e.peer, e.deviceName(), float64(clock.Now()-r.start)/1e9)
	}
	e.profStopAll(idx, r)
	e.reqs.release(idx)
	return true, nccl.Success
}

// sendWait follows a run of isends the transport refused (nccl.NoRequest)
// while the comm had no request in flight: a send that waits for the
// receiver's clear-to-send (ib, shm) is no request yet, so no stall check of
// a request covers it, and a receiver that posts nothing would otherwise
// leave both sides silent. Progress thread only.
type sendWait struct {
	since    int64  // clock at the run's first refusal whose time was read; 0: no run
	refusals uint32 // in this run; the clock is read every waitClockEvery
	warn     stallSchedule
	warned   bool
	size     int64 // of the send being refused, for the WARN
}

const waitClockEvery = 64

// waitRefused counts one refused isend of size bytes.
func (e *commEntry) waitRefused(size int64) {
	w := &e.wait
	if w.refusals++; w.refusals%waitClockEvery != 1 {
		return
	}
	t := clock.Now()
	if w.since == 0 {
		w.since, w.size = t, size
		w.warn.start(t, e.stallWarn)
		return
	}
	if !w.warn.due(t) {
		return
	}
	if !w.warned {
		w.warned = true
		if e.counting {
			e.m.Stalled(metrics.Send)
		}
	}
	log.Warnf("NET/Go : send of %d bytes to %s (device %s) refused by the transport for %.1fs: the receiver has not posted a receive for it; the peer may be stuck or gone (NCCL_GO_STALL_WARN sets this threshold)",
		w.size, e.peer, e.deviceName(), float64(t-w.since)/1e9)
}

// waitOver ends a run of refusals: an isend was accepted.
func (e *commEntry) waitOver() {
	if e.wait.warned {
		log.Warnf("NET/Go : send of %d bytes to %s (device %s) accepted after %.1fs of refusals",
			e.wait.size, e.peer, e.deviceName(), float64(clock.Now()-e.wait.since)/1e9)
	}
	e.wait = sendWait{}
}

// stallCheckEvery: the stall check runs on every stallCheckEvery-th test of
// a pending request.
const stallCheckEvery = 32

func (e *commEntry) checkStall(r *reqState) {
	t := clock.Now()
	if !r.warn.due(t) {
		return
	}
	if !r.stalled {
		r.stalled = true
		if e.counting {
			e.m.Stalled(e.dir())
		}
	}
	log.Warnf("NET/Go : %s request of %d bytes with %s (device %s) pending for %.1fs; the peer may be stuck or gone (NCCL_GO_STALL_WARN sets this threshold)",
		e.dir(), r.size, e.peer, e.deviceName(), float64(t-r.start)/1e9)
}

// stallSchedule is when a stall WARN is due: first NCCL_GO_STALL_WARN after
// the start, then at doubling intervals up to maxStallPeriod. Shared by
// pending requests and runs of refused sends.
type stallSchedule struct{ next, period int64 }

func (s *stallSchedule) start(t, first int64) { s.next, s.period = t+first, first }

// due reports whether a WARN is due at t and, if so, schedules the next.
func (s *stallSchedule) due(t int64) bool {
	if t < s.next {
		return false
	}
	s.period = min(2*s.period, maxStallPeriod)
	s.next = t + s.period
	return true
}
