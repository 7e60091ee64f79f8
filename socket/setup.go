package socket

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// sockOpts are the per-socket settings, read when a connection is set up.
type sockOpts struct {
	sndBuf, rcvBuf int
	timeout        time.Duration
}

func readSockOpts(log nccl.Logger) sockOpts {
	return sockOpts{
		sndBuf:  int(nccl.EnvInt(log, envSndBuf, -1)),
		rcvBuf:  int(nccl.EnvInt(log, envRcvBuf, -1)),
		timeout: nccl.PeerTimeout(log),
	}
}

// control sets buffer sizes before connect/listen (they decide the TCP
// window scale, so setting them later is too late).
func (o sockOpts) control(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		if o.sndBuf > 0 {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, o.sndBuf)
		}
		if serr == nil && o.rcvBuf > 0 {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, o.rcvBuf)
		}
	})
	if err != nil {
		return err
	}
	return serr
}

// apply sets TCP_NODELAY, and makes the kernel give up on a dead peer after
// NCCL_GO_TIMEOUT: TCP_USER_TIMEOUT for unacknowledged data, keepalive for
// an idle connection.
func (o sockOpts) apply(c *net.TCPConn) error {
	if err := c.SetNoDelay(true); err != nil {
		return err
	}
	if o.timeout <= 0 {
		return nil
	}
	if err := c.SetKeepAliveConfig(nccl.KeepAlive(o.timeout)); err != nil {
		return err
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(o.timeout/time.Millisecond))
	})
	if err != nil {
		return err
	}
	return serr
}

// listener accepts the streams of one connection. A goroutine accepts TCP
// connections; each gets its own goroutine to read the hello under a short
// deadline, so a silent or hostile client cannot hold up the real peer.
type listener struct {
	t     *Transport
	log   nccl.Logger
	ln    *net.TCPListener
	info  handleInfo
	opts  sockOpts
	hello time.Duration

	mu      sync.Mutex
	closed  bool
	partial map[uint64]*incoming
	greet   map[*net.TCPConn]struct{}
	ready   chan *recvComm
	err     atomic.Pointer[error]
	wg      sync.WaitGroup
}

// incoming is a connection whose streams are still arriving.
type incoming struct {
	ctrl    *net.TCPConn
	streams []*net.TCPConn
	have    int
}

func (t *Transport) listen(d *device, h *nccl.Handle) (nccl.Listener, error) {
	opts := readSockOpts(t.log)
	lc := net.ListenConfig{Control: opts.control}
	addr := netip.AddrPortFrom(d.addr, 0)
	ln, err := lc.Listen(context.Background(), "tcp", addr.String())
	if err != nil {
		t.log.Warnf("NET/GoSocket : listen on %s (%s) failed: %v; check %s", d.name, d.addr, err, envIfname)
		return nil, nccl.Errorf(nccl.SystemError, "listen on %s: %w", d, err)
	}
	tl := ln.(*net.TCPListener)
	port := tl.Addr().(*net.TCPAddr).Port
	l := &listener{t: t, log: t.log, ln: tl, opts: opts, hello: helloTimeout(t.log),
		partial: map[uint64]*incoming{}, greet: map[*net.TCPConn]struct{}{}, ready: make(chan *recvComm, 4)}
	l.info = handleInfo{magic: magic(t.log), version: protoVersion, addr: netip.AddrPortFrom(d.addr.WithZone(""), uint16(port)),
		streams: streamCount(t.log), minChunk: minChunk(t.log)}
	if _, err := rand.Read(l.info.secret[:]); err != nil {
		ln.Close()
		return nil, nccl.Errorf(nccl.SystemError, "reading random bytes: %w", err)
	}
	encodeHandle(h, &l.info)
	t.mu.Lock()
	if !t.ready {
		t.mu.Unlock()
		ln.Close()
		return nil, nccl.Errorf(nccl.InternalError, "socket transport finalized")
	}
	t.listeners[l] = struct{}{}
	t.mu.Unlock()
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

func (l *listener) acceptLoop() {
	defer l.wg.Done()
	for {
		c, err := l.ln.AcceptTCP()
		if err != nil {
			l.mu.Lock()
			closed := l.closed
			l.mu.Unlock()
			if closed {
				return
			}
			if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) || errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.ENOMEM) {
				// Out of descriptors: the connector will retry; wait a little.
				l.log.Warnf("NET/GoSocket : accept on %s: %v; raise the open-files limit (ulimit -n)", l.ln.Addr(), err)
				time.Sleep(50 * time.Millisecond)
				continue
			}
			e := nccl.Errorf(nccl.SystemError, "accept on %s: %w", l.ln.Addr(), err)
			l.err.Store(&e)
			return
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			c.Close()
			return
		}
		l.greet[c] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		go l.greetConn(c)
	}
}

// greetConn reads and checks one stream's hello and files it.
func (l *listener) greetConn(c *net.TCPConn) {
	defer l.wg.Done()
	// A connection that is kept leaves greet in the same critical section that
	// files it (below): the comm it joins can be accepted, and the listener
	// closed, the moment the lock drops, and Close closes whatever is in greet.
	keep := false
	defer func() {
		if keep {
			return
		}
		l.mu.Lock()
		delete(l.greet, c)
		l.mu.Unlock()
		c.Close()
	}()
	peer := c.RemoteAddr().String()
	var b [helloLen]byte
	c.SetReadDeadline(time.Now().Add(l.hello))
	if _, err := io.ReadFull(c, b[:]); err != nil {
		l.log.Infof(nccl.SubsysNet, "NET/GoSocket : discarding connection from %s to %s: no valid hello (%v)", peer, l.ln.Addr(), err)
		return
	}
	c.SetReadDeadline(time.Time{})
	m := decodeHello(b[:])
	switch {
	case m.magic != l.info.magic:
		l.log.Warnf("NET/GoSocket : discarding connection from %s to %s: socket magic %#x, expected %#x "+
			"(another job, or a different %s)", peer, l.ln.Addr(), m.magic, l.info.magic, envMagic)
		return
	case m.version != protoVersion:
		l.log.Warnf("NET/GoSocket : discarding connection from %s: protocol version %d, this library speaks %d "+
			"(use the same libnccl-net-go on every host)", peer, m.version, protoVersion)
		return
	case m.secret != l.info.secret:
		l.log.Infof(nccl.SubsysNet, "NET/GoSocket : discarding connection from %s to %s: wrong listen secret (a stale or foreign connection)", peer, l.ln.Addr())
		return
	case m.streams != l.info.streams || (m.index != ctrlIndex && m.index >= m.streams):
		l.log.Infof(nccl.SubsysNet, "NET/GoSocket : discarding connection from %s: stream %d of %d, expected %d streams", peer, m.index, m.streams, l.info.streams)
		return
	}
	if err := l.opts.apply(c); err != nil {
		l.log.Warnf("NET/GoSocket : setting socket options on the connection from %s: %v", peer, err)
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	in := l.partial[m.connID]
	if in == nil {
		in = &incoming{streams: make([]*net.TCPConn, l.info.streams)}
		l.partial[m.connID] = in
	}
	if m.index == ctrlIndex {
		if in.ctrl != nil {
			return
		}
		in.ctrl = c
	} else {
		if in.streams[m.index] != nil {
			return
		}
		in.streams[m.index] = c
	}
	keep = true
	delete(l.greet, c)
	in.have++
	if in.have < l.info.streams+1 {
		return
	}
	delete(l.partial, m.connID)
	rc, err := newRecvComm(in.ctrl, in.streams, l.info, l.opts, l.log)
	if err != nil {
		l.log.Warnf("NET/GoSocket : setting up the connection from %s: %v", peer, err)
		closeAll(in.ctrl, in.streams)
		return
	}
	select {
	case l.ready <- rc:
	default:
		// NCCL accepts one connection per listen; extra ones are dropped.
		rc.Close()
	}
}

func closeAll(ctrl *net.TCPConn, streams []*net.TCPConn) {
	if ctrl != nil {
		ctrl.Close()
	}
	for _, s := range streams {
		if s != nil {
			s.Close()
		}
	}
}

// Accept implements nccl.Listener; it never blocks.
func (l *listener) Accept() (nccl.RecvComm, error) {
	select {
	case rc := <-l.ready:
		return rc, nil
	default:
	}
	if e := l.err.Load(); e != nil {
		l.log.Warnf("NET/GoSocket : %v", *e)
		return nil, *e
	}
	return nil, nil
}

// Close implements nccl.Listener: it stops accepting and closes every
// connection that was not handed out by Accept.
func (l *listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.ln.Close()
	for c := range l.greet {
		c.Close() // unblocks its hello read
	}
	for id, in := range l.partial {
		closeAll(in.ctrl, in.streams)
		delete(l.partial, id)
	}
	l.mu.Unlock()
	l.wg.Wait()
	for {
		select {
		case rc := <-l.ready:
			rc.Close()
			continue
		default:
		}
		break
	}
	l.t.mu.Lock()
	delete(l.t.listeners, l)
	l.t.mu.Unlock()
	return nil
}

// connectOp is one connection being set up in the background.
type connectOp struct {
	t    *Transport
	dev  *device
	info handleInfo
	id   uint64
	log  nccl.Logger

	done atomic.Bool
	comm *sendComm
	err  error
}

func (op *connectOp) finished() bool { return op.done.Load() }

func (op *connectOp) result() (nccl.SendComm, error) {
	if !op.done.Load() {
		return nil, nil
	}
	if op.err != nil {
		return nil, op.err
	}
	return op.comm, nil
}

// retryable are the errors NCCL retries a connect on: the listener may not
// be up yet, or the network may be briefly unreachable.
func retryable(err error) bool {
	return errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.ETIMEDOUT) ||
		errors.Is(err, unix.EHOSTUNREACH) || errors.Is(err, unix.ENETUNREACH)
}

func (op *connectOp) run(ctx context.Context) {
	opts := readSockOpts(op.log)
	pol := retryPolicy(op.log)
	addr := dialAddr(op.info, op.dev)
	d := net.Dialer{Control: opts.control}
	n := op.info.streams
	var ctrl *net.TCPConn
	streams := make([]*net.TCPConn, n)
	fail := func(err error) {
		closeAll(ctrl, streams)
		op.err = err
		op.done.Store(true)
	}
	hello := hello{magic: magic(op.log), version: protoVersion, streams: n, secret: op.info.secret, connID: op.id}
	for i := -1; i < n; i++ {
		var c *net.TCPConn
		for attempt := 0; ; attempt++ {
			nc, err := d.DialContext(ctx, "tcp", addr)
			if err == nil {
				c = nc.(*net.TCPConn)
				break
			}
			if ctx.Err() != nil {
				fail(nccl.Errorf(nccl.SystemError, "connect to %s abandoned: the transport was finalized", addr))
				return
			}
			if !retryable(err) || attempt >= pol.cnt {
				op.log.Warnf("NET/GoSocket : connect to %s failed after %d retries: %v; check that the peer is alive and "+
					"that %s selects an interface that can reach it (%s / %s tune the retries)",
					addr, attempt, err, envIfname, envRetryCnt, envRetrySleep)
				fail(nccl.Errorf(nccl.SystemError, "connect to %s: %w", addr, err))
				return
			}
			select {
			case <-time.After(pol.sleep * time.Duration(attempt+1)):
			case <-ctx.Done():
			}
		}
		if i < 0 {
			ctrl = c
			hello.index = ctrlIndex
		} else {
			streams[i] = c
			hello.index = i
		}
		if err := opts.apply(c); err != nil {
			op.log.Warnf("NET/GoSocket : setting socket options on the connection to %s: %v", addr, err)
			fail(nccl.Errorf(nccl.SystemError, "socket options on the connection to %s: %w", addr, err))
			return
		}
		var b [helloLen]byte
		hello.encode(b[:])
		c.SetWriteDeadline(time.Now().Add(defaultHelloWait))
		if _, err := c.Write(b[:]); err != nil {
			op.log.Warnf("NET/GoSocket : handshake with %s failed: %v", addr, err)
			fail(nccl.Errorf(nccl.SystemError, "handshake with %s: %w", addr, err))
			return
		}
		c.SetWriteDeadline(time.Time{})
	}
	sc, err := newSendComm(ctrl, streams, op.info, opts, op.log)
	if err != nil {
		op.log.Warnf("NET/GoSocket : setting up the connection to %s: %v", addr, err)
		fail(err)
		return
	}
	op.comm = sc
	op.done.Store(true)
}
