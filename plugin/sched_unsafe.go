package plugin

import (
	"runtime"
	"sync/atomic"
	_ "unsafe" // go:linkname

	"github.com/libnccl-net-go/libnccl-net-go/internal/clock"
)

// Keeping sysmon quiet while NCCL's threads poll (docs/performance.md,
// "sysmon").
//
// A call from C runs on the calling thread's own goroutine, which never
// passes through the scheduler, so the P it holds keeps one schedtick for as
// long as NCCL polls. Ten milliseconds on, sysmon's force-preemption check
// starts retaking that P whenever the thread is back in C, and, having
// retaken something, sysmon never lengthens its 20 µs nap: thousands of
// wake-ups a second per process, on the cores NCCL's threads spin on. A
// runtime.Gosched every few milliseconds gives the P a new schedtick, and
// sysmon backs off to its 10 ms nap. The pace is kept per P: that is what
// sysmon watches, the runtime has no cheap thread identity, and a proxy
// thread that polls many comms must still yield only once per period.

//go:linkname procPin runtime.procPin
func procPin() int

//go:linkname procUnpin runtime.procUnpin
func procUnpin()

const (
	// schedCheckEvery: the most calls on a P between two reads of the clock,
	// where calls are fast (an idle test: under a microsecond).
	schedCheckEvery = 256
	// schedCheckGap: how far apart the clock reads aim to be. Counting
	// calls alone misses the period when calls are slow: a test that
	// follows an isend whose ibv_post_send is a system call doing the NIC's
	// work (rxe: about a millisecond per 64 KiB in the Soft-RoCE lane) makes
	// 256 calls last far beyond sysmon's 10 ms, and sysmon starts
	// preempting NCCL's thread (SIGURG) and napping 20 µs again. So the
	// count adapts: it starts at 1, shrinks in proportion when reads come
	// further apart than this, and doubles when they come a quarter of it
	// apart.
	schedCheckGap = 1_000_000 // ns
	// schedRefresh: the longest a P polled by NCCL goes without passing
	// through the scheduler, kept under sysmon's 10 ms forcePreemptNS. 5 ms
	// gave the same tail with 1.5x the futex wake-ups (each Gosched wakes an
	// idle P's thread); docs/performance.md has the figures.
	schedRefresh = 8_000_000 // ns
)

// schedPace is one P's pace. Only the thread holding the P writes it; the
// fields are atomic because the P moves between threads without a
// synchronisation the race detector sees.
type schedPace struct {
	calls atomic.Uint32 // since the last clock read
	every atomic.Uint32 // calls between clock reads, 1..schedCheckEvery (0: 1)
	check atomic.Int64  // the last clock read
	last  atomic.Int64  // the last pass through the scheduler
	_     [40]byte      // a cache line per P: NCCL's threads run on different Ps
}

// schedPaces covers P ids below its length; a P beyond it (GOMAXPROCS above
// 256) is left to sysmon.
var schedPaces [256]schedPace

// refreshSched is called on every test. It costs three loads and a store,
// plus a clock read every p.every-th call on the P.
func refreshSched() {
	pid := procPin()
	procUnpin()
	if pid >= len(schedPaces) {
		return
	}
	p := &schedPaces[pid]
	every := max(p.every.Load(), 1)
	n := p.calls.Load() + 1
	if n < every {
		p.calls.Store(n)
		return
	}
	p.calls.Store(0)
	now := clock.Now()
	if prev := p.check.Load(); prev != 0 {
		p.every.Store(paceEvery(every, now-prev))
	}
	p.check.Store(now)
	if now-p.last.Load() < schedRefresh {
		return
	}
	p.last.Store(now)
	schedYield()
}

// paceEvery is the next count of calls between clock reads, given the count
// that just took gap nanoseconds.
func paceEvery(every uint32, gap int64) uint32 {
	switch {
	case gap > schedCheckGap:
		every = uint32(max(1, int64(every)*schedCheckGap/gap))
	case gap < schedCheckGap/4 && every < schedCheckEvery:
		every = min(2*every, schedCheckEvery)
	}
	return every
}

// schedYield is runtime.Gosched; tests count the yields through it.
var schedYield = runtime.Gosched
