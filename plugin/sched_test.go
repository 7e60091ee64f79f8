package plugin

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// NCCL's thread polling test must pass through the scheduler about once per
// schedRefresh on its P, never not at all (sysmon would spin) and never
// once per call (each yield wakes a thread).
func TestRefreshSchedYieldsOncePerPeriod(t *testing.T) {
	var yields atomic.Int64
	old := schedYield
	schedYield = func() { yields.Add(1); runtime.Gosched() }
	t.Cleanup(func() { schedYield = old })

	const poll = 100 * time.Millisecond
	calls := 0
	start := time.Now()
	for time.Since(start) < poll {
		refreshSched()
		calls++
	}
	elapsed := time.Since(start)
	got := yields.Load()
	periods := int64(elapsed / (schedRefresh * time.Nanosecond))
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
}
