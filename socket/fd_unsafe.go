package socket

import (
	"net"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The control stream is driven from NCCL's thread with raw non-blocking
// syscalls: going through net.Conn would park on the netpoller when the
// socket is not ready, and parking is exactly the blocking (and the
// goroutine hand-off) the latency path cannot afford. The fd stays owned by
// the net.TCPConn, which closes it; nothing else reads or writes it.

// rawFD returns the descriptor behind c (already non-blocking: Go's net
// package sets O_NONBLOCK).
func rawFD(c *net.TCPConn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	if err := rc.Control(func(f uintptr) { fd = int(f) }); err != nil {
		return -1, err
	}
	return fd, nil
}

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
func (w *iovWriter) flush(fd int) (int, error) {
	if w.n == 0 {
		return 0, nil
	}
	w.msg.Iov = &w.iov[0]
	w.msg.SetIovlen(w.n)
	for {
		r, _, e := unix.Syscall(unix.SYS_SENDMSG, uintptr(fd), uintptr(unsafe.Pointer(&w.msg)), unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		switch e {
		case 0:
			return int(r), nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return 0, nil
		}
		return 0, e
	}
}

// recvInto reads up to n bytes into p without blocking. It returns
// (0, false, nil) when nothing is available and eof when the peer closed.
func recvInto(fd int, p unsafe.Pointer, n int) (got int, eof bool, err error) {
	for {
		r, _, e := unix.Syscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(p), uintptr(n), unix.MSG_DONTWAIT, 0, 0)
		switch e {
		case 0:
			if r == 0 && n > 0 {
				return 0, true, nil
			}
			return int(r), false, nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return 0, false, nil
		}
		return 0, false, e
	}
}
