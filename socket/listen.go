package socket

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/forkguard"
	"github.com/libnccl-net-go/libnccl-net-go/internal/clock"
	"github.com/libnccl-net-go/libnccl-net-go/internal/timeout"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// A listener is advanced by NCCL's accept calls, on NCCL's thread, like a
// connect: each call accepts what the kernel queued (non-blocking), reads
// what arrived of each stream's hello, files complete hellos by connection,
// and hands out a connection once its control, liveness and data streams are
// all there. A silent or hostile client only occupies a descriptor until its
// hello deadline; it never holds up the real peer, and no goroutine exists to
// be stopped on close.

const (
	// acceptBatch bounds the connections one accept call takes from the
	// kernel, so that a flood cannot make it run long.
	acceptBatch = 64
	// maxGreeting bounds connections whose hello is still awaited; beyond
	// it the oldest is dropped.
	maxGreeting = 1024
)

type listener struct {
	t       *Transport
	log     nccl.Logger
	fd      int
	addr    string
	info    handleInfo
	opts    sockOpts
	hello   int64 // NCCL_GO_SOCKET_HELLO_TIMEOUT
	partial int64 // how long a connection's streams may take to all arrive

	mu       sync.Mutex
	closed   bool
	greeting []*greeting
	conns    map[uint64]*incoming
	ready    []accepted // complete, not yet handed out
	// starved is when accept4 began failing for want of descriptors or
	// kernel memory (0: it is not failing).
	starved int64
}

// accepted is a connection whose streams all arrived: its comm, or why it
// could not be set up. The connector already has its comm, so a failure is
// Accept's answer in its turn, not something to drop: NCCL would call accept
// for it forever.
type accepted struct {
	rc  *recvComm
	err error
}

// greeting is an accepted stream whose hello is still arriving.
type greeting struct {
	fd    int
	peer  string
	since int64
	got   int
	buf   [helloLen]byte
}

// incoming is a connection whose streams are still arriving.
type incoming struct {
	cs    conns
	have  int
	since int64
	peer  string
}

func (t *Transport) listen(d *device, h *nccl.Handle) (nccl.Listener, error) {
	streams := streamCount(t.log)
	l := &listener{t: t, log: t.log, opts: readSockOpts(t.log, streams), conns: map[uint64]*incoming{}}
	l.hello = int64(helloTimeout(t.log))
	// A connector gives up NCCL_GO_TIMEOUT (timeout.Bound) after it
	// started, before its first stream arrived here: a connection still
	// incomplete that long after its first stream never will be. The hello
	// wait on top is slack: a connect checks for completion before its
	// deadline, and the connector's host may set a larger timeout.
	l.partial = int64(timeout.Bound(l.opts.timeout)) + l.hello
	bind := netip.AddrPortFrom(d.addr.WithZone(""), 0)
	fd, err := newSocket(bind, l.opts)
	if err == nil {
		scope := 0
		if d.addr.Is6() && d.addr.IsLinkLocalUnicast() {
			scope = d.index
		}
		if err = unix.Bind(fd, sockaddrOf(bind, scope)); err == nil {
			err = unix.Listen(fd, unix.SOMAXCONN)
		}
		if err != nil {
			forkguard.Close(fd)
		}
	}
	var sa unix.Sockaddr
	if err == nil {
		if sa, err = unix.Getsockname(fd); err != nil {
			forkguard.Close(fd)
		}
	}
	if err != nil {
		if errors.Is(err, unix.EADDRNOTAVAIL) {
			why := addrGoneHint(d)
			t.log.Warnf("NET/GoSocket : listen on %s (%s) failed: %v: %s", d.name, d.addr, err, why)
			return nil, nccl.Errorf(nccl.SystemError, "listen on %s: %w (%s)", d, err, why)
		}
		t.log.Warnf("NET/GoSocket : listen on %s (%s) failed: %v; check %s%s", d.name, d.addr, err, envIfname, fdHint(err))
		return nil, nccl.Errorf(nccl.SystemError, "listen on %s: %w", d, err)
	}
	l.fd = fd
	port := addrPortOf(sa).Port()
	l.addr = netip.AddrPortFrom(d.addr, port).String()
	l.info = handleInfo{magic: magic(t.log), version: protoVersion, addr: netip.AddrPortFrom(d.addr.WithZone(""), port),
		streams: streams, minChunk: minChunk(t.log)}
	if _, err := rand.Read(l.info.secret[:]); err != nil {
		forkguard.Close(fd)
		return nil, nccl.Errorf(nccl.SystemError, "reading random bytes: %w", err)
	}
	encodeHandle(h, &l.info)
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.ready {
		forkguard.Close(fd)
		return nil, nccl.Errorf(nccl.InternalError, "socket transport finalized")
	}
	t.listeners[l] = struct{}{}
	return l, nil
}

// Accept implements nccl.Listener; it never blocks.
func (l *listener) Accept() (nccl.RecvComm, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, nccl.Errorf(nccl.InvalidArgument, "accept on a closed listener (%s)", l.addr)
	}
	t := clock.Now()
	if err := l.acceptNew(t); err != nil {
		return nil, err
	}
	l.readHellos(t)
	l.expire(t)
	if len(l.ready) == 0 {
		return nil, nil
	}
	a := l.ready[0]
	l.ready = l.ready[1:]
	if a.err != nil {
		return nil, a.err
	}
	return a.rc, nil
}

// acceptNew takes the connections the kernel has queued.
func (l *listener) acceptNew(t int64) error {
	for i := 0; i < acceptBatch; i++ {
		fd, sa, err := unix.Accept4(l.fd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		if err == nil {
			_ = forkguard.Track(fd) // see newSocket
		}
		switch {
		case err == unix.EAGAIN:
			return nil
		case err == unix.EINTR || err == unix.ECONNABORTED:
			continue
		case errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) || errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.ENOMEM):
			// The connector keeps its connection until we can take it, if
			// descriptors come free within the set-up bound (another
			// communicator closing). A process that stays out of them
			// would otherwise have NCCL call accept for ever, a silent hang
			// (NCCL prints no WARN by default): past the bound it is
			// accept's error, as NCCL's socketTryAccept fails at once.
			bound := timeout.Bound(l.opts.timeout)
			if l.starved == 0 {
				l.starved = t
				l.log.Warnf("NET/GoSocket : accept on %s: %v; raise the open-files limit (ulimit -n); "+
					"retrying for %s=%v", l.addr, err, envTimeout, bound)
			}
			if t-l.starved < int64(bound) {
				return nil
			}
			l.log.Warnf("NET/GoSocket : accept on %s failed for %v: %v; raise the open-files limit (ulimit -n). "+
				"Each connection end uses 2 + %s × %s descriptors, plus one per helper (%s)",
				l.addr, bound, err, envNThreads, envNSocks, envHelpers)
			return nccl.Errorf(nccl.SystemError, "accept on %s: %w for %v (%s); raise the open-files limit (ulimit -n)",
				l.addr, err, bound, envTimeout)
		case err != nil:
			l.log.Warnf("NET/GoSocket : accept on %s failed: %v", l.addr, err)
			return nccl.Errorf(nccl.SystemError, "accept on %s: %w", l.addr, err)
		}
		l.starved = 0
		if len(l.greeting) >= maxGreeting {
			g := l.greeting[0]
			l.log.Infof(nccl.SubsysNet, "NET/GoSocket : discarding connection from %s to %s: %d connections are already "+
				"waiting to say hello", g.peer, l.addr, maxGreeting)
			forkguard.Close(g.fd)
			l.greeting = l.greeting[1:]
		}
		l.greeting = append(l.greeting, &greeting{fd: fd, peer: addrPortOf(sa).String(), since: t})
	}
	return nil
}

// readHellos reads what arrived of each pending hello and files the
// complete ones.
func (l *listener) readHellos(t int64) {
	keep := l.greeting[:0]
	for _, g := range l.greeting {
		n, eof, err := recvSlice(g.fd, g.buf[g.got:])
		g.got += n
		switch {
		case g.got == helloLen:
			l.file(g, t)
			continue
		case err != nil || eof:
			why := "it closed the connection"
			if err != nil {
				why = err.Error()
			}
			l.log.Infof(nccl.SubsysNet, "NET/GoSocket : discarding connection from %s to %s: no valid hello (%s)", g.peer, l.addr, why)
		case t-g.since > l.hello:
			l.log.Infof(nccl.SubsysNet, "NET/GoSocket : discarding connection from %s to %s: no valid hello within %v (%s)",
				g.peer, l.addr, time.Duration(l.hello), envHelloTimeout)
		default:
			keep = append(keep, g)
			continue
		}
		forkguard.Close(g.fd)
	}
	clear(l.greeting[len(keep):])
	l.greeting = keep
}

// file checks a complete hello and adds its stream to its connection.
func (l *listener) file(g *greeting, t int64) {
	m := decodeHello(g.buf[:])
	bad := checkHello(m, l.info)
	switch bad {
	case helloBadMagic:
		l.log.Warnf("NET/GoSocket : discarding connection from %s to %s: socket magic %#x, expected %#x "+
			"(another job, or a different %s)", g.peer, l.addr, m.magic, l.info.magic, envMagic)
	case helloBadVersion:
		l.log.Warnf("NET/GoSocket : discarding connection from %s: protocol version %d, this library speaks %d "+
			"(use the same libnccl-net-go on every host)", g.peer, m.version, protoVersion)
	case helloBadSecret:
		l.log.Infof(nccl.SubsysNet, "NET/GoSocket : discarding connection from %s to %s: wrong listen secret (a stale or foreign connection)", g.peer, l.addr)
	case helloBadLayout:
		l.log.Infof(nccl.SubsysNet, "NET/GoSocket : discarding connection from %s: stream %d of %d, expected %d streams", g.peer, m.index, m.streams, l.info.streams)
	}
	var err error
	if bad == helloOK {
		if m.index == beatIndex {
			err = setupLiveness(g.fd, l.opts.live)
		} else {
			err = setNoDelay(g.fd)
		}
		if err != nil {
			l.log.Warnf("NET/GoSocket : setting socket options on the connection from %s: %v", g.peer, err)
		}
	}
	if bad != helloOK || err != nil {
		forkguard.Close(g.fd)
		return
	}
	in := l.conns[m.connID]
	if in == nil {
		in = &incoming{cs: conns{ctrl: -1, beat: -1, data: make([]int, l.info.streams)}, since: t, peer: g.peer}
		for i := range in.cs.data {
			in.cs.data[i] = -1
		}
		l.conns[m.connID] = in
	}
	slot := &in.cs.ctrl
	switch m.index {
	case ctrlIndex:
	case beatIndex:
		slot = &in.cs.beat
	default:
		slot = &in.cs.data[m.index]
	}
	if *slot >= 0 {
		l.log.Infof(nccl.SubsysNet, "NET/GoSocket : discarding a second stream %d of connection %#x from %s", m.index, m.connID, g.peer)
		forkguard.Close(g.fd)
		return
	}
	*slot = g.fd
	if in.have++; in.have < l.info.streams+2 {
		return
	}
	delete(l.conns, m.connID)
	rc, err := newRecvComm(in.cs, l.info, l.opts, l.log)
	if err != nil {
		err = nccl.Errorf(nccl.ResultOf(err), "setting up the connection from %s: %w", in.peer, err)
	}
	l.ready = append(l.ready, accepted{rc, err})
}

// expire drops connections whose streams did not all arrive in time: their
// connector gave up (or died) half way. Each carried this listen's secret,
// so it was the connection NCCL is calling accept for, and its connector may
// already hold its comm (connect returns once every hello is written into
// its own kernel): the failure is accept's answer in its turn, as for a
// connection that could not be set up. Dropped silently, NCCL would call
// accept for it forever. A live connector has finished or failed by then:
// its own deadline, NCCL_GO_TIMEOUT as well, started before its first stream
// arrived here (l.partial adds the hello wait as slack).
func (l *listener) expire(t int64) {
	for id, in := range l.conns {
		if t-in.since <= l.partial {
			continue
		}
		l.log.Infof(nccl.SubsysNet, "NET/GoSocket : discarding a half-open connection from %s to %s: %d of %d streams "+
			"arrived within %v", in.peer, l.addr, in.have, l.info.streams+2, time.Duration(l.partial))
		in.cs.close()
		delete(l.conns, id)
		l.ready = append(l.ready, accepted{err: nccl.Errorf(nccl.SystemError,
			"the connection from %s never completed: %d of its %d streams arrived within %v (%s); its host died or "+
				"the network was cut while it connected", in.peer, in.have, l.info.streams+2, time.Duration(l.partial), envTimeout+" plus "+envHelloTimeout)})
	}
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
	forkguard.Close(l.fd)
	for _, g := range l.greeting {
		forkguard.Close(g.fd)
	}
	l.greeting = nil
	for id, in := range l.conns {
		in.cs.close()
		delete(l.conns, id)
	}
	ready := l.ready
	l.ready = nil
	l.mu.Unlock()
	for _, a := range ready {
		if a.rc != nil {
			a.rc.Close()
		}
	}
	l.t.mu.Lock()
	delete(l.t.listeners, l)
	l.t.mu.Unlock()
	return nil
}

// addrGoneHint explains EADDRNOTAVAIL from bind: the device's address,
// chosen once at init as NCCL chooses it, is not (or not yet) usable on its
// interface.
func addrGoneHint(d *device) string {
	h := fmt.Sprintf("%s is no longer an address of %s: devices and their addresses are chosen once, at init (as by NCCL), "+
		"and this one was removed or changed since; restore it, or restart the job", d.addr.WithZone(""), d.name)
	if d.addr.Is6() {
		h += " (an IPv6 address that is still tentative, in duplicate address detection, cannot be used either: wait until `ip addr` no longer shows it tentative)"
	}
	return h
}
