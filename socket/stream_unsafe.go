package socket

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/forkguard"
	"github.com/libnccl-net-go/libnccl-net-go/internal/clock"
	"github.com/libnccl-net-go/libnccl-net-go/internal/testhook"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// core is what both ends of a connection share: the control stream, the
// liveness stream and the data streams (raw non-blocking descriptors this
// package owns), the first fatal error, and the optional helper goroutines.
// NCCL's thread drives all of it from Isend/Irecv/Test; helpers only ever
// move bytes of data streams, under the same per-stream try-lock.
type core struct {
	log     nccl.Logger
	peer    string
	ctrl    int
	live    liveness
	streams []*stream
	chunk   int // minimum striping unit

	err    atomic.Pointer[nccl.Error]
	warned bool // NCCL thread only: the fatal error was logged
	// NCCL thread only: the control and data streams have keepalive since
	// the sender closed (watchStreamsAfterClose).
	watchedAfterClose bool

	nextStream int // NCCL thread only: stream of the next chunk
	// shareAfter: NCCL's thread moves a stream that has a helper only once
	// it has gone this long without progress (NCCL_GO_SOCKET_SHARE_AFTER).
	shareAfter int64

	helpers []*helper
	hwg     sync.WaitGroup
	closing atomic.Bool

	send  bool // the sending end
	stats connStats
	// drain, on a sending end, takes its streams at close (drain.go); nil
	// closes them outright.
	drain *drainer

	mhSeq atomic.Uint64
	// The registered ranges, by handle: DeregMr's fence (deregMr) needs to
	// know what memory NCCL is about to free. Set-up calls only.
	mrMu sync.Mutex
	mrs  map[nccl.MemHandle]memRange
}

// memRange is registered memory, [lo, hi).
type memRange struct{ lo, hi uintptr }

// connStats is what a connection did, logged when it closes: whether its
// messages travelled inline or striped, and who moved the striped chunks, is
// what explains its latency and bandwidth (docs/troubleshooting.md). Plain
// counters on NCCL's thread; the per-stream chunk counts are kept under the
// stream's busy lock and read once the helpers have stopped.
type connStats struct {
	msgs, bytes int64
	inline      int64 // messages whose payload went on the control stream
	idleInline  int64 // of those, above NCCL_SOCKET_INLINE: alone in flight
	striped     int64 // messages split over the data streams
	wakes       int64 // helper wake-ups NCCL's thread signalled
}

// count records one message of size bytes, ctrlLen of them inline;
// idleRule: it went inline only because it was alone in flight.
func (st *connStats) count(size, ctrlLen int, idleRule bool) {
	st.msgs++
	st.bytes += int64(size)
	switch {
	case ctrlLen < size:
		st.striped++
	case size > 0:
		st.inline++
		if idleRule {
			st.idleInline++
		}
	}
}

// conns are the descriptors of one connection, in hello order.
type conns struct {
	ctrl, beat int
	data       []int
}

func (c conns) close() {
	for _, fd := range append([]int{c.ctrl, c.beat}, c.data...) {
		if fd >= 0 {
			forkguard.Close(fd)
		}
	}
}

// init takes ownership of cs (it closes them on failure).
func (c *core) init(cs conns, hi handleInfo, o sockOpts, log nccl.Logger, send bool) error {
	c.log, c.ctrl, c.chunk, c.shareAfter, c.send = log, cs.ctrl, hi.minChunk, o.shareAfter, send
	c.live = liveness{fd: cs.beat, pol: o.live, next: clock.Now() + o.live.period}
	c.peer = peerName(cs.ctrl)
	c.streams = make([]*stream, len(cs.data))
	for i, fd := range cs.data {
		c.streams[i] = &stream{fd: fd, send: send}
	}
	if n := min(o.helpers, len(c.streams)); n > 0 {
		n = helperBudget.take(n, log, c.peer)
		if n == 0 {
			return nil
		}
		c.helpers = make([]*helper, n)
		for i := range c.helpers {
			fd, err := helperEventfd.Get()()
			if err != nil {
				for _, h := range c.helpers[:i] {
					unix.Close(h.evfd)
				}
				helperBudget.give(n)
				c.helpers = nil
				cs.close()
				return nccl.Errorf(nccl.SystemError, "eventfd for a stream helper: %w", err)
			}
			c.helpers[i] = &helper{c: c, evfd: fd}
		}
		for i, s := range c.streams {
			h := c.helpers[i%len(c.helpers)]
			s.h = h
			h.streams = append(h.streams, s)
		}
		for _, h := range c.helpers {
			h.pfds = make([]unix.PollFd, 1+len(h.streams))
			c.hwg.Add(1)
			go h.run()
		}
	}
	return nil
}

// helperEventfd makes a helper's wake-up descriptor; tests make it fail.
var helperEventfd = testhook.New(func() (int, error) {
	return unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
})

// peerName is the peer's address for logs.
func peerName(fd int) string {
	sa, err := unix.Getpeername(fd)
	if err != nil {
		return "unknown peer"
	}
	return addrPortOf(sa).String()
}

// fail records the first fatal error of the connection.
func (c *core) fail(code nccl.Result, format string, args ...any) *nccl.Error {
	e := nccl.Errorf(code, format, args...).(*nccl.Error)
	if c.err.CompareAndSwap(nil, e) {
		return e
	}
	return c.err.Load()
}

// failed returns the connection's fatal error, logging it once.
func (c *core) failed() error {
	e := c.err.Load()
	if e == nil {
		return nil
	}
	if !c.warned {
		c.warned = true
		c.log.Warnf("NET/GoSocket : %v", e)
	}
	return e
}

// checkLive runs the liveness check when one is due (NCCL's thread only, with
// a request pending). It returns what the check found; a dead peer has
// already been recorded as the connection's error. NCCL polls test in a
// tight loop, so the clock is read only every liveClockEvery calls (a clock
// read costs as much as the rest of a test that finds nothing).
func (c *core) checkLive() liveState {
	if c.live.calls++; c.live.calls%liveClockEvery != 0 {
		return liveOK
	}
	t := clock.Now()
	if !c.live.due(t) {
		return liveOK
	}
	st, err := c.live.check(t)
	if st != liveDead {
		return st
	}
	if err != nil {
		c.fail(nccl.SystemError, "connection with %s failed: %v", c.peer, err)
	} else {
		c.fail(nccl.SystemError, "the peer %s is unreachable: its host has not answered for %v (%s=%v); the host is down "+
			"or the network path to it is cut", c.peer, c.live.silentFor().Round(time.Millisecond), envTimeout,
			time.Duration(c.live.pol.timeout))
	}
	return liveDead
}

// streamHeld reports whether a helper is inside a data stream's move now.
func (c *core) streamHeld() bool {
	for _, s := range c.streams {
		if s.busy.Load() != 0 {
			return true
		}
	}
	return false
}

// close stops the helpers and closes every socket. It never waits for the
// peer: helpers only ever wait in poll with the wake-up eventfd in the set,
// and return before close does, so no buffer NCCL frees next is touched
// afterwards and no descriptor of the comm is used after it returns. With
// mayKeep, a healthy sending end's streams that still hold bytes they could
// not send go to the transport's drainer, with the liveness stream, instead
// of becoming orphans the kernel may drop (drain.go); all are shut for
// writing, so the receiver learns of the close as before. A failed
// connection's bytes are lost anyway.
func (c *core) close(mayKeep bool) error {
	if !c.closing.CompareAndSwap(false, true) {
		return nil
	}
	healthy := c.err.Load() == nil
	c.fail(nccl.SystemError, "connection with %s closed", c.peer)
	c.stopHelpers()
	c.logStats()
	for _, h := range c.helpers {
		unix.Close(h.evfd)
	}
	helperBudget.give(len(c.helpers))
	d := c.drain
	if !mayKeep || !healthy {
		d = nil
	}
	fds := make([]int, 0, 1+len(c.streams))
	fds = append(fds, c.ctrl)
	for _, s := range c.streams {
		fds = append(fds, s.fd)
	}
	d.adopt(c.live.fd, c.live.pol, fds)
	return nil
}

// logStats logs the connection's counters at INFO (NCCL_DEBUG_SUBSYS=NET);
// the helpers have stopped.
func (c *core) logStats() {
	st := &c.stats
	if st.msgs == 0 {
		return
	}
	var chunks, byHelpers int64
	for _, s := range c.streams {
		chunks += s.chunks
		byHelpers += s.helperChunks
	}
	dir, inline := "receive connection from", fmt.Sprintf("%d inline", st.inline)
	if c.send {
		dir = "send connection to"
		inline = fmt.Sprintf("%d inline (%d of them above %s, alone in flight)", st.inline, st.idleInline, envInline)
	}
	c.log.Infof(nccl.SubsysNet, "NET/GoSocket : %s %s closed: %d messages, %d bytes; %s, %d striped in %d chunks "+
		"over %d streams, %d of the chunks moved by helpers and %d by NCCL's thread; %d helper wake-ups",
		dir, c.peer, st.msgs, st.bytes, inline, st.striped, chunks, len(c.streams), byHelpers, chunks-byHelpers, st.wakes)
}

func (c *core) regMr(data unsafe.Pointer, size int, t nccl.PtrType) (nccl.MemHandle, error) {
	if t != nccl.PtrHost {
		c.log.Warnf("NET/GoSocket : socket transport supports host memory only; cannot register memory of type %#x "+
			"(NCCL should not ask: the device reports PtrSupport=HOST; check NCCL_NET_GDR_LEVEL / the plugin in use)", int(t))
		return 0, nccl.Errorf(nccl.InternalError, "socket transport supports host memory only (asked to register type %#x)", int(t))
	}
	if size < 0 {
		return 0, nccl.Errorf(nccl.InvalidArgument, "RegMr of %d bytes", size)
	}
	// Nothing to pin: the handle only has to be non-zero and unique enough to
	// tell registrations apart in traces. The range is kept for deregMr.
	mh := nccl.MemHandle(c.mhSeq.Add(1))
	if len(c.helpers) > 0 && size > 0 {
		c.mrMu.Lock()
		if c.mrs == nil {
			c.mrs = map[nccl.MemHandle]memRange{}
		}
		c.mrs[mh] = memRange{uintptr(data), uintptr(data) + uintptr(size)}
		c.mrMu.Unlock()
	}
	return mh, nil
}

// deregMr is a fence for the helpers. NCCL frees a buffer right after it
// deregisters it, before it closes the comm (net.cc's sendProxyFree and
// recvProxyFree: deregMr, free, then close), and after an abort it does so
// with transfers still queued. NCCL's own thread touches a buffer only
// inside the calls NCCL makes, which have stopped by then; a helper would go
// on copying into the freed memory, or sending it. So when a chunk still
// queued has bytes in the range that no other registration of the comm
// covers, the connection fails and the helpers stop before deregMr returns.
// A range with nothing queued (the usual case: NCCL deregisters buffers it
// no longer uses), or one another registration still holds (as ib's MR
// cache keeps memory registered until its last handle goes), changes
// nothing.
func (c *core) deregMr(mh nccl.MemHandle) error {
	if c.closing.Load() {
		return nil
	}
	c.mrMu.Lock()
	r, ok := c.mrs[mh]
	delete(c.mrs, mh)
	var others []memRange
	if ok {
		for _, o := range c.mrs {
			if o.lo < r.hi && o.hi > r.lo {
				others = append(others, o)
			}
		}
	}
	c.mrMu.Unlock()
	if !ok || !c.queuedIn(r, others) {
		return nil
	}
	c.fail(nccl.SystemError, "connection with %s: memory [%#x, %#x) was deregistered while a transfer in it was still queued "+
		"(the connection is being torn down)", c.peer, r.lo, r.hi)
	c.stopHelpers()
	return nil
}

// fenceWait bounds how long deregMr waits for a stream's busy lock. Its
// holder gives it back within one move (non-blocking calls only); one that
// does not (a panic recovered at the C boundary left it taken) counts as a
// stream with the range queued, so the fence fails safe instead of hanging
// NCCL's teardown.
const fenceWait = time.Second

// queuedIn reports whether a chunk queued on a data stream has bytes in r
// that none of others covers. It takes each stream's busy lock in turn:
// with it held the chunks between head and tail stay put, and NCCL's thread
// only ever writes the slot at tail.
func (c *core) queuedIn(r memRange, others []memRange) bool {
	for _, s := range c.streams {
		for deadline := time.Now().Add(fenceWait); !s.busy.CompareAndSwap(0, 1); time.Sleep(20 * time.Microsecond) {
			if time.Now().After(deadline) {
				return true
			}
		}
		hit := false
		for i, t := s.head.Load(), s.tail.Load(); i != t && !hit; i++ {
			k := &s.ring[i%ringSize]
			if k.p == nil {
				continue
			}
			lo, hi := max(uintptr(k.p), r.lo), min(uintptr(k.p)+uintptr(k.n), r.hi)
			hit = lo < hi && !covered(lo, hi, others)
		}
		s.busy.Store(0)
		if hit {
			return true
		}
	}
	return false
}

// covered reports whether [lo, hi) lies within the union of rs.
func covered(lo, hi uintptr, rs []memRange) bool {
	for lo < hi {
		next := lo
		for _, r := range rs {
			if r.lo <= lo && r.hi > next {
				next = r.hi
			}
		}
		if next == lo {
			return false
		}
		lo = next
	}
	return true
}

// stopHelpers ends the helpers once the connection has failed (they leave
// their loop on its error) and waits for them.
func (c *core) stopHelpers() {
	var one uint64 // not the helpers' wbuf: NCCL's thread may signal at once
	for _, h := range c.helpers {
		eventSignal(h.evfd, &one)
	}
	c.hwg.Wait()
}

// task is one chunk for a data stream: write (sender) or read into p; p nil
// on the receiving side means read and discard (a truncated message keeps
// the stream in step).
type task struct {
	p    unsafe.Pointer
	n    int
	left *atomic.Int32 // the request's outstanding chunks
}

// ringSize bounds chunks queued per stream. A message puts at most one chunk
// on each stream and a comm has at most 256 messages in flight.
const ringSize = 512

// stream is one data connection. NCCL's thread queues chunks in a
// single-producer ring; whoever holds busy (NCCL's thread, or the stream's
// helper) moves bytes of the chunk at the head with non-blocking calls.
type stream struct {
	fd   int
	send bool
	h    *helper // nil without helpers
	ring [ringSize]task
	head atomic.Uint32 // next chunk to move (advanced by the busy holder)
	tail atomic.Uint32 // next free slot (NCCL's thread)
	busy atomic.Int32
	off  int   // bytes of ring[head] moved; busy holder only
	err  error // busy holder only: why move stopped for good
	// moves counts the busy holder's calls that moved bytes, on streams
	// with a helper: NCCL's thread tells a helper at work from one that
	// is not by watching it.
	moves atomic.Uint32
	// NCCL's thread only: the moves count it last saw with chunks
	// pending, and when (0: nothing was pending at its last look).
	seen   uint32
	seenAt int64
	// Chunks moved in full, and how many of them by the helper (connStats);
	// busy holder only.
	chunks, helperChunks int64
}

// discard is where every receiving stream reads the bytes of a truncated
// message that no buffer takes. One for the process: the kernel writes it and
// nothing reads it, so streams may share it at once, where one per stream was
// 64 KiB of heap per data stream of every receive comm (a quarter of a GiB
// at 1,000 receive comms of 4 streams), for a path only truncation takes.
var discard [64 << 10]byte

func (s *stream) pending() bool { return s.head.Load() != s.tail.Load() }
func (s *stream) room() bool    { return s.tail.Load()-s.head.Load() < ringSize }

func (s *stream) push(t task) {
	tl := s.tail.Load()
	s.ring[tl%ringSize] = t
	s.tail.Store(tl + 1)
}

// move moves bytes of queued chunks until the socket would block or the
// queue is empty; the caller holds busy. It returns whether any byte moved,
// and a non-nil error once the stream is broken (io.EOF: the peer closed).
func (s *stream) move(helper bool) (bool, error) {
	if s.err != nil {
		return false, s.err
	}
	moved := false
	for {
		h := s.head.Load()
		if h == s.tail.Load() {
			return moved, nil
		}
		t := &s.ring[h%ringSize]
		for s.off < t.n {
			var n int
			var eof bool
			var err error
			switch {
			case s.send:
				n, err = sendFrom(s.fd, unsafe.Add(t.p, s.off), t.n-s.off)
			case t.p == nil:
				n, eof, err = recvInto(s.fd, unsafe.Pointer(&discard[0]), min(len(discard), t.n-s.off))
			default:
				n, eof, err = recvInto(s.fd, unsafe.Add(t.p, s.off), t.n-s.off)
			}
			if eof {
				err = io.EOF
			}
			if err != nil {
				s.err = err
				return moved, err
			}
			if n == 0 {
				return moved, nil
			}
			s.off += n
			if !moved && s.h != nil {
				s.moves.Add(1)
			}
			moved = true
		}
		left := t.left
		*t = task{}
		s.off = 0
		s.chunks++
		if helper {
			s.helperChunks++
		}
		s.head.Store(h + 1)
		left.Add(-1)
	}
}

// pump moves what the data streams can move now, from NCCL's thread. A
// stream a helper holds is skipped, and so is one whose helper is keeping up
// (overdue): NCCL's thread steps in only for a helper that cannot run.
func (c *core) pump(send bool) {
	if c.err.Load() != nil {
		// Failed for good: nothing left to move, and after a fence
		// (deregMr) the memory the chunks point at may be gone.
		return
	}
	var now int64
	for _, s := range c.streams {
		if !s.pending() {
			// Only a stream that has a helper ever sets seenAt; testing
			// before the store keeps idle streams' lines unwritten.
			if s.seenAt != 0 {
				s.seenAt = 0
			}
			continue
		}
		if s.h != nil && c.shareAfter > 0 {
			if now == 0 {
				now = clock.Now()
			}
			if !s.overdue(now, c.shareAfter) {
				continue
			}
		}
		if !s.busy.CompareAndSwap(0, 1) {
			continue
		}
		_, err := s.move(false)
		s.busy.Store(0)
		if err != nil {
			c.streamFailed(err, send)
			return
		}
	}
}

// overdue reports whether s, which has chunks pending and a helper, has
// made no progress for after ns; NCCL's thread calls it. While it stays
// stuck it is overdue once per after ns, so a helper that cannot run costs
// NCCL's thread one try per period (a full socket: one EAGAIN), not one per
// call.
func (s *stream) overdue(now, after int64) bool {
	m := s.moves.Load()
	if s.seenAt == 0 || m != s.seen {
		s.seen, s.seenAt = m, now
		return false
	}
	if now-s.seenAt < after {
		return false
	}
	s.seenAt = now
	return true
}

func (c *core) streamFailed(err error, send bool) {
	if c.closing.Load() {
		return
	}
	dir := "receiving from"
	if send {
		dir = "sending to"
	}
	switch {
	case err == io.EOF:
		c.fail(nccl.SystemError, "%s %s: the peer closed the connection (process exited or comm closed)", dir, c.peer)
	case errors.Is(err, unix.ETIMEDOUT), errors.Is(err, unix.EHOSTUNREACH), errors.Is(err, unix.ENETUNREACH):
		// Only a stream with keepalive times out while it waits to
		// receive (watchStreamsAfterClose, the control stream too); a
		// sending one, after the kernel's retransmissions (tcp_retries2).
		// When the probes went unanswered the kernel reports the soft
		// error it kept, if any: on a shared subnet a dead host's failed
		// ARP leaves EHOSTUNREACH.
		c.fail(nccl.SystemError, "%s %s failed: the peer's host stopped answering (%v); the host is down "+
			"or the network path to it is cut", dir, c.peer, err)
	default:
		c.fail(nccl.SystemError, "%s %s failed: %v", dir, c.peer, err)
	}
}

// chunkSize and stripe split [from, size) of a message into chunks of at
// least chunk bytes, one per stream round-robin from nextStream. Both ends
// run them over the same messages in the same order, so they agree on which
// stream carries which bytes without saying so on the wire.
func (c *core) chunkSize(n int) int {
	ns := len(c.streams)
	cs := (n + ns - 1) / ns
	cs = (cs + 4095) &^ 4095
	return max(cs, c.chunk)
}

// canStripe: every stream has room for the (at most one) chunk a message
// puts on it. Never false with the bounds above; checked so that running out
// is a retry, not corruption.
func (c *core) canStripe() bool {
	for _, s := range c.streams {
		if !s.room() {
			return false
		}
	}
	return true
}

func (c *core) stripe(p unsafe.Pointer, from, size int, left *atomic.Int32) {
	n := size - from
	if n <= 0 {
		return
	}
	cs := c.chunkSize(n)
	left.Add(int32((n + cs - 1) / cs))
	for off := from; off < size; off += cs {
		var q unsafe.Pointer
		if p != nil {
			q = unsafe.Add(p, off)
		}
		s := c.streams[c.nextStream]
		s.push(task{p: q, n: min(cs, size-off), left: left})
		if s.h != nil && s.h.sleeping.CompareAndSwap(true, false) {
			eventSignal(s.h.evfd, &s.h.wbuf)
			c.stats.wakes++
		}
		c.nextStream++
		if c.nextStream == len(c.streams) {
			c.nextStream = 0
		}
	}
}

// helper is a goroutine that moves chunks of some data streams beside NCCL's
// thread, on hosts with cores to spare. It waits in poll(2) on its streams
// and an eventfd, never in Go's netpoller; NCCL's thread only signals the
// eventfd when it queued work while the helper was asleep.
type helper struct {
	c          *core
	streams    []*stream
	evfd       int
	sleeping   atomic.Bool
	pfds       []unix.PollFd
	wbuf, rbuf uint64
}

func (h *helper) run() {
	defer h.c.hwg.Done()
	blockHostSignals() // the host's handlers run on its own threads (sigmask.go)
	send := h.streams[0].send
	// A broken stream fails the whole connection: nothing left to help with.
	for !h.c.closing.Load() && h.c.err.Load() == nil {
		moved := false
		for _, s := range h.streams {
			if !s.pending() || !s.busy.CompareAndSwap(0, 1) {
				continue
			}
			m, err := s.move(true)
			s.busy.Store(0)
			if err != nil {
				h.c.streamFailed(err, send)
			}
			moved = moved || m
		}
		if moved {
			continue
		}
		// Announce the sleep before looking at the queues once more, so that
		// a chunk queued in between is either seen here or signalled.
		h.sleeping.Store(true)
		h.pfds = h.pfds[:1]
		h.pfds[0] = unix.PollFd{Fd: int32(h.evfd), Events: unix.POLLIN}
		timeout := -1
		ev := int16(unix.POLLIN)
		if send {
			ev = unix.POLLOUT
		}
		for _, s := range h.streams {
			if !s.pending() {
				continue
			}
			if s.busy.Load() != 0 {
				// NCCL's thread is moving it: look again shortly rather
				// than spin on a socket that is ready for it.
				timeout = 1
				continue
			}
			h.pfds = append(h.pfds, unix.PollFd{Fd: int32(s.fd), Events: ev})
		}
		if !h.c.closing.Load() {
			poll(h.pfds, timeout)
		}
		h.sleeping.Store(false)
		if h.pfds[0].Revents != 0 {
			eventDrain(h.evfd, &h.rbuf)
		}
	}
}
