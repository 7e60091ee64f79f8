package socket

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// epoch anchors the monotonic clock the stall checks use.
var epoch = time.Now()

func now() int64 { return int64(time.Since(epoch)) }

// core is what both ends of a connection share: the control stream (a raw
// non-blocking fd used only from NCCL's thread), the data streams, the
// first fatal error, and the progress counter the stall checks watch.
type core struct {
	log     nccl.Logger
	peer    string
	ctrl    *net.TCPConn
	fd      int
	streams []*stream
	chunk   int // minimum striping unit
	timeout int64

	err    atomic.Pointer[nccl.Error]
	warned bool // NCCL thread only: the fatal error was logged
	// moved counts progress events (bytes written or read, messages
	// matched); a started transfer fails when it stays unchanged too long.
	moved atomic.Uint64

	nextStream int // NCCL thread only: stream of the next chunk

	// Stall bookkeeping, NCCL thread only.
	checks     uint32
	lastMoved  uint64
	lastChange int64

	mhSeq   atomic.Uint64
	closing atomic.Bool
	wg      sync.WaitGroup
}

func (c *core) init(ctrl *net.TCPConn, conns []*net.TCPConn, hi handleInfo, o sockOpts, log nccl.Logger, send bool) error {
	c.log, c.ctrl, c.chunk = log, ctrl, hi.minChunk
	c.peer = ctrl.RemoteAddr().String()
	c.timeout = int64(o.timeout)
	fd, err := rawFD(ctrl)
	if err != nil {
		return nccl.Errorf(nccl.SystemError, "control stream of %s: %w", c.peer, err)
	}
	c.fd = fd
	c.lastChange = now()
	c.streams = make([]*stream, len(conns))
	for i, sc := range conns {
		c.streams[i] = &stream{c: c, conn: sc, send: send, wake: make(chan struct{}, 1), quit: make(chan struct{})}
	}
	for _, s := range c.streams {
		c.wg.Add(1)
		go s.run()
	}
	return nil
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

// tick counts stall checks; only every 64th reads the clock.
func (c *core) tick() bool {
	c.checks++
	return c.checks&63 == 0
}

// stalled implements NCCL_GO_TIMEOUT for a request whose transfer has
// started: it fails when no progress event happened on the connection for
// that long (as seen over successive checks).
func (c *core) stalled(what string) error {
	if c.timeout <= 0 {
		return nil
	}
	t := now()
	if m := c.moved.Load(); m != c.lastMoved {
		c.lastMoved, c.lastChange = m, t
		return nil
	}
	if t-c.lastChange < c.timeout {
		return nil
	}
	c.fail(nccl.SystemError, "%s with %s made no progress for %v (%s): the peer is stuck or the network dropped the connection",
		what, c.peer, time.Duration(c.timeout), nccl.EnvTimeout)
	return c.failed()
}

// touch marks progress; the stall clock restarts at the next check.
func (c *core) touch() { c.moved.Add(1) }

// close stops the stream goroutines and closes every socket. It does not wait
// for the peer: closing the sockets unblocks any goroutine inside a read or
// write, and they exit before close returns, so no buffer NCCL frees next is
// touched afterwards.
func (c *core) close() error {
	if !c.closing.CompareAndSwap(false, true) {
		return nil
	}
	c.fail(nccl.SystemError, "connection with %s closed", c.peer)
	c.ctrl.Close()
	for _, s := range c.streams {
		close(s.quit)
		s.conn.Close()
	}
	c.wg.Wait()
	return nil
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
	// tell registrations apart in traces.
	return nccl.MemHandle(c.mhSeq.Add(1)), nil
}

// task is one chunk for a data stream: write (sender) or read into p; p nil
// on the receiving side means read and discard (the drain of a truncated
// message keeps the stream in step).
type task struct {
	p    unsafe.Pointer
	n    int
	left *atomic.Int32 // the request's outstanding chunks
}

// ringSize bounds chunks queued per stream. A message puts at most one chunk
// on each stream and a comm has at most 256 messages in flight.
const ringSize = 512

// stream is one data connection and the goroutine driving it. NCCL's thread
// pushes tasks into a single-producer single-consumer ring (no lock) and
// nudges the goroutine through a 1-slot channel when it might be asleep.
type stream struct {
	c    *core
	conn *net.TCPConn
	send bool
	ring [ringSize]task
	head atomic.Uint32 // next task the goroutine takes
	tail atomic.Uint32 // next free slot (NCCL thread)
	wake chan struct{}
	quit chan struct{}
	// scratch is where discarded bytes go (receive side only).
	scratch []byte
}

// push queues t; false when the ring is full (never, by the bound above).
func (s *stream) push(t task) bool {
	tl := s.tail.Load()
	if tl-s.head.Load() >= ringSize {
		return false
	}
	s.ring[tl%ringSize] = t
	s.tail.Store(tl + 1)
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return true
}

// ioPiece bounds one read/write so progress is visible to the stall check
// while a large chunk moves.
const ioPiece = 1 << 20

func (s *stream) run() {
	defer s.c.wg.Done()
	for {
		h := s.head.Load()
		if h == s.tail.Load() {
			select {
			case <-s.wake:
				continue
			case <-s.quit:
				return
			}
		}
		t := s.ring[h%ringSize]
		var err error
		if s.send {
			err = s.write(t)
		} else {
			err = s.read(t)
		}
		if err != nil {
			if !s.c.closing.Load() {
				dir := "receiving from"
				if s.send {
					dir = "sending to"
				}
				if errors.Is(err, io.EOF) {
					s.c.fail(nccl.SystemError, "%s %s: the peer closed the connection (process exited or comm closed)", dir, s.c.peer)
				} else {
					s.c.fail(nccl.SystemError, "%s %s failed: %v", dir, s.c.peer, err)
				}
			}
			return
		}
		s.ring[h%ringSize] = task{}
		s.head.Store(h + 1)
		t.left.Add(-1)
	}
}

func (s *stream) write(t task) error {
	for off := 0; off < t.n; {
		k := min(ioPiece, t.n-off)
		n, err := s.conn.Write(nccl.HostBytes(unsafe.Add(t.p, off), k))
		off += n
		s.c.moved.Add(1)
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *stream) read(t task) error {
	for off := 0; off < t.n; {
		var b []byte
		if t.p == nil {
			if s.scratch == nil {
				s.scratch = make([]byte, 64<<10)
			}
			b = s.scratch[:min(len(s.scratch), t.n-off)]
		} else {
			b = nccl.HostBytes(unsafe.Add(t.p, off), min(ioPiece, t.n-off))
		}
		n, err := s.conn.Read(b)
		off += n
		if n > 0 {
			s.c.moved.Add(1)
		}
		if err != nil && off < t.n {
			return err
		}
	}
	return nil
}

// stripe splits [from, size) of a message into chunks of at least chunk
// bytes, one per stream round-robin from nextStream. Both ends run it over
// the same messages in the same order, so they agree on which stream carries
// which bytes without saying so on the wire.
func (c *core) chunkSize(n int) int {
	ns := len(c.streams)
	cs := (n + ns - 1) / ns
	cs = (cs + 4095) &^ 4095
	return max(cs, c.chunk)
}

func (c *core) stripe(p unsafe.Pointer, from, size int, left *atomic.Int32) bool {
	n := size - from
	if n <= 0 {
		return true
	}
	cs := c.chunkSize(n)
	left.Add(int32((n + cs - 1) / cs))
	for off := from; off < size; off += cs {
		var q unsafe.Pointer
		if p != nil {
			q = unsafe.Add(p, off)
		}
		if !c.streams[c.nextStream].push(task{p: q, n: min(cs, size-off), left: left}) {
			return false
		}
		c.nextStream++
		if c.nextStream == len(c.streams) {
			c.nextStream = 0
		}
	}
	return true
}
