package plugin

import (
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/internal/clock"
)

// countYields makes schedYield count its calls until the test ends.
func countYields(t *testing.T) *atomic.Int64 {
	var yields atomic.Int64
	old := schedYield
	schedYield = func() { yields.Add(1); runtime.Gosched() }
	t.Cleanup(func() { schedYield = old })
	return &yields
}

// pollSched calls refreshSched for d, each call lasting at least cost, and
// returns the calls made, the time they took and the refresh periods in it.
func pollSched(d, cost time.Duration) (calls int, elapsed time.Duration, periods int64) {
	// Earlier tests leave every P's count at its cap; with slow calls the
	// first read on each P the goroutine visits would come 256 calls late.
	for i := range schedPaces {
		schedPaces[i].every.Store(0)
		schedPaces[i].calls.Store(0)
	}
	start := time.Now()
	for time.Since(start) < d {
		refreshSched()
		calls++
		if cost > 0 {
			for t0 := time.Now(); time.Since(t0) < cost; {
			}
		}
	}
	elapsed = time.Since(start)
	return calls, elapsed, int64(elapsed / (schedRefresh * time.Nanosecond))
}

// NCCL's thread polling test must pass through the scheduler about once per
// schedRefresh on its P, never not at all (sysmon would spin) and never
// once per call (each yield wakes a thread).
func TestRefreshSchedYieldsOncePerPeriod(t *testing.T) {
	yields := countYields(t)
	calls, elapsed, periods := pollSched(100*time.Millisecond, 0)
	got := yields.Load()
	// The loop may run on any of GOMAXPROCS Ps, each paced on its own.
	most := (periods + 1) * int64(runtime.GOMAXPROCS(0))
	t.Logf("%d calls in %v: %d yields (at most %d)", calls, elapsed, got, most)
	if got < 1 {
		t.Fatalf("no yield in %v of polling: sysmon keeps retaking the P", elapsed)
	}
	if got > most {
		t.Fatalf("%d yields in %v of polling, want at most %d (one per %v per P)", got, elapsed, most, schedRefresh*time.Nanosecond)
	}
}

func TestRefreshSchedDoesNotAllocate(t *testing.T) {
	if n := testing.AllocsPerRun(10000, refreshSched); n != 0 {
		t.Fatalf("%v allocations per call", n)
	}
	if n := testing.AllocsPerRun(10000, func() { refreshSchedPosted(0, nil) }); n != 0 {
		t.Fatalf("%v allocations per post", n)
	}
}

// Slow calls (a test after an isend whose post is a system call doing the
// NIC's work) must still pass through the scheduler about once per period:
// counting 256 calls between clock reads made the period last 256 calls.
func TestRefreshSchedKeepsThePeriodWhenCallsAreSlow(t *testing.T) {
	yields := countYields(t)
	calls, elapsed, periods := pollSched(300*time.Millisecond, 200*time.Microsecond)
	got := yields.Load()
	t.Logf("%d calls of 200 µs in %v: %d yields (%d periods)", calls, elapsed, got, periods)
	if got < periods/2 {
		t.Fatalf("%d yields in %v of slow calls, want at least %d (about one per %v)", got, elapsed, periods/2, schedRefresh*time.Nanosecond)
	}
}

func TestPaceEvery(t *testing.T) {
	for _, c := range []struct {
		every uint32
		gap   int64
		want  uint32
	}{
		{256, 256 * schedCheckGap, 1}, // calls of a millisecond: read every call
		{256, 4 * schedCheckGap, 64},  // in proportion
		{1, 100 * schedCheckGap, 1},   // never below one
		{64, schedCheckGap / 2, 64},   // near the aim: kept
		{64, schedCheckGap / 8, 128},  // fast: doubles
		{256, schedCheckGap / 8, 256}, // never above schedCheckEvery
		{200, schedCheckGap / 8, 256}, // capped
	} {
		if got := paceEvery(c.every, c.gap); got != c.want {
			t.Errorf("paceEvery(%d, %d) = %d, want %d", c.every, c.gap, got, c.want)
		}
	}
}

// A yield usually brings NCCL's thread back on another P, whose schedtick
// the yield renewed. Crediting the period to the P left behind made the
// thread yield again at the next clock read on the new P: twice the yields,
// each waking three threads (docs/performance.md, "Yields that wake fewer
// threads").
func TestRefreshSchedCreditsThePTheYieldEndsOn(t *testing.T) {
	var table paceTable
	yields := 0
	pid := 0
	yield := func() int { yields++; return 1 - pid } // always comes back on the other P
	start := time.Now()
	calls := 0
	for time.Since(start) < 100*time.Millisecond {
		table.refresh(pid, func() int { pid = yield(); return pid })
		calls++
	}
	elapsed := time.Since(start)
	periods := int64(elapsed / (schedRefresh * time.Nanosecond))
	t.Logf("%d calls in %v alternating between two Ps: %d yields (%d periods)", calls, elapsed, yields, periods)
	if yields < 1 {
		t.Fatalf("no yield in %v of polling", elapsed)
	}
	if int64(yields) > periods+1 {
		t.Fatalf("%d yields in %v when each yield lands on the other P, want at most %d (one per %v)", yields, elapsed, periods+1, schedRefresh*time.Nanosecond)
	}
}

// A post's time is the least predictable part of a message: under rxe an
// ibv_post_send is a system call doing the NIC's work, milliseconds under
// emulation. Counted tests alone let the clock go unread across a run of
// slow posts once fast tests had grown the count: in the Soft-RoCE lane the
// receiving rank went 15 ms between yields one period in ten, and sysmon
// took its P 25 times a second (docs/performance.md, "Posts read the
// clock"). Here each cycle is 4 ms of fast tests (the count grows to its
// cap), then 20 posts of 1 ms with one test after each.
func TestRefreshSchedReadsTheClockAfterEveryPost(t *testing.T) {
	var table paceTable
	var at []time.Time
	yield := func() int { at = append(at, time.Now()); return 0 }
	busy := func(d time.Duration) {
		for t0 := time.Now(); time.Since(t0) < d; {
		}
	}
	start := time.Now()
	for time.Since(start) < 300*time.Millisecond {
		for t0 := time.Now(); time.Since(t0) < 4*time.Millisecond; {
			table.refresh(0, yield)
		}
		for i := 0; i < 20; i++ {
			busy(time.Millisecond)
			table.refreshNow(0, yield)
			table.refresh(0, yield)
		}
	}
	if len(at) < 3 {
		t.Fatalf("%d yields in %v", len(at), time.Since(start))
	}
	gaps := make([]time.Duration, 0, len(at)-1)
	for i := 1; i < len(at); i++ {
		gaps = append(gaps, at[i].Sub(at[i-1]))
	}
	slices.Sort(gaps)
	median := gaps[len(gaps)/2]
	t.Logf("%d yields in %v; gaps between them: median %v, longest %v", len(at), time.Since(start), median, gaps[len(gaps)-1])
	// sysmon preempts a P whose schedtick is 10 ms old (forcePreemptNS).
	if median > 10*time.Millisecond {
		t.Fatalf("median gap between yields %v across slow posts, want under sysmon's 10 ms", median)
	}
}

// A post that ends 10 ms or more after the period began ends after sysmon
// has taken the P (forcePreemptNS): in the Soft-RoCE lane one 1 MiB
// ibv_post_send lasts 13 ms. A yield then only adds two thread switches;
// the next test's clock read decides instead.
func TestRefreshNowYieldsOnlyBeforeSysmonsDeadline(t *testing.T) {
	var table paceTable
	yields := 0
	yield := func() int { yields++; return 0 }
	p := &table[0]
	p.last.Store(clock.Now() - 12_000_000)
	table.refreshNow(0, yield)
	if yields != 0 {
		t.Fatalf("a post ending 12 ms into the period yielded")
	}
	p.last.Store(clock.Now() - 9_000_000)
	table.refreshNow(0, yield)
	if yields != 1 {
		t.Fatalf("a post ending 9 ms into the period: %d yields, want 1", yields)
	}
	table.refreshNow(0, yield)
	if yields != 1 {
		t.Fatalf("a post right after a yield yielded again")
	}
}
