package shm

import (
	"errors"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

const (
	beatPeriod     = 100 * time.Millisecond
	checkPeriod    = 20 * time.Millisecond // how often an idle comm looks at its peer
	defaultTimeout = 10 * time.Second      // heartbeat fallback only
)

var epoch = time.Now()

// now is monotonic nanoseconds; time.Since neither allocates nor locks.
func now() int64 { return int64(time.Since(epoch)) }

// pidNS identifies this process's PID namespace, so a peer knows whether our
// pid means the same process to it.
func pidNS() uint64 {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/pid", &st); err != nil {
		return 0
	}
	return st.Ino
}

// beats bumps the heartbeat of every mapped region this process is an end of,
// so that a peer in another PID namespace (no pidfd possible) can still tell a
// live process from a dead one. One goroutine per process, only while regions
// exist.
var beats struct {
	sync.Mutex
	regs    map[*region]int // region -> our side
	running bool
}

func startBeating(r *region, side int) {
	beats.Lock()
	defer beats.Unlock()
	if beats.regs == nil {
		beats.regs = make(map[*region]int)
	}
	beats.regs[r] = side
	r.h.u64(r.h.side(side, sideBeat)).Add(1)
	if !beats.running {
		beats.running = true
		go beatLoop()
	}
}

// stopBeating must run before r is unmapped: the beat loop writes into it
// under the same lock.
func stopBeating(r *region) {
	beats.Lock()
	delete(beats.regs, r)
	beats.Unlock()
}

func beatLoop() {
	t := time.NewTicker(beatPeriod)
	defer t.Stop()
	for range t.C {
		beats.Lock()
		if len(beats.regs) == 0 {
			beats.running = false
			beats.Unlock()
			return
		}
		for r, side := range beats.regs {
			r.h.u64(r.h.side(side, sideBeat)).Add(1)
		}
		beats.Unlock()
	}
}

// peerWatch tells whether the other end of a region is still there. Its checks
// cost a syscall, so idle callers run them at most every checkPeriod.
type peerWatch struct {
	r        *region
	peer     int // the peer's side
	pid      int
	pidfd    int // -1: use the heartbeat
	poll     [1]unix.PollFd
	timeout  int64
	lastBeat uint64
	beatAt   int64
	idle     uint32
	next     int64
}

func newPeerWatch(r *region, peer int, timeout time.Duration) peerWatch {
	w := peerWatch{r: r, peer: peer, pidfd: -1, timeout: int64(timeout)}
	w.pid = int(r.h.u64(r.h.side(peer, sidePid)).Load())
	if w.pid == os.Getpid() {
		w.timeout = 0 // both ends in this process: the peer lives as long as we do
	} else if ns := pidNS(); ns != 0 && ns == r.h.u64(r.h.side(peer, sidePidNS)).Load() {
		if fd, err := unix.PidfdOpen(w.pid, 0); err == nil {
			unix.CloseOnExec(fd)
			w.pidfd = fd
			w.poll[0] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
		}
	}
	w.lastBeat = r.h.u64(r.h.side(peer, sideBeat)).Load()
	w.beatAt = now()
	return w
}

func (w *peerWatch) close() {
	if w.pidfd >= 0 {
		_ = unix.Close(w.pidfd)
		w.pidfd = -1
	}
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
	if w.idle&63 != 0 {
		return nil
	}
	t := now()
	if t < w.next {
		return nil
	}
	w.next = t + int64(checkPeriod)
	return w.check(t)
}

// check looks at the peer now.
func (w *peerWatch) check(t int64) error {
	if w.pidfd >= 0 {
		w.poll[0].Revents = 0
		n, err := unix.Poll(w.poll[:], 0)
		if err == nil && n > 0 {
			return nccl.Errorf(nccl.SystemError, "NET/Shm : peer process %d exited", w.pid)
		}
		if err != nil && !errors.Is(err, unix.EINTR) {
			return nccl.Errorf(nccl.SystemError, "NET/Shm : cannot watch peer process %d: %v", w.pid, err)
		}
		return nil
	}
	if b := w.r.h.u64(w.r.h.side(w.peer, sideBeat)).Load(); b != w.lastBeat {
		w.lastBeat, w.beatAt = b, t
		return nil
	}
	if w.timeout > 0 && t-w.beatAt > w.timeout {
		return nccl.Errorf(nccl.SystemError, "NET/Shm : peer process %d (another PID namespace) has not shown a heartbeat for %v; it is gone or frozen (NCCL_GO_SHM_PEER_TIMEOUT sets this limit)",
			w.pid, time.Duration(t-w.beatAt).Round(time.Millisecond))
	}
	return nil
}
