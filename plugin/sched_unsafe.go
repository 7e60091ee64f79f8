package plugin

import (
	"sync/atomic"
	_ "unsafe" // go:linkname

	"github.com/libnccl-net-go/libnccl-net-go/internal/clock"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
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
// yield every few milliseconds gives the P a new schedtick, and sysmon backs
// off to its 10 ms nap. The pace is kept per P: that is what sysmon watches,
// the runtime has no cheap thread identity, and a proxy thread that polls
// many comms must still yield only once per period.
//
// The yield is runtime.goyield, not runtime.Gosched. The goroutine is locked
// to NCCL's thread, so either way the thread hands its P to another thread,
// which finds the goroutine and hands the P back. Gosched puts the goroutine
// on the global run queue and also wakes a spinning thread with an idle P to
// look for it: three wake-ups per yield, and the thread usually comes back
// with the other P. goyield queues it on the P itself, whose new thread runs
// it first: two wake-ups, and the same P. goyield is one of the runtime's
// linknamed symbols that it promises to keep (go.dev/issue/67401), as is
// procPin.

//go:linkname procPin runtime.procPin
func procPin() int

//go:linkname procUnpin runtime.procUnpin
func procUnpin()

//go:linkname goyield runtime.goyield
func goyield()

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
	// gave the same tail with 1.5x the futex wake-ups (each yield wakes
	// threads); docs/performance.md has the figures.
	schedRefresh = 8_000_000 // ns
	// schedPreempt is sysmon's forcePreemptNS.
	schedPreempt = 10_000_000 // ns
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

// paceTable holds one pace per P id; a P beyond it (GOMAXPROCS above 256) is
// left to sysmon.
type paceTable struct {
	paces [256]schedPace
	// now is the clock the table reads: clock.Now's nanoseconds, never 0
	// (0 means "not set"). nil, as in schedPaces, is clock.Now itself.
	// Tests set it to drive time themselves: asserting on the wall clock
	// made them flake whenever a loaded machine descheduled them. It is set
	// before the table is used and never after. Only the clock reads look
	// at it, not the counted calls between them, and they test it in line:
	// a method choosing between it and clock.Now is beyond the inliner's
	// budget and would add a call to every read. It comes after the paces,
	// so only the last P's writes can share its cache line.
	now func() int64
}

var schedPaces paceTable

// refreshSched is called on every test. It costs three loads and a store,
// plus a clock read every p.every-th call on the P.
func refreshSched() {
	schedPaces.refresh(currentP(), yieldP)
}

// refreshSchedPosted is called after every isend, irecv and iflush with
// what the transport answered. A post is the call whose time is least
// predictable (under rxe, ibv_post_send is a system call doing the NIC's
// work: 0.2 to 3 ms for one clear-to-send or 64 KiB write under emulation),
// and counted tests do not see it: in the Soft-RoCE lane a receiver whose
// tests had grown the count went 15 ms or more between yields one period in
// ten, and sysmon took its P 25 times a second (docs/performance.md, "Posts
// read the clock"). So a post reads the clock, one read per message. A
// refusal (NCCL retries at once) or a failure posted nothing and counts as
// a test: the lane's 1 MiB sender, retrying isend until a clear-to-send
// came, yielded from those retries and lost about a seventh of its stream.
func refreshSchedPosted(id nccl.Request, err error) {
	if err != nil || id < 0 {
		schedPaces.refresh(currentP(), yieldP)
		return
	}
	schedPaces.refreshNow(currentP(), yieldP)
}

// currentP is the id of the P the calling goroutine holds.
func currentP() int {
	pid := procPin()
	procUnpin()
	return pid
}

// yieldP passes through the scheduler and returns the P the goroutine holds
// afterwards.
func yieldP() int {
	schedYield()
	return currentP()
}

// refresh is refreshSched on P pid; yield passes through the scheduler and
// returns the P the thread comes back with.
func (t *paceTable) refresh(pid int, yield func() int) {
	if pid >= len(t.paces) {
		return
	}
	p := &t.paces[pid]
	every := max(p.every.Load(), 1)
	n := p.calls.Load() + 1
	if n < every {
		p.calls.Store(n)
		return
	}
	p.calls.Store(0)
	var now int64
	if t.now == nil {
		now = clock.Now()
	} else {
		now = t.now()
	}
	if prev := p.check.Load(); prev != 0 {
		p.every.Store(paceEvery(every, now-prev))
	}
	p.check.Store(now)
	t.due(p, now, yield)
}

// refreshNow is refresh with a clock read whatever the count: for a call
// that may have lasted long. It leaves the count and its last read alone:
// the count adapts to how long tests take between two of its reads, and a
// post between them is part of that time. A post that ends schedPreempt or
// more into the period ended after sysmon took the P; yielding then only
// costs the two thread switches, so the next test's read decides.
func (t *paceTable) refreshNow(pid int, yield func() int) {
	if pid >= len(t.paces) {
		return
	}
	p := &t.paces[pid]
	var now int64
	if t.now == nil {
		now = clock.Now()
	} else {
		now = t.now()
	}
	if now-p.last.Load() >= schedPreempt {
		return
	}
	t.due(p, now, yield)
}

// due yields if pace p's period is over at now.
func (t *paceTable) due(p *schedPace, now int64, yield func() int) {
	if now-p.last.Load() < schedRefresh {
		return
	}
	// The thread comes back with whichever P ran its goroutine: with
	// goyield the one it left, but not when another thread stole the
	// goroutine meanwhile (and with Gosched usually not). Running the
	// goroutine gave that P the new schedtick, so its period starts now.
	// Starting the period on the P left behind had the thread find the new
	// P's period long over at its next clock read and yield again: with
	// Gosched, two yields per period.
	q := yield()
	if q >= len(t.paces) {
		return
	}
	r := &t.paces[q]
	r.last.Store(now)
	r.check.Store(now)
	r.calls.Store(0)
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

// schedYield is runtime.goyield; tests count the yields through it.
var schedYield = goyield
