package plugin

import (
	"fmt"
	"sync"

	"github.com/libnccl-net-go/libnccl-net-go/internal/slots"
	"github.com/libnccl-net-go/libnccl-net-go/internal/testhook"
	"github.com/libnccl-net-go/libnccl-net-go/internal/timeout"
	"github.com/libnccl-net-go/libnccl-net-go/metrics"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

const maxProfEvents = 8

// commEntry is a listen, send or recv comm as the glue tracks it. Everything
// but the request table is set before the entry is published and never
// changes; the request table belongs to the comm's progress thread.
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
	// ctx is the v11+ context a listen comm was made under (0: none). Its
	// finalize closes the listen comms NCCL left open (see finalizeListens).
	ctx uintptr

	// Copied at connect/accept so that the data path reads nothing init may
	// be writing on another thread: the settings of the first init, NCCL's
	// profiler callback (nil: none), the device's largest grouped receive.
	counting  bool
	stallWarn int64
	prof      profilerHooks
	maxRecvs  int

	reqs   reqTable
	events [][maxProfEvents]uintptr // per request slot; nil without a profiler
	wait   sendWait                 // isends the transport keeps refusing (send comms)
	bufs   [maxABIRecvs]nccl.RecvBuffer
	sizes  [maxABIRecvs]int
}

// openDataComm publishes a send (tag S) or recv (tag R) comm the transport
// just made; the caller holds state.mu shared. On failure the comm is closed.
func openDataComm(t nccl.Transport, tag uint8, dev int, c nccl.Comm) (uintptr, error) {
	m, maxRecvs := deviceInfo(t, dev)
	e := &commEntry{tag: tag, dev: dev, m: m, maxRecvs: maxRecvs, comm: c,
		counting: state.countMetrics, stallWarn: state.stallWarn, prof: currentProfiler()}
	if tag == tagSend {
		e.send = c.(nccl.SendComm)
	} else {
		e.recv = c.(nccl.RecvComm)
	}
	e.reqs = newReqTable(reqCapacity(maxRecvs))
	if e.prof != nil {
		e.events = make([][maxProfEvents]uintptr, len(e.reqs.slots))
	}
	h, err := e.register()
	if err != nil {
		_ = c.Close()
		setupFailed(t, dev, e.dir(), err)
		return 0, err
	}
	if e.counting {
		e.m.ConnOpened(e.dir())
	}
	return h, nil
}

// setupFailed counts a failed connect or accept against dev (unless
// NCCL_GO_METRICS=0, which leaves every counter at 0).
func setupFailed(t nccl.Transport, dev int, dir metrics.Dir, err error) {
	if !state.countMetrics {
		return
	}
	m, _ := deviceInfo(t, dev)
	m.CallFailed(dir, metrics.KindOf(nccl.ResultOf(err)))
}

func (e *commEntry) register() (uintptr, error) {
	if pa, ok := e.comm.(nccl.PeerAddresser); ok && e.comm != nil {
		e.peer = pa.PeerAddr()
	}
	if e.peer == "" {
		e.peer = "unknown peer"
	}
	r, ok := comms.Add(e)
	if !ok {
		return 0, nccl.Errorf(nccl.InternalError, "too many open comms (%d)", maxSlots)
	}
	// NCCL cannot use the handle before it is returned, so nothing resolves
	// e before these are set.
	e.slot, e.gen = r.Slot, r.Gen
	return commHandle(e.tag, r.Gen, r.Slot), nil
}

// lookup resolves a comm handle from NCCL. It is on the data path: two atomic
// loads and a few compares, no locks.
func lookup(h uintptr, want uint8) (*commEntry, error) {
	tag, gen, slot := splitCommHandle(h)
	if tag != want {
		return nil, badHandle(h, want)
	}
	e := comms.Get(slots.Ref{Slot: slot, Gen: gen})
	if e == nil || e.tag != want {
		return nil, badHandle(h, want)
	}
	return e, nil
}

func badHandle(h uintptr, want uint8) error {
	return nccl.Errorf(nccl.InvalidArgument, "%#x is not an open %s of this plugin (closed already, or never returned by it)", h, kindName(want))
}

func kindName(tag uint8) string {
	switch tag {
	case tagSend:
		return "send comm"
	case tagRecv:
		return "recv comm"
	case tagListen:
		return "listen comm"
	}
	return "comm"
}

// lookupAny resolves a send or recv comm (regMr takes either).
func lookupAny(h uintptr) (*commEntry, error) {
	tag, _, _ := splitCommHandle(h)
	if tag == tagSend || tag == tagRecv {
		return lookup(h, tag)
	}
	return nil, nccl.Errorf(nccl.InvalidArgument, "%#x is not a send or recv comm of this plugin", h)
}

func (e *commEntry) dir() metrics.Dir {
	if e.tag == tagSend {
		return metrics.Send
	}
	return metrics.Recv
}

func (e *commEntry) deviceName() string { return e.m.Name }

// netListenCtx is listen; ctx is the v11+ context NCCL passed (0 before v11).
func netListenCtx(ctx uintptr, dev int, handle *nccl.Handle) (uintptr, nccl.Result) {
	h, res, withdrew := listenUnder(ctx, dev, handle)
	if withdrew && state.finalizePending.Load() && comms.Len() == 0 {
		// The last context's finalize found this comm open and left the
		// transport to the last close; this was it.
		finalizeIfIdle()
	}
	return h, res
}

// listenStep lets tests stop a listen between its steps ("checked": its
// context looked up; "registered": its comm in the table), to run a finalize
// or a close there.
var listenStep = testhook.New[func(step string)](nil)

// listenUnder is netListenCtx with state.mu held shared; withdrew is true
// when the comm was registered and then closed again because ctx was
// finalized meanwhile.
func listenUnder(ctx uintptr, dev int, handle *nccl.Handle) (uintptr, nccl.Result, bool) {
	if ctx != 0 {
		if _, _, err := lookupCtx(ctx); err != nil {
			return 0, fail("listen", err), false
		}
	}
	if f := listenStep.Get(); f != nil {
		f("checked")
	}
	t, err := acquire()
	if err != nil {
		return 0, fail("listen", err), false
	}
	defer state.mu.RUnlock()
	if err := checkDev(t, dev); err != nil {
		return 0, fail("listen", err), false
	}
	l, err := t.Listen(dev, handle)
	if err != nil {
		return 0, fail("listen", err), false
	}
	e := &commEntry{tag: tagListen, dev: dev, listener: l, ctx: ctx}
	h, err := e.register()
	if err != nil {
		_ = l.Close()
		return 0, fail("listen", err), false
	}
	if f := listenStep.Get(); f != nil {
		f("registered")
	}
	if ctx != 0 {
		// A finalize of ctx that ran since the check above did not see
		// this comm (register, then look, against its remove, then
		// range: one of the two sees the other). Nothing would close it.
		if _, _, err := lookupCtx(ctx); err != nil {
			removeAndClose(t, e, slots.Ref{Slot: e.slot, Gen: e.gen}, "listen")
			return 0, fail("listen", err), true
		}
	}
	return h, nccl.Success, false
}

func netConnect(dev int, trafficClass int, handle *nccl.Handle) (uintptr, nccl.Result) {
	t, err := acquire()
	if err != nil {
		return 0, fail("connect", err)
	}
	defer state.mu.RUnlock()
	if err := checkDev(t, dev); err != nil {
		return 0, fail("connect", err)
	}
	sc, err := t.Connect(dev, handle, nccl.ConnectOptions{TrafficClass: trafficClass})
	if err != nil {
		setupFailed(t, dev, metrics.Send, err)
		return 0, fail("connect", err)
	}
	if sc == nil {
		return 0, nccl.Success // not ready; NCCL calls again with the same handle
	}
	h, err := openDataComm(t, tagSend, dev, sc)
	if err != nil {
		return 0, fail("connect", err)
	}
	return h, nccl.Success
}

func netAccept(listenH uintptr) (uintptr, nccl.Result) {
	t, err := acquire()
	if err != nil {
		return 0, fail("accept", err)
	}
	defer state.mu.RUnlock()
	l, err := lookup(listenH, tagListen)
	if err != nil {
		return 0, fail("accept", err)
	}
	rc, err := l.listener.Accept()
	if err != nil {
		setupFailed(t, l.dev, metrics.Recv, err)
		return 0, fail("accept", err)
	}
	if rc == nil {
		return 0, nccl.Success
	}
	h, err := openDataComm(t, tagRecv, l.dev, rc)
	if err != nil {
		return 0, fail("accept", err)
	}
	return h, nccl.Success
}

func closeCall(tag uint8) string {
	switch tag {
	case tagSend:
		return "closeSend"
	case tagRecv:
		return "closeRecv"
	}
	return "closeListen"
}

// netClose closes a comm on the caller's thread. NCCL frees whatever the
// comm still used as soon as close returns (its own buffers even earlier,
// right after deregMr), so the transport's Close runs to the end
// here, never on a goroutine left behind; transports bound it by
// NCCL_GO_TIMEOUT (nccl.Comm), and a slow one gets a WARN naming it.
// Requests still outstanding (ncclCommAbort) are settled: counted as
// abandoned, their profiler events stopped.
func netClose(h uintptr, tag uint8) nccl.Result {
	call := closeCall(tag)
	e, err := lookup(h, tag)
	if err != nil {
		if tag == tagListen && closedListens.take(h) {
			return nccl.Success // finalize closed it first; see closedListens
		}
		return fail(call, err)
	}
	res := closeEntry(e, h, call)
	if state.finalizePending.Load() && comms.Len() == 0 {
		finalizeIfIdle()
	}
	return res
}

// closeEntry holds state.mu shared, so a finalize cannot end the transport
// between the entry leaving the table and its Close returning.
func closeEntry(e *commEntry, h uintptr, call string) nccl.Result {
	t, err := acquire()
	if err != nil {
		return fail(call, err) // cannot happen while e is open: finalize waits for it
	}
	defer state.mu.RUnlock()
	return closeEntryLocked(t, e, h, call)
}

// closedListens remembers the handles of listen comms the glue closed itself
// (a context's finalize, the restart), so that a closeListen NCCL sends for
// one afterwards succeeds as it did before: an abort may finalize before its
// service thread closes what exists. NCCL 2.28's own teardown never closes
// such a comm, so most entries are never taken; the set keeps the newest
// maxClosedListens.
var closedListens handleSet

const maxClosedListens = 4096

type handleSet struct {
	mu    sync.Mutex
	m     map[uintptr]struct{}
	order []uintptr
}

func (s *handleSet) add(h uintptr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[uintptr]struct{}{}
	}
	if len(s.order) >= maxClosedListens {
		delete(s.m, s.order[0])
		s.order = s.order[1:]
	}
	s.m[h] = struct{}{}
	s.order = append(s.order, h)
}

// take reports whether h is in the set and removes it.
func (s *handleSet) take(h uintptr) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[h]; !ok {
		return false
	}
	delete(s.m, h)
	for i, v := range s.order {
		if v == h {
			s.order = append(s.order[:i], s.order[i+1:]...)
			break
		}
	}
	return true
}

// closeQuietly closes the listen comm e unless another caller got there
// first (finalize's sweep of its listen comms against a racing listen or
// close).
func closeQuietly(e *commEntry, r slots.Ref, call string) bool {
	t, err := acquire()
	if err != nil {
		return false
	}
	defer state.mu.RUnlock()
	return closeLeftListen(t, e, r, call)
}

// closeLeftListen closes a listen comm NCCL left open and that the glue
// closes itself (a context's finalize, the restart), remembering its handle
// for a closeListen NCCL may still send (state.mu held, shared or
// exclusively).
func closeLeftListen(t nccl.Transport, e *commEntry, r slots.Ref, call string) bool {
	// The handle goes into closedListens before the comm leaves the table,
	// not after its Close returned: a closeListen NCCL sends meanwhile (an
	// abort's service thread racing its finalize) finds the comm either
	// still open or already remembered, never neither.
	h := commHandle(e.tag, r.Gen, r.Slot)
	closedListens.add(h)
	closed, _ := removeAndClose(t, e, r, call)
	if !closed {
		closedListens.take(h) // someone else closed it; nothing to remember
	}
	return closed
}

// closeEntryLocked is closeEntry with state.mu already held shared.
func closeEntryLocked(t nccl.Transport, e *commEntry, h uintptr, call string) nccl.Result {
	closed, res := removeAndClose(t, e, slots.Ref{Slot: e.slot, Gen: e.gen}, call)
	if !closed && e.tag == tagListen && closedListens.take(h) {
		return nccl.Success // a finalize's sweep removed it after our lookup; see closedListens
	}
	if !closed {
		return fail(call, nccl.Errorf(nccl.InvalidArgument, "%s: handle %#x closed twice", call, h))
	}
	return res
}

// removeAndClose takes e, which r names, out of the table and closes it;
// closed is false when it was no longer there (state.mu held, shared or
// exclusively). r comes from the caller, not from e: an entry found by
// comms.Range may be one whose register has not yet written e.slot and e.gen.
func removeAndClose(t nccl.Transport, e *commEntry, r slots.Ref, call string) (closed bool, res nccl.Result) {
	var err error
	if comms.Remove(r) == nil {
		return false, nccl.Success
	}
	var closer interface{ Close() error } = e.listener
	if e.tag != tagListen {
		closer = e.comm
		e.abandonRequests()
		if e.counting {
			e.m.ConnClosed(e.dir())
		}
	}
	start := now()
	err = closer.Close()
	took := now() - start
	if err != nil {
		log.Warnf("NET/Go : %s: %v", call, err)
	}
	if took > int64(slowClose) {
		what := "listen comm"
		if e.tag != tagListen {
			what = fmt.Sprintf("%s comm with %s", e.dir(), e.peer)
		}
		log.Warnf("NET/Go : %s: transport %s took %.1fs to close the %s (device %s); NCCL waits for it (%s bounds it, default %v)",
			call, t.Name(), float64(took)/1e9, what, deviceNameOf(e), timeout.Peer.Name(), timeout.Default)
	}
	return true, nccl.Success
}

func deviceNameOf(e *commEntry) string {
	if e.m != nil {
		return e.m.Name
	}
	return fmt.Sprintf("dev%d", e.dev)
}
