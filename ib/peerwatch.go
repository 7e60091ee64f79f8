package ib

import (
	"errors"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// RDMA gives a receiver no signal when its sender dies: a receive whose
// sender was killed mid-transfer just never completes (NCCL's own IB
// transport hangs there until the job is aborted from outside). The
// handshake TCP connection is therefore kept open for the comm's lifetime,
// carrying nothing, and the data path polls it now and then: end of file or
// a reset means the peer's process exited or it closed its comm. TCP
// keepalive covers a peer host that vanished without closing anything.

const (
	// peerCheckEvery: one non-blocking read per this many data-path calls
	// that found nothing to do, so the syscall costs a few ns per call.
	peerCheckEvery = 128
	// peerGrace: how long completions may still arrive after the peer's
	// close was seen. A sender that closes right after its last send
	// completed is fine (the data is already here; its completion just has
	// to be polled), so a request fails only if it stays pending this long.
	peerGrace = time.Second
)

type peerWatch struct {
	conn   net.Conn // owns the fd; nil when the comm has no OOB connection
	fd     int
	calls  uint32
	goneAt int64 // monotonic ns at which the close was seen; 0 while alive
	why    string
	buf    [16]byte
}

// epoch anchors the monotonic clock of goneAt.
var epoch = time.Now()

func monoNow() int64 { return int64(time.Since(epoch)) }

// attach takes ownership of the handshake connection. It is best effort:
// without it (a connection that is not TCP) the comm just cannot tell a dead
// peer from a slow one.
func (w *peerWatch) attach(conn net.Conn, log nccl.Logger) {
	tc, ok := conn.(*net.TCPConn)
	if !ok {
		_ = conn.Close()
		return
	}
	_ = tc.SetDeadline(time.Time{})
	if d := nccl.PeerTimeout(log); d > 0 {
		_ = tc.SetKeepAliveConfig(nccl.KeepAlive(d))
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		_ = conn.Close()
		return
	}
	fd := -1
	if rc.Control(func(f uintptr) { fd = int(f) }) != nil || fd < 0 {
		_ = conn.Close()
		return
	}
	w.conn, w.fd = tc, fd
}

// gone reports, at most every peerCheckEvery calls, whether the peer closed
// more than peerGrace ago. The caller has just polled its completions and
// still has work pending. Progress-thread only; no allocation.
func (w *peerWatch) gone() bool {
	if w.conn == nil {
		return false
	}
	w.calls++
	if w.calls%peerCheckEvery != 0 {
		return false
	}
	if w.goneAt == 0 {
		n, err := unix.Read(w.fd, w.buf[:])
		switch {
		case err == nil && n == 0:
			w.why = "closed the connection (its process exited or it closed the comm)"
		case err == nil:
			w.why = "sent unexpected bytes on the idle handshake connection (a different plugin build?)"
		case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR):
			return false
		default:
			w.why = "connection failed: " + err.Error()
		}
		w.goneAt = max(monoNow(), 1)
		return false
	}
	return monoNow()-w.goneAt >= int64(peerGrace)
}

func (w *peerWatch) close() {
	if w.conn != nil {
		_ = w.conn.Close()
		w.conn = nil
	}
}

// peerGoneError fails the comm because its peer is gone while work is pending.
func (c *commCore) peerGoneError(what string) error {
	c.log.Warnf("NET/GoIB : %s with %s on %s cannot complete: the peer %s; check the peer's log for why it exited (NCCL_GO_TIMEOUT bounds how long a silently vanished host goes unnoticed)",
		what, c.peer, c.name, c.watch.why)
	c.failed = nccl.Errorf(nccl.SystemError, "NET/GoIB : peer %s %s", c.peer, c.watch.why)
	return c.failed
}
