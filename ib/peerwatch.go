package ib

import (
	"errors"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/internal/clock"
	"github.com/libnccl-net-go/libnccl-net-go/internal/timeout"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// RDMA gives a receiver no signal when its sender dies: a receive whose
// sender was killed mid-transfer just never completes (NCCL's own IB
// transport hangs there until the job is aborted from outside), and a
// sender waiting for a clear-to-send from a dead receiver waits forever.
// The handshake TCP connection is therefore kept open for the comm's
// lifetime, carrying nothing, and the data path reads it, without blocking,
// now and then:
//
//   - end of file or a reset: the peer's process exited or closed its comm;
//   - ETIMEDOUT: the peer's host stopped answering. TCP keepalive probes the
//     idle connection and TCP_USER_TIMEOUT (NCCL_GO_TIMEOUT) aborts it when
//     they go unacknowledged that long, so a vanished host is noticed within
//     NCCL_GO_TIMEOUT, in both directions, with or without data in flight.
//
// Liveness, not progress: a peer whose kernel still answers is alive however
// long its application does not post, read, or even run (a SIGSTOPped
// process included); NCCL's or the framework's watchdog owns that decision.

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
	conn   *net.TCPConn // owns the socket; nil when the comm has no OOB connection
	raw    syscall.RawConn
	readFn func(fd uintptr) bool // made once: calling it allocates nothing
	n      int
	err    error
	calls  uint32
	goneAt int64 // monotonic ns at which the close was seen; 0 while alive
	why    string
	buf    [16]byte
	now    func() int64 // the monotonic clock (tests move it)
}

// attach takes ownership of the handshake connection and arms keepalive and
// TCP_USER_TIMEOUT with the dead-peer timeout (off when it is 0). It is best
// effort: without it (a connection that is not TCP) the comm just cannot
// tell a dead peer from a slow one.
func (w *peerWatch) attach(conn net.Conn, d time.Duration) {
	w.now = clock.Now
	tc, ok := conn.(*net.TCPConn)
	if !ok {
		_ = conn.Close()
		return
	}
	_ = tc.SetDeadline(time.Time{})
	raw, err := tc.SyscallConn()
	if err != nil {
		_ = conn.Close()
		return
	}
	if d <= 0 {
		// NCCL_GO_TIMEOUT <= 0 turns dead-host detection off; Go's dialer
		// and listener would otherwise have left their 15 s keepalive on.
		_ = tc.SetKeepAlive(false)
	} else {
		_ = tc.SetKeepAliveConfig(timeout.KeepAlive(d))
		ms := int(min(d.Milliseconds(), 1<<31-1))
		_ = raw.Control(func(fd uintptr) {
			_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, ms)
		})
	}
	w.conn, w.raw = tc, raw
	w.readFn = func(fd uintptr) bool {
		w.n, w.err = unix.Read(int(fd), w.buf[:])
		return true // never wait for readiness: the data path must not block
	}
}

// gone reports, at most every peerCheckEvery calls, whether the peer went
// away more than peerGrace ago. The caller has just polled its completions
// and still has work pending. Progress-thread only; no allocation.
func (w *peerWatch) gone() bool {
	if w.conn == nil {
		return false
	}
	w.calls++
	if w.calls%peerCheckEvery != 0 {
		return false
	}
	if w.goneAt == 0 {
		if err := w.raw.Read(w.readFn); err != nil {
			w.n, w.err = 0, err
		}
		switch {
		case w.err == nil && w.n == 0:
			w.why = "closed the connection (its process exited or it closed the comm)"
		case w.err == nil:
			w.why = "sent unexpected bytes on the idle handshake connection (a different plugin build?)"
		case errors.Is(w.err, unix.EAGAIN) || errors.Is(w.err, unix.EINTR):
			return false
		case errors.Is(w.err, unix.ETIMEDOUT):
			w.why = "stopped answering: its host is unreachable (keepalive unacknowledged for NCCL_GO_TIMEOUT)"
		default:
			w.why = "connection failed: " + w.err.Error()
		}
		w.goneAt = max(w.now(), 1)
		return false
	}
	return w.now()-w.goneAt >= int64(peerGrace)
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
