package clock

import (
	"testing"
	"time"
)

func TestNowIsMonotonicAndNeverZero(t *testing.T) {
	prev := Now()
	if prev <= 0 {
		t.Fatalf("Now() = %d, want > 0", prev)
	}
	for i := 0; i < 10000; i++ {
		n := Now()
		if n < prev {
			t.Fatalf("clock went back: %d after %d", n, prev)
		}
		prev = n
	}
	start := Now()
	wall := time.Now()
	for time.Since(wall) < time.Millisecond {
	}
	if d := Since(start); d < time.Millisecond {
		t.Fatalf("Since = %v after at least 1ms of wall time", d)
	}
}

func TestNowDoesNotAllocate(t *testing.T) {
	if n := testing.AllocsPerRun(1000, func() { _ = Now(); _ = Since(1) }); n != 0 {
		t.Fatalf("%v allocations per call", n)
	}
}

func BenchmarkNow(b *testing.B) {
	b.ReportAllocs()
	var s int64
	for i := 0; i < b.N; i++ {
		s += Now()
	}
	_ = s
}
