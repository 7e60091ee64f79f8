package ib

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// lifecycle owns everything the transport runs or holds outside the comms
// NCCL was given: the goroutines of connection set-up (dials, accept loops,
// handshakes), the TCP connections they use, the open listeners, and the
// count of comms whose verbs objects still need the devices.
//
// Finalize (and a listener's Close) can come at any moment, from any thread:
// NCCL 2.28+ finalizes on every ncclCommAbort, often while connections are
// being made. So set-up never blocks except in network I/O on connections
// registered here, which Finalize closes; the goroutines then release what
// they built, and Finalize waits for them before it closes a device. Comms
// already handed to NCCL keep the devices open until the last one closes.
type lifecycle struct {
	mu        sync.Mutex
	closing   bool
	ctx       context.Context // cancelled by Finalize: dials and retry sleeps
	cancel    context.CancelFunc
	wg        sync.WaitGroup // every set-up goroutine
	conns     map[net.Conn]struct{}
	listeners map[*listener]struct{}
	comms     int  // comm cores alive (QPs and CQs exist)
	deferred  bool // Finalize left the devices to the last comm's Close
}

func (l *lifecycle) init() {
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.conns = map[net.Conn]struct{}{}
	l.listeners = map[*listener]struct{}{}
}

// pause is a set-up retry's sleep: it waits d and reports true, or returns
// false as soon as Finalize begins or abort (when not nil) is closed.
func (t *Transport) pause(d time.Duration, abort <-chan struct{}) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-t.life.ctx.Done():
	case <-abort:
	}
	return false
}

var errFinalized = nccl.Errorf(nccl.InternalError, "NET/GoIB : transport used after finalize")

// spawn runs f on a goroutine counted in the transport's wait group (and in
// also, when given, e.g. a listener's), unless Finalize has begun.
func (t *Transport) spawn(also *sync.WaitGroup, f func()) bool {
	t.life.mu.Lock()
	defer t.life.mu.Unlock()
	if t.life.closing {
		return false
	}
	t.life.wg.Add(1)
	if also != nil {
		also.Add(1)
	}
	go func() {
		defer t.life.wg.Done()
		if also != nil {
			defer also.Done()
		}
		f()
	}()
	return true
}

// track registers a set-up connection so that Finalize can close it; false
// means Finalize has begun and the caller must close it itself.
func (t *Transport) track(c net.Conn) bool {
	t.life.mu.Lock()
	defer t.life.mu.Unlock()
	if t.life.closing {
		return false
	}
	t.life.conns[c] = struct{}{}
	return true
}

func (t *Transport) untrack(c net.Conn) {
	t.life.mu.Lock()
	delete(t.life.conns, c)
	t.life.mu.Unlock()
}

// commBuilt and commGone count comm cores; the devices stay open while any
// exists.
func (t *Transport) commBuilt() {
	t.life.mu.Lock()
	t.life.comms++
	t.life.mu.Unlock()
}

func (t *Transport) commGone() {
	t.life.mu.Lock()
	t.life.comms--
	last := t.life.deferred && t.life.comms == 0
	if last {
		t.life.deferred = false
	}
	t.life.mu.Unlock()
	if last {
		t.log.Infof(nccl.SubsysNet, "NET/GoIB : last comm closed after finalize; closing the devices")
		t.closeHCAs()
	}
}

// Finalize stops and waits for every set-up goroutine (closing the
// connections they wait on), closes every listener and releases connections
// built but never collected by NCCL, then closes the devices. Comms NCCL
// still holds keep working; the devices close with the last of them. Every
// other call afterwards fails with InternalError.
func (t *Transport) Finalize() error {
	t.mu.Lock()
	if t.state != stateReady {
		t.state = stateFinalized
		t.mu.Unlock()
		return nil
	}
	t.state = stateFinalized
	t.mu.Unlock()

	t.life.mu.Lock()
	t.life.closing = true
	t.life.cancel()
	for c := range t.life.conns {
		_ = c.Close()
	}
	ls := make([]*listener, 0, len(t.life.listeners))
	for l := range t.life.listeners {
		ls = append(ls, l)
	}
	t.life.mu.Unlock()
	for _, l := range ls {
		_ = l.Close()
	}
	t.life.wg.Wait()

	t.pendMu.Lock()
	pending := t.pending
	t.pending = map[uint64]*connector{}
	t.pendMu.Unlock()
	for _, c := range pending {
		c.expiry.Stop()
		// Every dial has returned (wg), so done is closed.
		if c.comm != nil {
			_ = c.comm.Close()
		}
	}

	t.life.mu.Lock()
	open := t.life.comms
	t.life.deferred = open > 0
	t.life.mu.Unlock()
	if open > 0 {
		t.log.Infof(nccl.SubsysNet, "NET/GoIB : finalize with %d comm(s) still open: the devices close when the last one does", open)
		return nil
	}
	t.closeHCAs()
	return nil
}
