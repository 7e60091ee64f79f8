package plugin

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// countYields makes schedYield count its calls until the test ends.
func countYields(t *testing.T) *atomic.Int64 {
	var yields atomic.Int64
	old := schedYield
	schedYield = func() { yields.Add(1); runtime.Gosched() }
	t.Cleanup(func() { schedYield = old })
	return &yields
}

// fakeClock is a paceTable's clock that the test moves on itself, so that
// the pace's periods are exact and a loaded machine descheduling the test
// changes nothing. Tests advance it before each call, as the call's own
// duration, so a read never returns 0 ("not set").
type fakeClock struct{ ns int64 }

func (c *fakeClock) now() int64 { return c.ns }

func (c *fakeClock) advance(d time.Duration) { c.ns += int64(d) }

// yieldClock is a paceTable on a fakeClock that records when each yield came.
type yieldClock struct {
	fakeClock
	table paceTable
	at    []int64
}

func newYieldClock() *yieldClock {
	c := &yieldClock{}
	c.table = paceTable{now: c.now}
	return c
}

func (c *yieldClock) yield() int { c.at = append(c.at, c.ns); return 0 }

// pollSched calls refreshSched for d and returns the calls made, the time
// they took and the refresh periods in it.
func pollSched(d time.Duration) (calls int, elapsed time.Duration, periods int64) {
	// Earlier tests leave every P's count at its cap; with slow calls the
	// first read on each P the goroutine visits would come 256 calls late.
	for i := range schedPaces.paces {
		schedPaces.paces[i].every.Store(0)
		schedPaces.paces[i].calls.Store(0)
	}
	start := time.Now()
	for time.Since(start) < d {
		refreshSched()
		calls++
	}
	elapsed = time.Since(start)
	return calls, elapsed, int64(elapsed / (schedRefresh * time.Nanosecond))
}

// NCCL's thread polling test must pass through the scheduler about once per
// schedRefresh on its P, never not at all (sysmon would spin) and never
// once per call (each yield wakes a thread).
func TestRefreshSchedYieldsOncePerPeriod(t *testing.T) {
	yields := countYields(t)
	calls, elapsed, periods := pollSched(100 * time.Millisecond)
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
// On a clock the test advances: on the wall clock, a loaded machine that
// kept the test off the CPU for a period or more at a time failed it (15
// yields in 300 ms, want 18).
func TestRefreshSchedKeepsThePeriodWhenCallsAreSlow(t *testing.T) {
	const (
		call = 200 * time.Microsecond
		d    = 300 * time.Millisecond
	)
	c := newYieldClock()
	for c.ns < int64(d) {
		c.advance(call)
		c.table.refresh(0, c.yield)
	}
	// The count shrinks until the clock is read at most about
	// schedCheckGap apart: a yield comes at most that late.
	checkYieldGaps(t, c.at, c.ns, schedRefresh, schedRefresh+schedCheckGap)
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
// threads"). Here every yield lands on the other P.
func TestRefreshSchedCreditsThePTheYieldEndsOn(t *testing.T) {
	const (
		test = 500 * time.Nanosecond // an idle test
		d    = 100 * time.Millisecond
	)
	var c fakeClock
	table := paceTable{now: c.now}
	pid := 0
	var at []int64 // when each yield came
	yield := func() int { at = append(at, c.ns); pid = 1 - pid; return pid }
	calls := 0
	for c.ns < int64(d) {
		c.advance(test)
		table.refresh(pid, yield)
		calls++
	}
	periods := int64(d) / schedRefresh
	t.Logf("%d calls in %v alternating between two Ps: %d yields (%d periods)", calls, d, len(at), periods)
	if len(at) < 1 {
		t.Fatalf("no yield in %v of polling", d)
	}
	if int64(len(at)) > periods+1 {
		t.Fatalf("%d yields in %v when each yield lands on the other P, want at most %d (one per %v)", len(at), d, periods+1, schedRefresh*time.Nanosecond)
	}
	// Each yield starts the period of the P it lands on, and that P reads
	// the clock at least every schedCheckEvery calls: a period lasts
	// schedRefresh, and ends at most that many calls late.
	late := int64(schedCheckEvery * test)
	checkYieldGaps(t, at, c.ns, schedRefresh, schedRefresh+late)
}

// checkYieldGaps fails t unless every period between yields, the first
// starting at 0 and the last one still running at end, lasts from least to
// most (the one still running only at most).
func checkYieldGaps(t *testing.T, at []int64, end, least, most int64) {
	t.Helper()
	prev := int64(0)
	longest := int64(0)
	for i, y := range at {
		gap := y - prev
		longest = max(longest, gap)
		if gap < least || gap > most {
			t.Errorf("yield %d at %v, %v after the period began, want %v to %v", i, time.Duration(y), time.Duration(gap), time.Duration(least), time.Duration(most))
		}
		prev = y
	}
	if gap := end - prev; gap > most {
		t.Errorf("no yield in the last %v, want one at most %v into the period", time.Duration(gap), time.Duration(most))
	}
	t.Logf("%d yields; the longest period %v", len(at), time.Duration(longest))
}

// A post's time is the least predictable part of a message: under rxe an
// ibv_post_send is a system call doing the NIC's work, milliseconds under
// emulation. Counted tests alone let the clock go unread across a run of
// slow posts once fast tests had grown the count: in the Soft-RoCE lane the
// receiving rank went 15 ms between yields one period in ten, and sysmon
// took its P 25 times a second (docs/performance.md, "Posts read the
// clock"). Here, on a clock the test advances, each cycle is 4 ms of tests
// of 500 ns (the count grows to its cap), then 20 posts of 1 ms with one
// test after each.
func TestRefreshSchedReadsTheClockAfterEveryPost(t *testing.T) {
	const (
		test = 500 * time.Nanosecond // an idle test
		post = time.Millisecond      // a post doing the NIC's work
		d    = 300 * time.Millisecond
	)
	c := newYieldClock()
	for c.ns < int64(d) {
		for end := c.ns + int64(4*time.Millisecond); c.ns < end; {
			c.advance(test)
			c.table.refresh(0, c.yield)
		}
		for range 20 {
			c.advance(post)
			c.table.refreshNow(0, c.yield)
			c.advance(test)
			c.table.refresh(0, c.yield)
		}
	}
	if len(c.at) < 3 {
		t.Fatalf("%d yields in %v", len(c.at), time.Duration(c.ns))
	}
	// A yield never comes before the period is over, and comes by the
	// first clock read after it: one post late at most, since a post reads
	// the clock and the fast tests between posts read it far more often.
	// That keeps every period under sysmon's 10 ms forcePreemptNS, so a
	// post never ends past it.
	if schedRefresh+int64(post) >= schedPreempt {
		t.Fatalf("schedRefresh %v plus a post of %v reaches sysmon's %v", schedRefresh*time.Nanosecond, post, schedPreempt*time.Nanosecond)
	}
	checkYieldGaps(t, c.at, c.ns, schedRefresh, schedRefresh+int64(post))
}

// A post that ends 10 ms or more after the period began ends after sysmon
// has taken the P (forcePreemptNS): in the Soft-RoCE lane one 1 MiB
// ibv_post_send lasts 13 ms. A yield then only adds two thread switches;
// the next test's clock read decides instead.
func TestRefreshNowYieldsOnlyBeforeSysmonsDeadline(t *testing.T) {
	var c fakeClock
	c.advance(time.Second)
	table := paceTable{now: c.now}
	yields := 0
	yield := func() int { yields++; return 0 }
	p := &table.paces[0]
	for _, tc := range []struct {
		into int64 // how far into the period the post ends
		want int   // yields
	}{
		{12_000_000, 0},       // after sysmon took the P
		{schedPreempt, 0},     // at sysmon's deadline
		{schedPreempt - 1, 1}, // just before it
		{9_000_000, 1},        // the period over, sysmon not yet due
		{schedRefresh, 1},     // the period just over
		{schedRefresh - 1, 0}, // the period not over
		{1_000_000, 0},        // early in the period
	} {
		yields = 0
		start := c.ns - tc.into
		p.last.Store(start)
		p.check.Store(start + 1)
		p.calls.Store(7)
		table.refreshNow(0, yield)
		if yields != tc.want {
			t.Errorf("a post ending %v into the period: %d yields, want %d", time.Duration(tc.into), yields, tc.want)
		}
		if yields == 0 {
			// The count and its read are the tests'; the post is part of
			// the time between two reads.
			if p.last.Load() != start || p.check.Load() != start+1 || p.calls.Load() != 7 {
				t.Errorf("a post ending %v into the period without a yield changed the pace: last %d check %d calls %d, want %d %d 7", time.Duration(tc.into), p.last.Load(), p.check.Load(), p.calls.Load(), start, start+1)
			}
		} else if p.last.Load() != c.ns || p.check.Load() != c.ns || p.calls.Load() != 0 {
			t.Errorf("a post ending %v into the period yielded without starting a period: last %d check %d calls %d, want %d %d 0", time.Duration(tc.into), p.last.Load(), p.check.Load(), p.calls.Load(), c.ns, c.ns)
		}
	}
	yields = 0
	p.last.Store(c.ns - 9_000_000)
	table.refreshNow(0, yield)
	c.advance(time.Millisecond)
	table.refreshNow(0, yield)
	if yields != 1 {
		t.Fatalf("a post 9 ms into the period, then one 1 ms after its yield: %d yields, want 1", yields)
	}
}
