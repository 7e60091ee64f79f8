package socket

import (
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/forkguard"
)

// Every socket of the transport is a raw non-blocking descriptor that this
// package creates, owns and closes itself. None goes through net.Conn: that
// would register it with Go's netpoller, whose epoll wake-ups run runtime
// threads beside NCCL's on every packet, and whose blocking calls park the
// caller. Set-up and the data path both run on the caller's (NCCL's) thread
// with the calls below, which never block.

// sockaddrOf converts an address for connect/bind; scope is the interface
// index of a link-local IPv6 address (0 otherwise).
func sockaddrOf(ap netip.AddrPort, scope int) unix.Sockaddr {
	a := ap.Addr()
	if a.Is4() || a.Is4In6() {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: a.Unmap().As4()}
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), ZoneId: uint32(scope), Addr: a.As16()}
}

// addrPortOf is the inverse, for logs.
func addrPortOf(sa unix.Sockaddr) netip.AddrPort {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port))
	}
	return netip.AddrPort{}
}

// newSocket makes a non-blocking TCP socket with the configured buffer sizes
// (which must be set before connect or listen: they decide the window scale).
func newSocket(ap netip.AddrPort, o sockOpts) (int, error) {
	fam := unix.AF_INET6
	if ap.Addr().Is4() || ap.Addr().Is4In6() {
		fam = unix.AF_INET
	}
	fd, err := unix.Socket(fam, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	// A child forked from the host process must not keep this connection
	// open after we close it or die. Best effort: its failure (ENOMEM in
	// pthread_atfork) only leaves the socket as it was before this existed.
	_ = forkguard.Track(fd)
	if o.sndBuf > 0 {
		err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, o.sndBuf)
	}
	if err == nil && o.rcvBuf > 0 {
		err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, o.rcvBuf)
	}
	if err != nil {
		forkguard.Close(fd)
		return -1, err
	}
	return fd, nil
}

func setNoDelay(fd int) error { return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1) }

// maxIov bounds the iovecs of one sendmsg: a header and payload per message,
// several messages per call when they queue up.
const maxIov = 32

// iovWriter gathers buffers into one sendmsg without allocating.
type iovWriter struct {
	iov [maxIov]unix.Iovec
	n   int
	msg unix.Msghdr
}

func (w *iovWriter) reset() { w.n = 0 }

func (w *iovWriter) add(p unsafe.Pointer, n int) {
	if n == 0 {
		return
	}
	w.iov[w.n].Base = (*byte)(p)
	w.iov[w.n].SetLen(n)
	w.n++
}

// flush writes the gathered buffers with MSG_DONTWAIT (never blocks) and
// MSG_NOSIGNAL (a closed peer is an EPIPE, not a SIGPIPE that would kill the
// host process). It returns the bytes written; EAGAIN is 0, nil.
//
// The data path's syscalls are raw (no entersyscall/exitsyscall): with
// MSG_DONTWAIT none of them can block, so handing the P to the scheduler
// around them would only add cost to every poll on NCCL's thread.
func (w *iovWriter) flush(fd int) (int, error) {
	if w.n == 0 {
		return 0, nil
	}
	w.msg.Iov = &w.iov[0]
	w.msg.SetIovlen(w.n)
	for {
		r, _, e := unix.RawSyscall(unix.SYS_SENDMSG, uintptr(fd), uintptr(unsafe.Pointer(&w.msg)), unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		if n, again, err := nonblocking(r, e); !again {
			return n, err
		}
	}
}

// nonblocking decodes a MSG_DONTWAIT send/recv syscall's result: EINTR asks
// for the call again, EAGAIN is 0 bytes and no error, any other errno is the
// error. It is small enough to inline: the data path keeps no extra call.
func nonblocking(r uintptr, e unix.Errno) (n int, again bool, err error) {
	switch e {
	case 0:
		return int(r), false, nil
	case unix.EINTR:
		return 0, true, nil
	case unix.EAGAIN:
		return 0, false, nil
	}
	return 0, false, e
}

// sendFrom writes up to n bytes from p without blocking; EAGAIN is 0, nil.
func sendFrom(fd int, p unsafe.Pointer, n int) (int, error) {
	for {
		r, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(p), uintptr(n), unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, 0, 0)
		if sent, again, err := nonblocking(r, e); !again {
			return sent, err
		}
	}
}

// recvInto reads up to n bytes into p without blocking. It returns
// (0, false, nil) when nothing is available and eof when the peer closed.
func recvInto(fd int, p unsafe.Pointer, n int) (got int, eof bool, err error) {
	for {
		r, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(p), uintptr(n), unix.MSG_DONTWAIT, 0, 0)
		var again bool
		if got, again, err = nonblocking(r, e); !again {
			// A read of n > 0 bytes that returns 0 without an error is the peer's FIN.
			return got, got == 0 && e == 0 && n > 0, err
		}
	}
}

func recvSlice(fd int, b []byte) (int, bool, error) {
	return recvInto(fd, unsafe.Pointer(unsafe.SliceData(b)), len(b))
}

func sendSlice(fd int, b []byte) (int, error) {
	return sendFrom(fd, unsafe.Pointer(unsafe.SliceData(b)), len(b))
}

// tcpInfo reads TCP_INFO into a caller-owned struct (x/sys's helper
// allocates one per call; the liveness check runs on the data path).
func tcpInfo(fd int, ti *unix.TCPInfo) error {
	l := uint32(unsafe.Sizeof(*ti))
	_, _, e := unix.RawSyscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.IPPROTO_TCP, unix.TCP_INFO,
		uintptr(unsafe.Pointer(ti)), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return e
	}
	return nil
}

// poll waits up to timeoutMs (0: not at all, -1: until an event) for the
// events in fds. A wait interrupted by a signal returns 0, nil, as a
// timeout would: callers loop on their own deadline or event.
func poll(fds []unix.PollFd, timeoutMs int) (int, error) {
	for {
		n, err := unix.Poll(fds, timeoutMs)
		if err == unix.EINTR {
			if timeoutMs == 0 {
				continue
			}
			return 0, nil
		}
		return n, err
	}
}

// eventSignal and eventDrain operate a helper's wake-up eventfd.
// (Raw syscalls on a caller-owned word: unix.Write's slice would escape to
// the heap on every wake-up.)
func eventSignal(fd int, v *uint64) {
	*v = 1
	unix.Syscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(v)), 8)
}

func eventDrain(fd int, v *uint64) {
	unix.Syscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(v)), 8)
}
