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
	// schedCheckEvery: calls on a P between two reads of the clock.
	schedCheckEvery = 256
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
	calls atomic.Uint32
	last  atomic.Int64
	_     [48]byte // a cache line per P: NCCL's threads run on different Ps
}

// schedPaces covers P ids below its length; a P beyond it (GOMAXPROCS above
// 256) is left to sysmon.
var schedPaces [256]schedPace

// refreshSched is called on every test. It costs two loads and a store,
// plus a clock read every schedCheckEvery-th call on the P.
func refreshSched() {
	pid := procPin()
	procUnpin()
	if pid >= len(schedPaces) {
		return
	}
	p := &schedPaces[pid]
	n := p.calls.Load() + 1
	p.calls.Store(n)
	if n%schedCheckEvery != 0 {
		return
	}
	now := clock.Now()
	if now-p.last.Load() < schedRefresh {
		return
	}
	p.last.Store(now)
	schedYield()
}

// schedYield is runtime.Gosched; tests count the yields through it.
var schedYield = runtime.Gosched
