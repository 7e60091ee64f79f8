package ib

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/forkguard"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// connector is one connect in progress; its id and token live in NCCL's
// copy of the handle between calls.
type connector struct {
	token uint64
	done  chan struct{}
	comm  *sendComm
	err   error
	// expiry releases the connector if NCCL never collects it; stopped
	// when NCCL does, or its closure would keep the comm reachable (its
	// memory and the timer) for 2 × NCCL_GO_TIMEOUT after NCCL closed it.
	expiry *time.Timer
}

// Connect starts or continues a connection; see nccl.Transport. It never
// blocks: the handshake runs on a goroutine whose result later calls
// collect.
func (t *Transport) Connect(dev int, handle *nccl.Handle, opts nccl.ConnectOptions) (nccl.SendComm, error) {
	le := leU64{handle}
	if id := le.get(hOffConnID); id != 0 {
		t.pendMu.Lock()
		c := t.pending[id]
		if c == nil || c.token != le.get(hOffToken) {
			t.pendMu.Unlock()
			t.mu.RLock()
			err := t.usableLocked()
			t.mu.RUnlock()
			if err != nil {
				return nil, err
			}
			return nil, nccl.Errorf(nccl.InternalError, "NET/GoIB : connect called with a handle whose connection state is unknown (id %#x)", id)
		}
		select {
		case <-c.done:
			delete(t.pending, id)
			c.expiry.Stop()
		default:
			t.pendMu.Unlock()
			return nil, nil
		}
		t.pendMu.Unlock()
		le.put(hOffConnID, 0)
		le.put(hOffToken, 0)
		if c.err != nil {
			return nil, c.err
		}
		return c.comm, nil
	}
	devs, err := t.members(dev)
	if err != nil {
		return nil, err
	}
	hi, err := readHandle(handle)
	if hi.magic != t.cfg.magic { // checked first, as the socket transport does
		return nil, nccl.Errorf(nccl.InvalidUsage, "NET/GoIB : connect: handle magic %#x differs from ours %#x: set the same NCCL_SOCKET_MAGIC on every rank", hi.magic, t.cfg.magic)
	}
	if err != nil {
		return nil, nccl.Errorf(nccl.ResultOf(err), "NET/GoIB : connect: %w", err)
	}
	c := &connector{token: randomU64(), done: make(chan struct{})}
	id := randomU64()
	// The dial ends within setupLimit; NCCL, which polls connect until it
	// gets the comm, takes it at its next call. One still here a set-up bound
	// later was abandoned (ncclCommAbort during set-up: NCCL never calls
	// connect with this handle again), and only Finalize would release its
	// QPs, memory and handshake connection, while the peer's receives, held
	// alive by that connection, would wait for a sender that never comes.
	c.expiry = time.AfterFunc(2*t.cfg.setupLimit, func() { t.expireConnector(id, c) })
	t.pendMu.Lock()
	t.pending[id] = c
	t.pendMu.Unlock()
	if !t.spawn(nil, func() {
		c.comm, c.err = t.dial(devs, hi, opts)
		close(c.done)
	}) {
		c.expiry.Stop()
		t.pendMu.Lock()
		delete(t.pending, id)
		t.pendMu.Unlock()
		return nil, errFinalized
	}
	le.put(hOffConnID, id)
	le.put(hOffToken, c.token)
	return nil, nil
}

// expireConnector releases connector c (pending as id) if NCCL never
// collected it; see Connect. A later connect call with its handle gets
// "connection state is unknown".
func (t *Transport) expireConnector(id uint64, c *connector) {
	t.pendMu.Lock()
	if t.pending[id] != c {
		t.pendMu.Unlock()
		return // collected, or Finalize took it
	}
	select {
	case <-c.done:
	default:
		t.pendMu.Unlock()
		return // cannot happen: the dial is bounded by setupLimit
	}
	delete(t.pending, id)
	sc := c.comm
	c.comm = nil
	t.pendMu.Unlock()
	if sc != nil {
		t.log.Infof(nccl.SubsysNet, "NET/GoIB : connection to %s was never collected by a connect call within %v (an aborted connection set-up); closing it", sc.peer, 2*t.cfg.setupLimit)
		_ = sc.Close()
	}
}

// dial runs the connector side of the handshake (docs/ib.md, "OOB
// handshake"), bounded by NCCL_GO_TIMEOUT and interrupted by Finalize.
func (t *Transport) dial(devs []*device, hi handleInfo, opts nccl.ConnectOptions) (*sendComm, error) {
	deadline := time.Now().Add(t.cfg.setupLimit)
	conn, err := t.dialRetry(t.dialAddr(hi.addr), deadline)
	if err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : %v", err)
	}
	if !t.track(conn) {
		_ = conn.Close()
		return nil, errFinalized
	}
	kept := false
	defer func() {
		t.untrack(conn)
		if !kept {
			_ = conn.Close()
		}
	}()
	_ = conn.SetDeadline(deadline)
	peer := conn.RemoteAddr().String()
	fail := func(what string, err error) error {
		return nccl.Errorf(nccl.SystemError, "NET/GoIB : handshake with %s: %s: %w", peer, what, err)
	}
	ll := linkLayerOf(devs)
	h := hello{Magic: hi.magic, Type: socketTypeNetIB, Version: protoVersion, Secret: hi.secret, NDevs: uint32(len(devs)), LinkLayer: uint32(ll)}
	if err := writeMsg(conn, &h); err != nil {
		return nil, fail("hello", err)
	}
	var r helloReply
	if err := readMsg(conn, &r); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
			// The listener drops a hello it refuses without a word.
			err = fmt.Errorf("the listener closed the connection without answering (%w): the handle is stale (its listen was closed, or it already accepted a connection), or the ranks run different plugin builds", err)
		}
		return nil, fail("hello reply", err)
	}
	if err := r.check(); err != nil {
		return nil, fail("hello reply", fmt.Errorf("not a libnccl-net-go ib listener (%v): the handle is stale and another service now owns its port, "+
			"or the ranks run different plugin builds", err))
	}
	if r.Status != 0 || verbs.LinkLayer(r.LinkLayer) != ll {
		return nil, nccl.Errorf(nccl.InvalidUsage, "NET/GoIB : attempted to connect incompatible devices: local %v, remote %v link layer (%s); make NCCL_IB_HCA select the same link layer on every node",
			ll, verbs.LinkLayer(r.LinkLayer), peer)
	}
	if r.NDevs < 1 || r.NDevs > maxVDevs {
		return nil, fail("hello reply", fmt.Errorf("peer has %d devices", r.NDevs))
	}
	qs := t.cfg.trafficClass(opts)
	sc, err := newSendComm(t, devs, int(r.NDevs), peer, setupBound{by: deadline})
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = sc.Close()
		}
	}()
	if err := writeMsg(conn, sc.localMeta(sc.fifo.addr(), sc.fifo, qs.tc, qs.sl)); err != nil {
		return nil, fail("sending QP info", err)
	}
	var rm connMeta
	if err := readMsg(conn, &rm); err != nil {
		return nil, fail("reading QP info", err)
	}
	if err := validateMeta(&rm, len(sc.qps)); err != nil {
		return nil, fail("QP info", err)
	}
	if err := sc.finish(&rm, qs); err != nil {
		return nil, err
	}
	if err := writeMsg(conn, uint32(readyMagic)); err != nil {
		return nil, fail("ready", err)
	}
	sc.watch.attach(conn, t.cfg.peerTime)
	ok, kept = true, true
	return sc, nil
}

// dialAddr is where the handshake dials: an IPv6 link-local listener address
// is only meaningful on a link, and the handle carries no zone (NCCL's carries
// the listener's interface index, which is only right where both hosts number
// interfaces alike), so it takes our own handshake interface as zone.
func (t *Transport) dialAddr(ap netip.AddrPort) netip.AddrPort {
	if a := ap.Addr(); a.Is6() && a.IsLinkLocalUnicast() && t.oobName != "" {
		return netip.AddrPortFrom(a.WithZone(t.oobName), ap.Port())
	}
	return ap
}

// dialRetry connects to addr, retrying refused/unreachable connections like
// NCCL does (NCCL_SOCKET_RETRY_CNT x NCCL_SOCKET_RETRY_SLEEP_MSEC, linear
// back-off), until deadline or Finalize.
func (t *Transport) dialRetry(addr netip.AddrPort, deadline time.Time) (net.Conn, error) {
	ctx := t.life.ctx
	for i := 0; ; i++ {
		d := net.Dialer{Deadline: deadline}
		c, err := d.DialContext(ctx, "tcp", addr.String())
		if err == nil {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetNoDelay(true)
				_ = forkguard.TrackConn(tc) // the peer's liveness: see forkguard
			}
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("connect to %v: the transport was finalized", addr)
		}
		sleep := t.cfg.dialSleep * time.Duration(i+1)
		retryable := errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ETIMEDOUT) || errors.Is(err, syscall.EHOSTUNREACH)
		if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
			// Out of descriptors: the network is not the problem.
			return nil, fmt.Errorf("connect to %v: %w; raise the open-files limit (ulimit -n)", addr, err)
		}
		if !retryable || i >= t.cfg.dialRetry || time.Now().Add(sleep).After(deadline) {
			return nil, fmt.Errorf("connect to %v: %w (after %d retries within NCCL_GO_TIMEOUT=%v; check NCCL_SOCKET_IFNAME and firewalls)", addr, err, i, t.cfg.setupLimit)
		}
		if !t.pause(sleep, nil) {
			return nil, fmt.Errorf("connect to %v: the transport was finalized", addr)
		}
	}
}
