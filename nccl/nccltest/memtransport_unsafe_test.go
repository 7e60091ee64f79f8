package nccltest

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// memTransport is a minimal in-process transport that follows the contract,
// used to check the suite itself: it must pass, and each deliberately broken
// variant (see suite_test.go) must fail.
type memTransport struct {
	mu        sync.Mutex
	listeners map[uint64]*memListener
	next      uint64

	// Faults, for the suite's own tests.
	blockConnect  bool // Connect waits for Accept
	overrun       bool // a truncated receive writes past its buffer
	ignoreTrunc   bool // a truncated receive reports success
	fifoBroken    bool // a grouped receive fills buffers in arrival order, ignoring tags
	hangClose     bool // Close waits for outstanding requests forever
	refuseDereg0  bool
	wrongSizeSent bool

	// More broken variants, one rule of the contract each (faults in suite_test.go).
	leakSendSlots    bool // a completed send's slot is never recycled
	leakGroupedRecv  bool // a completed grouped (n>1) receive's slot is never recycled
	groupedTrunc     bool // a send larger than its buffer in a grouped receive overruns it and succeeds
	lateWriteOnClose bool // Close returns; the transport's progress engine still writes the closed comm's receive buffers later
	lateWriteDereg   bool // DeregMr returns; a background "DMA engine" still writes the memory it covered a moment later
	leakGoroutine    bool // each comm starts a goroutine that Close never stops
	onceGlobal       bool // process-wide state set up once (sync.Once) and torn down by Finalize
	ignorePeerClose  bool // a receive the closed sender never fills stays "not done" for ever
	keepBufs         bool // Irecv keeps the caller's bufs slice instead of copying it
	reuseID          bool // Isend hands out request 0 again while it is pending
	slowTest         bool // every SendComm.Test sleeps 2 ms

	// zeroDefaults leaves zero the Properties fields whose zero nccl.Properties
	// documents as a default the glue fills: not a fault.
	zeroDefaults bool
	pendingLate  []func()

	// checkRegs makes it an RDMA-like transport: data must lie in a live
	// registration of the same comm (Options.Register).
	checkRegs bool
	regs      map[nccl.MemHandle][2]uintptr
	regPtrs   map[nccl.MemHandle]unsafe.Pointer // lateWriteDereg's target
}

func (t *memTransport) Name() string { return "mem" }

var (
	globalOnce      sync.Once
	globalListeners map[uint64]*memListener
)

func (t *memTransport) Init(nccl.InitContext) error {
	if t.onceGlobal {
		// Process-wide fabric state set up once, as if Init ran once per
		// process; Finalize tears it down and a second Init cannot rebuild it.
		globalOnce.Do(func() { globalListeners = map[uint64]*memListener{} })
		if globalListeners == nil {
			return fmt.Errorf("fabric already shut down")
		}
		t.listeners = globalListeners
		return nil
	}
	t.listeners = map[uint64]*memListener{}
	return nil
}
func (t *memTransport) Devices() int { return 1 }
func (t *memTransport) Properties(dev int) (nccl.Properties, error) {
	if dev != 0 {
		return nccl.Properties{}, fmt.Errorf("no device %d", dev)
	}
	if t.zeroDefaults {
		return nccl.Properties{Name: "mem0", MaxComms: 1024}, nil
	}
	return nccl.Properties{Name: "mem0", PtrSupport: nccl.PtrHost, Speed: 1000, MaxComms: 1024, MaxRecvs: 8}, nil
}
func (t *memTransport) Finalize() error {
	if t.onceGlobal {
		globalListeners = nil
	}
	return nil
}

type memListener struct {
	t       *memTransport
	id      uint64
	pending chan *memConn
}

func (t *memTransport) Listen(dev int, h *nccl.Handle) (nccl.Listener, error) {
	if dev != 0 {
		return nil, fmt.Errorf("no device %d", dev)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	l := &memListener{t: t, id: t.next, pending: make(chan *memConn, 1)}
	t.listeners[l.id] = l
	binary.LittleEndian.PutUint64(h[:], l.id)
	return l, nil
}

func (t *memTransport) Connect(dev int, h *nccl.Handle, _ nccl.ConnectOptions) (nccl.SendComm, error) {
	t.mu.Lock()
	l := t.listeners[binary.LittleEndian.Uint64(h[:])]
	t.mu.Unlock()
	if l == nil {
		return nil, fmt.Errorf("no listener")
	}
	c := &memConn{t: t}
	c.cond = sync.NewCond(&c.mu)
	if t.leakGoroutine {
		go func() { select {} }() // never stopped by Close
	}
	l.pending <- c
	if t.blockConnect {
		c.mu.Lock()
		for !c.accepted {
			c.cond.Wait()
		}
		c.mu.Unlock()
	}
	return &memSend{c}, nil
}

func (l *memListener) Accept() (nccl.RecvComm, error) {
	select {
	case c := <-l.pending:
		c.mu.Lock()
		c.accepted = true
		c.cond.Broadcast()
		c.mu.Unlock()
		return &memRecv{c}, nil
	default:
		return nil, nil
	}
}

func (l *memListener) Close() error {
	l.t.mu.Lock()
	delete(l.t.listeners, l.id)
	l.t.mu.Unlock()
	return nil
}

type memSendReq struct {
	data  unsafe.Pointer
	size  int
	tag   int
	done  bool
	inUse bool
}

type memRecvReq struct {
	bufs   [8]nccl.RecvBuffer
	kept   []nccl.RecvBuffer
	n      int
	filled [8]bool
	sizes  [8]int
	got    int
	err    error
	inUse  bool
}

type memConn struct {
	t        *memTransport
	mu       sync.Mutex
	cond     *sync.Cond
	accepted bool
	closed   atomic.Int32
	sendGone bool // the sending end closed; c.mu
	sends    [nccl.MaxRequests * 8]memSendReq
	sendQ    []int
	recvs    [nccl.MaxRequests]memRecvReq
	recvQ    []int
}

// progress matches queued sends with the oldest posted receive; c.mu held.
func (c *memConn) progress() {
	c.t.runLate()
	for len(c.sendQ) > 0 && len(c.recvQ) > 0 {
		s := &c.sends[c.sendQ[0]]
		r := &c.recvs[c.recvQ[0]]
		slot := -1
		for i := 0; i < r.n; i++ {
			tag := r.bufs[i].Tag
			if r.kept != nil {
				tag = r.kept[i].Tag
			}
			if !r.filled[i] && (c.t.fifoBroken || tag == s.tag) {
				slot = i
				break
			}
		}
		if slot < 0 {
			return
		}
		b := r.bufs[slot]
		if r.kept != nil {
			b = r.kept[slot]
		}
		n := s.size
		if n > b.Size && c.t.groupedTrunc && r.n > 1 {
			// write the whole message, report success
		} else if n > b.Size {
			if !c.t.ignoreTrunc {
				r.err = nccl.Errorf(nccl.InvalidUsage, "message truncated: %d > %d", s.size, b.Size)
			}
			n = b.Size
			if c.t.overrun {
				n = s.size
			}
		}
		copy(nccl.HostBytes(b.Data, n), nccl.HostBytes(s.data, n))
		r.filled[slot], r.sizes[slot] = true, n
		r.got++
		s.done = true
		c.sendQ = c.sendQ[1:]
		if r.got == r.n {
			c.recvQ = c.recvQ[1:]
		}
	}
}

type memSend struct{ c *memConn }
type memRecv struct{ c *memConn }

func (s *memSend) Isend(data unsafe.Pointer, size, tag int, mh nccl.MemHandle) (nccl.Request, error) {
	c := s.c
	if err := c.registered(data, size, mh); err != nil {
		return nccl.NoRequest, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.sends {
		if !c.sends[i].inUse {
			c.sends[i] = memSendReq{data: data, size: size, tag: tag, inUse: true}
			c.sendQ = append(c.sendQ, i)
			c.progress()
			if c.t.reuseID && i == 1 && c.sends[0].inUse {
				return nccl.Request(0), nil
			}
			return nccl.Request(i), nil
		}
	}
	return nccl.NoRequest, nil
}

func (s *memSend) Test(r nccl.Request) (bool, int, error) {
	c := s.c
	if c.t.slowTest {
		time.Sleep(2 * time.Millisecond)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.progress()
	q := &c.sends[r]
	if !q.done {
		return false, 0, nil
	}
	if !c.t.leakSendSlots {
		q.inUse = false
	}
	n := q.size
	if c.t.wrongSizeSent {
		n++
	}
	return true, n, nil
}

func (r *memRecv) Irecv(bufs []nccl.RecvBuffer) (nccl.Request, error) {
	c := r.c
	for _, b := range bufs {
		if err := c.registered(b.Data, b.Size, b.MH); err != nil {
			return nccl.NoRequest, err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.recvs {
		if !c.recvs[i].inUse {
			q := memRecvReq{n: len(bufs), inUse: true}
			copy(q.bufs[:], bufs)
			if c.t.keepBufs {
				q.kept = bufs
			}
			c.recvs[i] = q
			c.recvQ = append(c.recvQ, i)
			c.progress()
			return nccl.Request(i), nil
		}
	}
	return nccl.NoRequest, nil
}

func (r *memRecv) Iflush([]nccl.RecvBuffer) (nccl.Request, error) { return nccl.NoRequest, nil }

func (r *memRecv) Test(req nccl.Request, sizes []int) (bool, error) {
	c := r.c
	c.mu.Lock()
	defer c.mu.Unlock()
	c.progress()
	q := &c.recvs[req]
	if q.err != nil {
		return false, q.err
	}
	if q.got < q.n {
		if c.sendGone && len(c.sendQ) == 0 && !c.t.ignorePeerClose {
			return false, nccl.Errorf(nccl.RemoteError, "the sender closed with this receive still posted")
		}
		return false, nil
	}
	if !(c.t.leakGroupedRecv && q.n > 1) {
		q.inUse = false
	}
	copy(sizes, q.sizes[:q.n])
	return true, nil
}

func (c *memConn) regMr(p unsafe.Pointer, n int, t nccl.PtrType) (nccl.MemHandle, error) {
	if t != nccl.PtrHost {
		return 0, nccl.Errorf(nccl.InternalError, "host memory only")
	}
	c.t.mu.Lock()
	defer c.t.mu.Unlock()
	if c.t.regs == nil {
		c.t.regs = map[nccl.MemHandle][2]uintptr{}
	}
	c.t.next++
	mh := nccl.MemHandle(c.t.next)
	c.t.regs[mh] = [2]uintptr{uintptr(p), uintptr(p) + uintptr(n)}
	if c.t.lateWriteDereg {
		if c.t.regPtrs == nil {
			c.t.regPtrs = map[nccl.MemHandle]unsafe.Pointer{}
		}
		c.t.regPtrs[mh] = p
	}
	return mh, nil
}

func (c *memConn) deregMr(mh nccl.MemHandle) error {
	if mh == 0 {
		if c.t.refuseDereg0 {
			return fmt.Errorf("nil handle")
		}
		return nil
	}
	c.t.mu.Lock()
	defer c.t.mu.Unlock()
	r, ok := c.t.regs[mh]
	if !ok {
		return nccl.Errorf(nccl.InternalError, "deregMr of unknown handle %d", mh)
	}
	delete(c.t.regs, mh)
	if c.t.lateWriteDereg {
		// A "DMA" into the registration lands after DeregMr returned,
		// from an engine that runs by itself (as the socket transport's
		// helpers do), while NCCL calls nothing any more. It lands once
		// the memory's next owner (the suite, which fills it with its
		// sentinel) has written it: a write before that is overwritten by
		// the owner and goes unseen, as a 1 ms timer's did whenever a
		// loaded machine delayed the suite's fill past it. It looks and
		// writes under c.mu, which close takes to mark the comm closed,
		// and gives up once it is: the suite frees the memory after the
		// close, and must not do so under a write.
		ptr := c.t.regPtrs[mh]
		delete(c.t.regPtrs, mh)
		p := nccl.HostBytes(ptr, int(r[1]-r[0]))
		go func() {
			for {
				c.mu.Lock()
				if c.closed.Load() != 0 {
					c.mu.Unlock()
					return
				}
				if checkSentinel(p, 0) == nil {
					for j := range p {
						p[j] = 0x5A
					}
					c.mu.Unlock()
					return
				}
				c.mu.Unlock()
				time.Sleep(time.Millisecond)
			}
		}()
	}
	return nil
}

// registered reports whether [p, p+n) lies in live registration mh.
func (c *memConn) registered(p unsafe.Pointer, n int, mh nccl.MemHandle) error {
	if !c.t.checkRegs {
		return nil
	}
	c.t.mu.Lock()
	defer c.t.mu.Unlock()
	r, ok := c.t.regs[mh]
	if !ok || uintptr(p) < r[0] || uintptr(p)+uintptr(n) > r[1] {
		return nccl.Errorf(nccl.InvalidArgument, "buffer %p+%d is not inside registration %d", p, n, mh)
	}
	return nil
}

func (t *memTransport) runLate() {
	if !t.lateWriteOnClose {
		return
	}
	t.mu.Lock()
	fs := t.pendingLate
	t.pendingLate = nil
	t.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

func (c *memConn) close() error {
	if c.t.hangClose {
		select {}
	}
	if c.t.lateWriteOnClose {
		// Receives still posted: their "DMA" lands after Close returned,
		// when the engine is next polled (on any comm).
		c.mu.Lock()
		var late []func()
		for _, ri := range c.recvQ {
			r := &c.recvs[ri]
			for i := 0; i < r.n; i++ {
				if !r.filled[i] && r.bufs[i].Size > 0 {
					b := r.bufs[i]
					late = append(late, func() {
						p := nccl.HostBytes(b.Data, b.Size)
						for j := range p {
							p[j] = 0x5A
						}
					})
				}
			}
		}
		c.mu.Unlock()
		c.t.mu.Lock()
		c.t.pendingLate = append(c.t.pendingLate, late...)
		c.t.mu.Unlock()
	}
	c.mu.Lock() // lateWriteDereg's engine writes only while it is not closed
	c.closed.Store(1)
	c.mu.Unlock()
	return nil
}

func (s *memSend) RegMr(p unsafe.Pointer, n int, t nccl.PtrType) (nccl.MemHandle, error) {
	return s.c.regMr(p, n, t)
}
func (s *memSend) DeregMr(mh nccl.MemHandle) error { return s.c.deregMr(mh) }
func (s *memSend) Close() error {
	s.c.mu.Lock()
	s.c.sendGone = true
	s.c.mu.Unlock()
	return s.c.close()
}
func (r *memRecv) RegMr(p unsafe.Pointer, n int, t nccl.PtrType) (nccl.MemHandle, error) {
	return r.c.regMr(p, n, t)
}
func (r *memRecv) DeregMr(mh nccl.MemHandle) error { return r.c.deregMr(mh) }
func (r *memRecv) Close() error                    { return r.c.close() }
