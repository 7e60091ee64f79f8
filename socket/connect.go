package socket

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/forkguard"
	"github.com/libnccl-net-go/libnccl-net-go/internal/clock"
	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclsock"
	"github.com/libnccl-net-go/libnccl-net-go/internal/timeout"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// A connect is a state machine advanced by NCCL's repeated connect calls, on
// NCCL's own thread: every stream's socket connects without blocking, its
// completion is polled with a zero timeout, its hello is written into the
// empty socket buffer. No goroutine runs, so there is nothing to stop on
// Finalize or abort; a connect that is no longer polled holds its
// descriptors until the next connect or listen after its deadline
// (sweepPending), or Finalize, closes them.
//
// Refused, unreachable and timed-out attempts are retried as NCCL does
// (NCCL_SOCKET_RETRY_CNT times, NCCL_SOCKET_RETRY_SLEEP_MSEC × attempt
// apart); the whole connect, retries and unanswered SYNs included, ends after
// NCCL_GO_TIMEOUT.

type dialState uint8

const (
	dialWait       dialState = iota // waiting to (re)try at retryAt
	dialConnecting                  // connect in progress
	dialHello                       // connected, hello partly written
	dialDone                        // hello written
)

type dialSock struct {
	fd      int
	index   int // hello index
	state   dialState
	attempt int
	retryAt int64
	sent    int
	hello   [helloLen]byte
}

// connectOp is one connection being set up.
type connectOp struct {
	id   uint64
	log  nccl.Logger
	info handleInfo
	addr string
	sa   unix.Sockaddr
	// local is the address each stream binds before connecting (nil: the
	// kernel chooses): device d's own, for a listener on d's subnet.
	local  unix.Sockaddr
	device string // the device NCCL connected on, for WARNs
	opts   sockOpts
	pol    ncclsock.Retry
	start  int64
	// deadline: NCCL_GO_TIMEOUT after start (its default when it is off).
	deadline int64

	mu      sync.Mutex
	socks   []dialSock // [0] control, [1] liveness, [2:] data streams
	pfds    []unix.PollFd
	pidx    []int
	lastErr error
	done    bool
	claimed bool // poll handed the outcome out
	// lastPoll is when NCCL last called connect for it (clock.Now).
	lastPoll int64
	comm     *sendComm
	err      error
	drain    *drainer // the transport's, for the comm's close
}

func newConnectOp(id uint64, hi handleInfo, d *device, log nccl.Logger) *connectOp {
	op := &connectOp{id: id, log: log, info: hi, opts: readSockOpts(log, hi.streams), pol: retryPolicy(log), start: clock.Now()}
	op.lastPoll = op.start
	scope := 0
	a := hi.addr.Addr()
	if a.Is6() && (a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast()) {
		// A link-local address is only meaningful on our own device's link.
		scope = d.index
	}
	op.sa = sockaddrOf(hi.addr, scope)
	op.local = localAddr(hi, d)
	op.device = d.name
	op.addr = dialAddr(hi, d)
	op.deadline = op.start + int64(timeout.Bound(op.opts.timeout))
	h := hello{magic: hi.magic, version: protoVersion, streams: hi.streams, secret: hi.secret, connID: id}
	op.socks = make([]dialSock, 2+hi.streams)
	for i := range op.socks {
		s := &op.socks[i]
		s.fd = -1
		switch i {
		case 0:
			s.index = ctrlIndex
		case 1:
			s.index = beatIndex
		default:
			s.index = i - 2
		}
		h.index = s.index
		h.encode(s.hello[:])
	}
	op.pfds = make([]unix.PollFd, 0, len(op.socks))
	op.pidx = make([]int, 0, len(op.socks))
	return op
}

// poll advances the connect; it returns the comm once every stream is
// connected and greeted, or the error that ended it.
func (op *connectOp) poll() (*sendComm, error, bool) {
	op.mu.Lock()
	defer op.mu.Unlock()
	op.lastPoll = clock.Now()
	op.step()
	op.claimed = op.done
	return op.comm, op.err, op.done
}

func (op *connectOp) step() {
	if op.done {
		return
	}
	t := clock.Now()
	for i := range op.socks {
		if s := &op.socks[i]; s.state == dialWait && t >= s.retryAt {
			op.dial(i, t)
			if op.done {
				return
			}
		}
	}
	op.pfds, op.pidx = op.pfds[:0], op.pidx[:0]
	for i := range op.socks {
		if s := &op.socks[i]; s.state == dialConnecting {
			op.pfds = append(op.pfds, unix.PollFd{Fd: int32(s.fd), Events: unix.POLLOUT})
			op.pidx = append(op.pidx, i)
		}
	}
	if len(op.pfds) > 0 {
		if _, err := poll(op.pfds, 0); err != nil {
			op.finish(nccl.Errorf(nccl.SystemError, "connect to %s: poll: %w", op.addr, err))
			return
		}
		for k, p := range op.pfds {
			if p.Revents != 0 {
				op.connected(op.pidx[k], t)
				if op.done {
					return
				}
			}
		}
	}
	done := 0
	for i := range op.socks {
		s := &op.socks[i]
		if s.state == dialHello && s.sent == 0 && closedByListener(s.fd) {
			// The kernel finished this connect at an earlier call, but NCCL
			// did not call again before the listener's hello wait
			// (NCCL_GO_SOCKET_HELLO_TIMEOUT) ran out: a slow caller, not a
			// dead peer. Dial the stream again within the connect's own
			// bound; a hello written now would go into a closed connection
			// and the comm would fail at its first send.
			forkguard.Close(s.fd)
			s.fd = -1
			op.lastErr = errListenerClosed
			if s.attempt < op.pol.Count {
				// Counted and paced as a refused connect: a listener that
				// closes every stream at once (a stale handle, a reused
				// port) must not be dialled in a tight loop.
				s.attempt++
				s.retryAt, s.state = t+int64(op.pol.Sleep)*int64(s.attempt), dialWait
				continue
			}
			op.log.Warnf("NET/GoSocket : connect to %s failed after %d retries: %v", op.addr, s.attempt, errListenerClosed)
			op.finish(nccl.Errorf(nccl.SystemError, "connect to %s: %w", op.addr, errListenerClosed))
			return
		}
		if s.state == dialHello {
			n, err := sendSlice(s.fd, s.hello[s.sent:])
			if err != nil {
				op.log.Warnf("NET/GoSocket : handshake with %s failed: %v (the listener closed the connection: "+
					"it exited, or it rejected this connection's magic, version or secret)", op.addr, err)
				op.finish(nccl.Errorf(nccl.SystemError, "handshake with %s: %w", op.addr, err))
				return
			}
			if s.sent += n; s.sent == helloLen {
				s.state = dialDone
			}
		}
		if s.state == dialDone {
			done++
		}
	}
	if done == len(op.socks) {
		cs := conns{ctrl: op.socks[0].fd, beat: op.socks[1].fd, data: make([]int, op.info.streams)}
		for i := range cs.data {
			cs.data[i] = op.socks[2+i].fd
		}
		for i := range op.socks {
			op.socks[i].fd = -1 // the comm owns them now
		}
		sc, err := newSendComm(cs, op.info, op.opts, op.log, op.drain)
		if err != nil {
			op.log.Warnf("NET/GoSocket : setting up the connection to %s: %v", op.addr, err)
			op.finish(err)
			return
		}
		op.comm = sc
		op.done = true
		return
	}
	if t >= op.deadline {
		why := "no answer (SYNs unanswered: the host is down, or a firewall drops them)"
		if op.lastErr != nil {
			why = "last error: " + op.lastErr.Error()
		}
		bound := timeout.Bound(op.opts.timeout)
		op.log.Warnf("NET/GoSocket : connect to %s on device %s: %d of %d streams connected within %s=%v; %s; check that the peer "+
			"is alive and that %s selects an interface that can reach it", op.addr, op.deviceState(), done, len(op.socks),
			envTimeout, bound, why, envIfname)
		op.finish(nccl.Errorf(nccl.SystemError, "connect to %s: not connected within %s=%v (%s)", op.addr,
			envTimeout, bound, why))
	}
}

var errListenerClosed = errors.New("the listener closed the stream before its hello was sent (its hello wait ran out, or the handle is stale)")

// closedByListener reports whether the peer already closed (or reset) the
// connected stream fd: the listener speaks only after the hello, so anything
// readable before it is the end of the connection.
func closedByListener(fd int) bool {
	var b [1]byte
	n, _, err := unix.Recvfrom(fd, b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
	return (err == nil && n == 0) || errors.Is(err, unix.ECONNRESET) || errors.Is(err, unix.EPIPE)
}

// dial starts a connect attempt of stream i.
func (op *connectOp) dial(i int, t int64) {
	s := &op.socks[i]
	fd, err := newSocket(op.info.addr, op.opts)
	if err == nil {
		if s.index == beatIndex {
			err = setupLiveness(fd, op.opts.live)
		} else {
			err = setNoDelay(fd)
		}
		if err != nil {
			forkguard.Close(fd)
		}
	}
	if err != nil {
		op.log.Warnf("NET/GoSocket : cannot create a socket to connect to %s: %v%s", op.addr, err, fdHint(err))
		op.finish(nccl.Errorf(nccl.SystemError, "socket for %s: %w", op.addr, err))
		return
	}
	if op.local != nil {
		// Without a port: bind must not take one per stream from the
		// ephemeral range before connect picks the peer.
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
		if err := unix.Bind(fd, op.local); err != nil {
			// The address went away since Init: connect as NCCL does.
			op.log.Infof(nccl.SubsysNet, "NET/GoSocket : connect to %s: cannot bind device %s's address %v (%v); "+
				"letting the kernel choose", op.addr, op.device, addrPortOf(op.local).Addr(), err)
			op.local = nil
		}
	}
	s.fd, s.sent = fd, 0
	switch err := unix.Connect(fd, op.sa); err {
	case nil:
		s.state = dialHello
	case unix.EINPROGRESS:
		s.state = dialConnecting
	default:
		op.attemptFailed(i, err, t)
	}
}

// connected handles a finished connect of stream i.
func (op *connectOp) connected(i int, t int64) {
	s := &op.socks[i]
	e, err := unix.GetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err == nil && e != 0 {
		err = syscall.Errno(e)
	}
	if err != nil {
		op.attemptFailed(i, err, t)
		return
	}
	s.state = dialHello
}

func (op *connectOp) attemptFailed(i int, err error, t int64) {
	s := &op.socks[i]
	forkguard.Close(s.fd)
	s.fd = -1
	op.lastErr = err
	if retryable(err) && s.attempt < op.pol.Count {
		s.attempt++
		s.retryAt = t + int64(op.pol.Sleep)*int64(s.attempt)
		s.state = dialWait
		return
	}
	op.log.Warnf("NET/GoSocket : connect to %s on device %s failed after %d retries: %v; check that the peer is alive and "+
		"that %s selects an interface that can reach it (%s / %s tune the retries, %s bounds them)",
		op.addr, op.deviceState(), s.attempt, err, envIfname, envRetryCnt, envRetrySleep, envTimeout)
	op.finish(nccl.Errorf(nccl.SystemError, "connect to %s: %w", op.addr, err))
}

// deviceState names the device the connect was made on and, when its
// interface is no longer up and running (a rail whose link went down after
// Init), says so: on a host with one NIC per GPU that is the likely cause.
func (op *connectOp) deviceState() string {
	i, err := net.InterfaceByName(op.device)
	switch {
	case err != nil:
		return fmt.Sprintf("%s (the interface is gone: %v)", op.device, err)
	case i.Flags&net.FlagUp == 0:
		return op.device + " (the interface is down now)"
	case i.Flags&net.FlagRunning == 0:
		return op.device + " (the interface is up but not running now: no carrier)"
	}
	return op.device
}

// finish ends the connect with err, closing every socket it opened.
func (op *connectOp) finish(err error) {
	for i := range op.socks {
		if s := &op.socks[i]; s.fd >= 0 {
			forkguard.Close(s.fd)
			s.fd = -1
		}
	}
	op.err, op.done = err, true
}

// expire ends a connect past its deadline that NCCL has not called for a
// whole NCCL_GO_TIMEOUT (sweepPending), closing its sockets. A connect NCCL
// still polls ends by itself at its first call after the deadline, with the
// deadline's own error and WARN. forget reports that sweepPending may drop
// the op: ended, and not called for twice the bound.
func (op *connectOp) expire(now int64) (forget bool) {
	op.mu.Lock()
	defer op.mu.Unlock()
	bound := timeout.Bound(op.opts.timeout)
	idle := now - op.lastPoll
	if op.done || idle < int64(bound) {
		return op.done && idle >= 2*int64(bound)
	}
	op.log.Infof(nccl.SubsysNet, "NET/GoSocket : connect to %s: not called again within %s=%v (an aborted connection set-up); closing its sockets", op.addr, envTimeout, bound)
	op.finish(nccl.Errorf(nccl.SystemError, "connect to %s: abandoned: not called again within %s=%v", op.addr, envTimeout, bound))
	return false
}

// abort ends the connect for Finalize: sockets are closed, and a comm that
// was made but never handed to NCCL is closed too.
func (op *connectOp) abort() {
	op.mu.Lock()
	defer op.mu.Unlock()
	if !op.done {
		op.finish(nccl.Errorf(nccl.InternalError, "connect to %s abandoned: the transport was finalized", op.addr))
		return
	}
	if op.comm != nil && !op.claimed {
		op.comm.Close()
		op.comm = nil
		op.err = nccl.Errorf(nccl.InternalError, "connect to %s abandoned: the transport was finalized", op.addr)
	}
}

// retryable are the errors NCCL retries a connect on: the listener may not
// be up yet, or the network may be briefly unreachable.
func retryable(err error) bool {
	return errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.ETIMEDOUT) ||
		errors.Is(err, unix.EHOSTUNREACH) || errors.Is(err, unix.ENETUNREACH)
}

func fdHint(err error) string {
	if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
		return "; raise the open-files limit (ulimit -n)"
	}
	return ""
}
