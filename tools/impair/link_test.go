package main

import (
	"net/netip"
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

func TestLossRate(t *testing.T) {
	l := newLink(42)
	l.setImpairment(ab, impairment{loss: 0.01})
	const n = 200_000
	lost := 0
	for i := range n {
		v, _ := l.admit(ab, nil, t0.Add(time.Duration(i)))
		switch v {
		case dropLoss:
			lost++
		case pass:
		default:
			t.Fatalf("frame %d: verdict %s", i, verdictNames[v])
		}
	}
	// Binomial(200000, 0.01): mean 2000, sd 44.5; 6 sd either way.
	if lost < 1733 || lost > 2267 {
		t.Errorf("lost %d of %d at 1%%, want about 2000", lost, n)
	}
	// The other direction is untouched.
	for i := range 1000 {
		if v, _ := l.admit(ba, nil, t0.Add(time.Duration(i))); v != pass {
			t.Fatalf("b>a frame %d: %s with no impairment set", i, verdictNames[v])
		}
	}
}

func TestLossIsReproducibleFromTheSeed(t *testing.T) {
	run := func(seed uint64) []bool {
		l := newLink(seed)
		l.setImpairment(ab, impairment{loss: 0.3})
		out := make([]bool, 500)
		for i := range out {
			v, _ := l.admit(ab, nil, t0)
			out[i] = v == dropLoss
		}
		return out
	}
	a, b, c := run(7), run(7), run(8)
	same, diff := true, false
	for i := range a {
		same = same && a[i] == b[i]
		diff = diff || a[i] != c[i]
	}
	if !same || !diff {
		t.Errorf("same seed same drops: %v; other seed other drops: %v", same, diff)
	}
}

func TestDelayAndJitterKeepOrder(t *testing.T) {
	l := newLink(1)
	l.setImpairment(ab, impairment{delay: 10 * time.Millisecond})
	v, at := l.admit(ab, nil, t0)
	if v != pass || !at.Equal(t0.Add(10*time.Millisecond)) {
		t.Fatalf("fixed delay: %s at %v, want pass at +10ms", verdictNames[v], at.Sub(t0))
	}
	// Frames far apart: each gets its own delay in [5ms, 15ms].
	l = newLink(1)
	l.setImpairment(ab, impairment{delay: 10 * time.Millisecond, jitter: 5 * time.Millisecond})
	sawEarly, sawLate := false, false
	for i := range 1000 {
		now := t0.Add(time.Duration(i) * 20 * time.Millisecond)
		_, at := l.admit(ab, nil, now)
		d := at.Sub(now)
		if d < 5*time.Millisecond || d > 15*time.Millisecond {
			t.Fatalf("frame %d delayed %v, outside delay±jitter", i, d)
		}
		sawEarly = sawEarly || d < 7*time.Millisecond
		sawLate = sawLate || d > 13*time.Millisecond
	}
	if !sawEarly || !sawLate {
		t.Errorf("jitter did not spread delays over ±5ms (early %v, late %v)", sawEarly, sawLate)
	}
	// Frames close together: a frame may wait for the one before it, never
	// overtake it (one physical path does not reorder).
	var last time.Time
	for i := range 10_000 {
		now := t0.Add(time.Hour + time.Duration(i)*100*time.Microsecond)
		v, at := l.admit(ab, nil, now)
		if v != pass {
			t.Fatalf("frame %d dropped with no loss set", i)
		}
		if d := at.Sub(now); d < 5*time.Millisecond {
			t.Fatalf("frame %d delayed %v, less than delay-jitter", i, d)
		}
		if at.Before(last) {
			t.Fatalf("frame %d leaves at %v, before frame %d (%v)", i, at.Sub(t0), i-1, last.Sub(t0))
		}
		last = at
	}
}

func TestDownWindow(t *testing.T) {
	l := newLink(1)
	l.setImpairment(ab, impairment{delay: time.Second})
	_, inFlight := l.admit(ab, nil, t0) // on the wire when the cable goes
	l.setDown(t0.Add(500*time.Millisecond), 5*time.Second)
	for _, d := range []int{ab, ba} {
		if v, _ := l.admit(d, nil, t0.Add(time.Second)); v != dropDown {
			t.Errorf("%s during the window: %s, want down", dirNames[d], verdictNames[v])
		}
	}
	if v := l.release(inFlight); v != dropDown {
		t.Errorf("frame released inside the window: %s, want down", verdictNames[v])
	}
	if v, _ := l.admit(ab, nil, t0.Add(5500*time.Millisecond)); v != pass {
		t.Errorf("after the window: %s, want pass", verdictNames[v])
	}
	l.setDown(t0, 0)
	if v, _ := l.admit(ab, nil, t0.Add(time.Hour)); v != dropDown {
		t.Errorf("down with no length must last until up: %s", verdictNames[v])
	}
	l.setUp()
	if v, _ := l.admit(ab, nil, t0.Add(time.Hour)); v != pass {
		t.Errorf("after up: %s", verdictNames[v])
	}
}

func TestBlackhole(t *testing.T) {
	l := newLink(1)
	gone := netip.MustParseAddr("198.18.1.1")
	l.setBlackhole(gone, true)
	to := func(a string) *frameInfo { return &frameInfo{etherType: etherTypeV4, dst: netip.MustParseAddr(a)} }
	if v, _ := l.admit(ab, to("198.18.1.1"), t0); v != dropBlackhole {
		t.Errorf("to the black hole: %s", verdictNames[v])
	}
	if v, _ := l.admit(ab, to("::ffff:198.18.1.1"), t0); v != dropBlackhole {
		t.Errorf("to the black hole as a v4-mapped address: %s", verdictNames[v])
	}
	if v, _ := l.admit(ab, to("198.18.1.2"), t0); v != pass {
		t.Errorf("elsewhere: %s", verdictNames[v])
	}
	l.setBlackhole(gone, false)
	if v, _ := l.admit(ab, to("198.18.1.1"), t0); v != pass {
		t.Errorf("after del: %s", verdictNames[v])
	}
}
