package ib

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/forkguard"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// helloTimeout bounds how long a connection may stay silent before its
// hello: anything slower is a stray connection, not an NCCL peer.
const helloTimeout = 5 * time.Second

// Listen opens the out-of-band TCP listener on the chosen interface and
// writes the handle. It does not block: accepting and the handshake run on
// goroutines that Accept polls.
func (t *Transport) Listen(dev int, handle *nccl.Handle) (nccl.Listener, error) {
	devs, err := t.members(dev)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(t.oobAddr.String(), "0"))
	if err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : listen on %s (%v): %w; set NCCL_SOCKET_IFNAME to a usable interface", t.oobName, t.oobAddr, err)
	}
	// A forked child of the host must not keep the port, or the handshake
	// connections (the peers' liveness), open after this rank is gone.
	l := newListener(t, devs, forkguard.Listener(ln))
	t.life.mu.Lock()
	closing := t.life.closing
	if !closing {
		t.life.listeners[l] = struct{}{}
	}
	t.life.mu.Unlock()
	if closing || !t.spawn(&l.wg, l.acceptLoop) {
		_ = ln.Close()
		return nil, errFinalized
	}
	ap := ln.Addr().(*net.TCPAddr).AddrPort()
	writeHandle(handle, handleInfo{magic: l.magic, secret: l.secret, addr: ap})
	return l, nil
}

// listener is one listen: its accept loop, the handshakes it serves (one
// goroutine each, all counted in wg) and the one comm it hands to Accept.
type listener struct {
	t      *Transport
	devs   []*device
	ln     net.Listener
	magic  uint64
	secret uint64
	wg     sync.WaitGroup

	claimed atomic.Bool
	mu      sync.Mutex
	closed  bool
	conns   map[net.Conn]struct{} // handshakes in progress
	done    chan struct{}
	quit    chan struct{} // closed by Close: ends a handshake's QP transition retries
	comm    *recvComm
	err     error
	taken   bool
	// expiry closes a comm Accept never took; stopped when Accept takes it
	// or the listen closes, or its closure would keep the listen and the
	// comm reachable for NCCL_GO_TIMEOUT after NCCL closed them.
	expiry *time.Timer
}

func newListener(t *Transport, devs []*device, ln net.Listener) *listener {
	return &listener{t: t, devs: devs, ln: ln, magic: t.cfg.magic, secret: randomU64(),
		done: make(chan struct{}), quit: make(chan struct{}), conns: map[net.Conn]struct{}{}}
}

func (l *listener) acceptLoop() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			l.acceptFailed(err)
			return
		}
		if !l.trackConn(c) {
			_ = c.Close()
			return
		}
		if !l.t.spawn(&l.wg, func() { l.serve(c) }) {
			l.untrackConn(c)
			_ = c.Close()
			return
		}
	}
}

// acceptFailed ends a listen whose socket stopped accepting for a reason
// other than Close (EMFILE, ENFILE, ENOBUFS: Go already retries EAGAIN,
// EINTR and ECONNABORTED): Accept fails with SystemError, as NCCL's
// socketTryAccept does, instead of reporting "not yet" forever. A handshake
// that already claimed the listen still delivers its own result.
func (l *listener) acceptFailed(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || errors.Is(err, net.ErrClosed) || !l.claimed.CompareAndSwap(false, true) {
		return
	}
	l.t.log.Warnf("NET/GoIB : accept on %v failed: %v; no peer can connect to this listen (raise the open-file limit, ulimit -n, if it says too many open files)", l.ln.Addr(), err)
	l.err = nccl.Errorf(nccl.SystemError, "NET/GoIB : accept on %v: %w", l.ln.Addr(), err)
	close(l.done)
}

// trackConn registers a handshake connection so Close can interrupt it.
func (l *listener) trackConn(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *listener) untrackConn(c net.Conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
}

// serve runs the listener side of one handshake. A connection with the
// wrong magic, type or secret is dropped without disturbing the listen.
func (l *listener) serve(conn net.Conn) {
	kept := false
	defer func() {
		l.untrackConn(conn)
		if !kept {
			_ = conn.Close()
		}
	}()
	_ = conn.SetDeadline(time.Now().Add(helloTimeout))
	var h hello
	if err := readMsg(conn, &h); err != nil {
		l.t.log.Infof(nccl.SubsysNet, "NET/GoIB : dropping connection from %v: no hello (%v)", conn.RemoteAddr(), err)
		return
	}
	if err := h.check(l.magic, l.secret); err != nil {
		var ve *versionError
		if errors.As(err, &ve) {
			// The right magic and type: a rank of this job running another
			// build (a rolling upgrade, a stale install on one node).
			l.t.log.Warnf("NET/GoIB : refusing the connection from %v: its %v; use the same libnccl-net-go build on every host", conn.RemoteAddr(), err)
			return
		}
		l.t.log.Infof(nccl.SubsysNet, "NET/GoIB : dropping connection from %v: %v (NCCL_SOCKET_MAGIC differs, or a stray connection)", conn.RemoteAddr(), err)
		return
	}
	if !l.claimed.CompareAndSwap(false, true) {
		l.t.log.Infof(nccl.SubsysNet, "NET/GoIB : dropping second connection from %v on a listen that already has one", conn.RemoteAddr())
		return
	}
	rc, err := l.handshake(conn, &h)
	if rc != nil {
		rc.watch.attach(conn, l.t.cfg.peerTime)
		kept = true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	// The comm owns conn now. Untrack it before the comm becomes visible to
	// Accept: NCCL closes the listen right after Accept, and that Close would
	// otherwise close the comm's dead-peer connection under it.
	delete(l.conns, conn)
	if l.closed {
		// Close is waiting for us; the comm was never NCCL's.
		if rc != nil {
			_ = rc.Close()
		}
		return
	}
	l.comm, l.err = rc, err
	close(l.done)
	if rc != nil {
		// NCCL polls accept until it gets the comm and closes the listen
		// right after. A comm still not taken a set-up bound later was
		// abandoned (ncclCommAbort during set-up, with a v8-v10 table whose
		// listen NCCL never closes); release it, and with it the peer, whose
		// sends would otherwise wait on a receiver that never comes.
		l.expiry = time.AfterFunc(l.t.cfg.setupLimit, l.expire)
	}
}

// expire closes the accepted comm if Accept never took it; see serve.
func (l *listener) expire() {
	l.mu.Lock()
	if l.closed || l.taken || l.comm == nil {
		l.mu.Unlock()
		return
	}
	rc := l.comm
	l.comm, l.err = nil, nccl.Errorf(nccl.InternalError, "NET/GoIB : the connection from %s was not accepted within %v and was closed", rc.peer, l.t.cfg.setupLimit)
	l.mu.Unlock()
	l.t.log.Infof(nccl.SubsysNet, "NET/GoIB : connection from %s was never taken by an accept call within %v (an aborted connection set-up); closing it", rc.peer, l.t.cfg.setupLimit)
	_ = rc.Close()
}

func (l *listener) handshake(conn net.Conn, h *hello) (*recvComm, error) {
	t := l.t
	deadline := time.Now().Add(t.cfg.setupLimit)
	_ = conn.SetDeadline(deadline)
	ll := linkLayerOf(l.devs)
	reply := helloReply{NDevs: uint32(len(l.devs)), LinkLayer: uint32(ll)}
	incompatible := verbs.LinkLayer(h.LinkLayer) != ll || ll == verbs.LinkUnspecified
	if incompatible {
		reply.Status = replyIncompatible
	}
	if err := writeMsg(conn, &reply); err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : handshake with %v: %w", conn.RemoteAddr(), err)
	}
	if incompatible {
		return nil, nccl.Errorf(nccl.InvalidUsage, "NET/GoIB : attempted to connect incompatible devices: local %v, remote %v link layer; make NCCL_IB_HCA select the same link layer on every node",
			ll, verbs.LinkLayer(h.LinkLayer))
	}
	var sm connMeta
	if err := readMsg(conn, &sm); err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : handshake with %v: reading QP info: %w", conn.RemoteAddr(), err)
	}
	if err := validateMeta(&sm, int(sm.NQPs)); err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : handshake with %v: %v", conn.RemoteAddr(), err)
	}
	// A connector makes at least one QP per member of the larger side, and
	// the receive comm relies on it: each clear-to-send goes on the first QP
	// of member (id % ndevs).
	if need := max(len(l.devs), int(sm.NDevs)); int(sm.NQPs) < need {
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : handshake with %v: peer offers %d QPs for %d local and %d remote devices (at least %d needed): mismatched plugin versions?",
			conn.RemoteAddr(), sm.NQPs, len(l.devs), sm.NDevs, need)
	}
	rc, err := newRecvComm(t, l.devs, &sm, conn.RemoteAddr().String(), setupBound{by: deadline, abort: l.quit})
	if err != nil {
		return nil, err
	}
	if err := writeMsg(conn, rc.meta); err != nil {
		_ = rc.Close()
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : handshake with %v: %w", conn.RemoteAddr(), err)
	}
	var ready uint32
	if err := readMsg(conn, &ready); err != nil || ready != readyMagic {
		_ = rc.Close()
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : handshake with %v: peer did not confirm (ready %#x, %v)", conn.RemoteAddr(), ready, err)
	}
	return rc, nil
}

func (l *listener) Accept() (nccl.RecvComm, error) {
	// One critical section: with two, a Close (or Finalize, from another
	// thread) between them released the connection and this returned it,
	// a non-nil RecvComm around a nil *recvComm.
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, nccl.Errorf(nccl.InternalError, "NET/GoIB : accept on a closed listen (or a finalized transport)")
	}
	select {
	case <-l.done:
	default:
		return nil, nil
	}
	if l.taken {
		return nil, nccl.Errorf(nccl.InternalError, "NET/GoIB : accept called again on a listen that already returned its connection")
	}
	l.taken = true
	if l.expiry != nil {
		l.expiry.Stop()
	}
	if l.err != nil {
		return nil, l.err
	}
	return l.comm, nil
}

// Close stops listening, interrupts any handshake in progress and waits for
// its goroutines (they only wait on connections Close has just closed), and
// releases a connection that was made but never accepted.
func (l *listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.quit)
	conns := make([]net.Conn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()
	_ = l.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
	l.wg.Wait()
	l.mu.Lock()
	if l.expiry != nil {
		l.expiry.Stop()
	}
	if l.comm != nil && !l.taken {
		_ = l.comm.Close()
		l.comm = nil
	}
	l.mu.Unlock()
	l.t.life.mu.Lock()
	delete(l.t.life.listeners, l)
	l.t.life.mu.Unlock()
	return nil
}
