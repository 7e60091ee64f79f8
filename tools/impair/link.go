package main

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"time"
)

// impairment is what one direction of the link does to frames, as netem
// would: lose a fraction, hold each frame for delay ± jitter.
type impairment struct {
	loss   float64       // probability in [0, 1]
	delay  time.Duration // one-way
	jitter time.Duration // uniform in [-jitter, +jitter], clamped at 0 delay
}

func (im impairment) String() string {
	return fmt.Sprintf("loss %.3g%% delay %v jitter %v", im.loss*100, im.delay, im.jitter)
}

// verdict is what the link decided for one frame.
type verdict int

const (
	pass verdict = iota
	dropLoss
	dropDown
	dropBlackhole
	dropQueueFull
	nVerdicts
)

var verdictNames = [nVerdicts]string{"forwarded", "lost", "down", "blackholed", "queue-full"}

// link is the shared state of both directions: the impairment of each, the
// down window (a cable pulled: both directions go silent), and the black-hole
// set (frames to these IP addresses vanish, as to a host that is gone).
// Decisions are taken with the caller's clock reading, so tests drive it
// without sleeping.
type link struct {
	mu        sync.Mutex
	dir       [2]impairment
	rng       *rand.Rand
	downUntil time.Time // zero: up; far future: down until "up"
	blackhole map[netip.Addr]bool
	// last release time per direction: jitter never reorders frames, as on
	// one physical path (netem reorders with jitter; TCP would see
	// reordering as loss and the figures would mix two impairments).
	lastRelease [2]time.Time
}

func newLink(seed uint64) *link {
	return &link{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), blackhole: map[netip.Addr]bool{}}
}

// forever marks a down window that lasts until an explicit "up".
var forever = time.Unix(1<<62, 0)

func (l *link) setImpairment(d int, im impairment) {
	l.mu.Lock()
	l.dir[d] = im
	l.mu.Unlock()
}

func (l *link) impairmentOf(d int) impairment {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dir[d]
}

// setDown starts a down window of length dur from now (dur <= 0: until up).
func (l *link) setDown(now time.Time, dur time.Duration) {
	l.mu.Lock()
	if dur <= 0 {
		l.downUntil = forever
	} else {
		l.downUntil = now.Add(dur)
	}
	l.mu.Unlock()
}

func (l *link) setUp() {
	l.mu.Lock()
	l.downUntil = time.Time{}
	l.mu.Unlock()
}

func (l *link) isDown(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return now.Before(l.downUntil)
}

func (l *link) setBlackhole(a netip.Addr, on bool) {
	l.mu.Lock()
	if on {
		l.blackhole[a.Unmap()] = true
	} else {
		delete(l.blackhole, a.Unmap())
	}
	l.mu.Unlock()
}

// admit decides the fate of a frame entering direction d at now, and when
// it leaves the link if it passes.
func (l *link) admit(d int, f *frameInfo, now time.Time) (verdict, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Before(l.downUntil) {
		return dropDown, time.Time{}
	}
	if f != nil && f.dst.IsValid() && len(l.blackhole) > 0 && l.blackhole[f.dst.Unmap()] {
		return dropBlackhole, time.Time{}
	}
	im := l.dir[d]
	if im.loss > 0 && l.rng.Float64() < im.loss {
		return dropLoss, time.Time{}
	}
	delay := im.delay
	if im.jitter > 0 {
		delay += time.Duration(l.rng.Int64N(int64(2*im.jitter)+1)) - im.jitter
		delay = max(delay, 0)
	}
	at := now.Add(delay)
	if at.Before(l.lastRelease[d]) {
		at = l.lastRelease[d]
	}
	l.lastRelease[d] = at
	return pass, at
}

// release is asked again when a delayed frame's time comes: a frame still on
// the wire when the cable is pulled is lost too.
func (l *link) release(now time.Time) verdict {
	if l.isDown(now) {
		return dropDown
	}
	return pass
}
