package shm

import (
	"errors"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/internal/clock"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Liveness, not progress. Each end of a connection holds a POSIX write lock
// on one byte of its side of the header (sideLock) for as long as its
// process lives: the kernel drops the lock when the process exits or is
// killed, however it dies, and keeps it while the process is stopped
// (SIGSTOP, a debugger) or just slow. So a peer whose lock is gone is dead,
// and a peer that holds it is alive, however long it does not post or read:
// deciding that a frozen rank has hung is NCCL's or the framework's
// watchdog's business, as for every other transport of this plugin. The
// check is one fcntl(F_GETLK), it works across PID namespaces (locks are
// kernel objects, not pids), and POSIX locks are not inherited by fork, so a
// forked child (a dataloader worker) cannot keep a dead rank "alive".

// checkPeriod is how often an idle comm looks at its peer.
const checkPeriod = 20 * time.Millisecond

// lockSide takes our side's lock on the connection file. F_SETLK does not
// wait: the byte is free unless another process claims the same side.
func lockSide(fd, side int) error {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: int64(offSides + side*sideSize + sideLock), Len: 1}
	return unix.FcntlFlock(uintptr(fd), unix.F_SETLK, &lk)
}

// sideLocked reports whether another process holds side's lock.
func sideLocked(fd, side int) (bool, error) {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: int64(offSides + side*sideSize + sideLock), Len: 1}
	for {
		err := unix.FcntlFlock(uintptr(fd), unix.F_GETLK, &lk)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return lk.Type != unix.F_UNLCK, err
	}
}

// pidNS identifies this process's PID namespace: with the pid it tells
// whether the peer is this very process.
func pidNS() uint64 {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/pid", &st); err != nil {
		return 0
	}
	return st.Ino
}

// writeSide records this process on side of the header.
func writeSide(h hdr, side int) {
	h.u64(h.side(side, sidePid)).Store(uint64(os.Getpid()))
	h.u64(h.side(side, sidePidNS)).Store(pidNS())
}

// peerWatch tells whether the other end of a region is still there. Its
// checks cost a syscall, so idle callers run them at most every checkPeriod.
type peerWatch struct {
	r    *region
	peer int  // the peer's side
	pid  int  // the peer's pid in its own namespace, for messages
	self bool // both ends in this process: it lives as long as we do
	off  bool // NCCL_GO_TIMEOUT <= 0: dead-peer checks are off
	dead bool // check found the peer's lock gone without a close
	idle uint32
	next int64
}

func newPeerWatch(r *region, peer int, peerTimeout time.Duration) peerWatch {
	h := r.h
	w := peerWatch{r: r, peer: peer, off: peerTimeout <= 0}
	w.pid = int(h.u64(h.side(peer, sidePid)).Load())
	w.self = w.pid == os.Getpid() && h.u64(h.side(peer, sidePidNS)).Load() == pidNS()
	return w
}

// closed reports whether the peer closed its end.
func (w *peerWatch) closed() bool {
	return w.r.h.u32(w.r.h.side(w.peer, sideClose)).Load() != 0
}

// idleCheck is called when a data-path call found nothing to do. It returns an
// error once the peer process is gone. Cheap on most calls: a counter, and a
// clock read every 64th call.
func (w *peerWatch) idleCheck() error {
	w.idle++
	if w.idle&63 != 0 || w.off {
		return nil
	}
	t := clock.Now()
	if t < w.next {
		return nil
	}
	w.next = t + int64(checkPeriod)
	return w.check()
}

// check looks at the peer now. A peer that closed its end is not an error
// here: the data path first delivers what it left in the ring.
func (w *peerWatch) check() error {
	if w.self || w.off || w.closed() {
		return nil
	}
	locked, err := sideLocked(w.r.fd, w.peer)
	if err != nil {
		return nccl.Errorf(nccl.SystemError, "%s : cannot watch peer process %d through %s: %v", logPrefix, w.pid, w.r.path, err)
	}
	if !locked && !w.closed() {
		w.dead = true
		return nccl.Errorf(nccl.SystemError, "%s : peer process %d exited (its lock on %s is gone) without closing the connection", logPrefix, w.pid, w.r.path)
	}
	return nil
}
