package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// memPort is a TAP device in memory: frames the "kernel" transmits wait in
// tx for the relay to read; frames the relay writes land in rx.
type memPort struct {
	tx     chan []byte
	rx     chan []byte
	closed chan struct{}
	once   sync.Once
}

func newMemPort() *memPort {
	return &memPort{tx: make(chan []byte, 1024), rx: make(chan []byte, 1024), closed: make(chan struct{})}
}

func (p *memPort) Read(b []byte) (int, error) {
	select {
	case f := <-p.tx:
		return copy(b, f), nil
	case <-p.closed:
		return 0, os.ErrClosed
	}
}

func (p *memPort) Write(b []byte) (int, error) {
	select {
	case <-p.closed:
		return 0, os.ErrClosed
	default:
	}
	p.rx <- bytes.Clone(b)
	return len(b), nil
}

func (p *memPort) Close() error {
	p.once.Do(func() { close(p.closed) })
	return nil
}

func (p *memPort) recv(t *testing.T) []byte {
	t.Helper()
	select {
	case f := <-p.rx:
		return f
	case <-time.After(10 * time.Second):
		t.Fatal("no frame arrived")
		return nil
	}
}

func tcpFrame(i int) []byte {
	f := cat(ether(etherTypeV4, 0), ipv4(protoTCP, "198.18.2.1", "198.18.2.2", tcpSeg(1000, 2000, tcpACK, 0, 64), 0))
	copy(f[len(f)-8:], fmt.Sprintf("%08d", i))
	return f
}

func startRelay(t *testing.T, l *link, limit int) (*relay, *memPort, *memPort) {
	t.Helper()
	a, b := newMemPort(), newMemPort()
	r := newRelay(l, a, b, 1500, limit)
	r.start()
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Errorf("relay stopped with %v", err)
		}
	})
	return r, a, b
}

func TestRelayForwardsBothWaysInOrder(t *testing.T) {
	r, a, b := startRelay(t, newLink(1), 64)
	for i := range 500 {
		a.tx <- tcpFrame(i)
		if got := b.recv(t); !bytes.Equal(got, tcpFrame(i)) {
			t.Fatalf("a>b frame %d changed on the way", i)
		}
	}
	arp := cat(ether(etherTypeARP, 0), make([]byte, 28))
	b.tx <- arp
	if got := a.recv(t); !bytes.Equal(got, arp) {
		t.Fatal("b>a ARP frame changed on the way")
	}
	// The writer counts a frame after its Write returns, so the receiver
	// may see the last frame before the counter moves: wait for the counts
	// to settle, then check every one of them exactly.
	s := &r.stats[ab]
	settled := func() bool {
		return s.frames[pass].Load() == 500 && s.tcp.Load() == 500 && s.bytes.Load() == uint64(500*len(tcpFrame(0))) &&
			r.stats[ba].frames[pass].Load() == 1
	}
	for deadline := time.Now().Add(10 * time.Second); !settled() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if s.frames[pass].Load() != 500 || s.tcp.Load() != 500 || s.bytes.Load() != uint64(500*len(tcpFrame(0))) {
		t.Errorf("a>b counters: %s", s)
	}
	if r.stats[ba].frames[pass].Load() != 1 || r.stats[ba].tcp.Load() != 0 {
		t.Errorf("b>a counters: %s", &r.stats[ba])
	}
}

func TestRelayDropsWhatTheLinkDecides(t *testing.T) {
	l := newLink(1)
	r, a, b := startRelay(t, l, 64)
	l.setImpairment(ab, impairment{loss: 1})
	for i := range 100 {
		a.tx <- tcpFrame(i)
	}
	waitFor(t, func() bool { return r.stats[ab].frames[dropLoss].Load() == 100 })
	l.setDown(time.Now(), 0)
	b.tx <- tcpFrame(0)
	waitFor(t, func() bool { return r.stats[ba].frames[dropDown].Load() == 1 })
	l.setUp()
	b.tx <- tcpFrame(1)
	if got := a.recv(t); !bytes.Equal(got, tcpFrame(1)) {
		t.Fatal("b>a: the frame sent while down arrived, or the one after it did not")
	}
	select {
	case f := <-b.rx:
		t.Fatalf("a frame crossed a link with 100%% loss: %x", f[:20])
	default:
	}
	if n := r.stats[ba].frames[dropDown].Load(); n != 1 {
		t.Errorf("b>a dropped while down: %d, want 1", n)
	}
	if !strings.Contains(r.statsLine(), "lost 100 (100.00%)") {
		t.Errorf("stats line: %s", r.statsLine())
	}
}

func TestRelayDelays(t *testing.T) {
	l := newLink(1)
	a, b := newMemPort(), newMemPort()
	r := newRelay(l, a, b, 1500, 64)
	// A clock the test controls: the writer "sleeps" by advancing it.
	var mu sync.Mutex
	now := t0
	var slept []time.Duration
	r.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	r.sleep = func(d time.Duration) { mu.Lock(); defer mu.Unlock(); slept = append(slept, d); now = now.Add(d) }
	l.setImpairment(ab, impairment{delay: 10 * time.Millisecond})
	r.start()
	defer r.stop()
	a.tx <- tcpFrame(0)
	b.recv(t)
	mu.Lock()
	defer mu.Unlock()
	if len(slept) != 1 || slept[0] != 10*time.Millisecond {
		t.Errorf("the writer waited %v, want one wait of 10ms", slept)
	}
}

func TestRelayTailDropsWhenTheLineIsFull(t *testing.T) {
	l := newLink(1)
	a, b := newMemPort(), newMemPort()
	r := newRelay(l, a, b, 1500, 4)
	block := make(chan struct{})
	r.sleep = func(time.Duration) { <-block } // the first frame never leaves...
	l.setImpairment(ab, impairment{delay: time.Hour})
	r.start()
	for i := range 20 {
		a.tx <- tcpFrame(i)
	}
	// ...so 4 buffers are in use and the rest are dropped at the tail.
	waitFor(t, func() bool { return r.stats[ab].frames[dropQueueFull].Load() == 16 })
	close(block)
	r.stop()
	_ = b
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}
