package socket

import (
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/forkguard"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// drainer keeps the control and data streams of closed send comms open until
// the receiver's kernel has acknowledged every byte they still held.
//
// A send completes once its bytes are in the sender's kernel, so NCCL may
// close the comm while bytes are still unsent: the receiver has not read them
// yet and keeps its window shut. A closed socket with unsent bytes is an
// orphan, and Linux drops an orphan once its zero-window probes have backed
// off to the two-minute maximum, even when the receiver's kernel answers
// every one (tcp_probe_timer; a receiver idle for 420 s was reset here): a
// receiver that is merely slow would lose the tail of a message its sender
// reported sent. An open socket's probes go on for as long as the receiver
// answers (RFC 1122 4.2.2.17). So close shuts a stream that still has unsent
// bytes for writing, which queues the FIN after them, and hands it here.
// Bytes already sent need nothing: the receiver's kernel acknowledges them
// whether or not it reads, and an orphan retransmits them if need be, so the
// usual close (the last header awaiting a delayed ACK) keeps nothing.
//
// A comm's kept streams form a group with its liveness stream, which is shut
// for writing too (the receiver sees the close as before) but stays open with
// its keepalive. Each kept stream closes once its bytes are acknowledged, and
// the liveness stream with the last of them; the whole group closes at once
// when the receiver closed (its end of the liveness stream, or a reset on any
// stream), or when the receiver's host has not answered the keepalive for
// NCCL_GO_TIMEOUT, the same verdict the comm itself would reach.
//
// A sweeper goroutine runs while any group is kept: it looks at them after
// 1 ms, then at doubling intervals up to a second, and exits when none is
// left (usually within a round trip of the close). Finalize stops it and
// closes what is left, and the kernel goes on sending that as it would have
// without this.
type drainer struct {
	mu      sync.Mutex
	groups  []*drainGroup
	running bool
	stop    chan struct{} // closed by closeAll to end the sweeper; each sweeper's own
	exited  chan struct{} // closed when the last sweeper started returns (an earlier one may still be leaving, touching nothing)
	// final: Finalize has run, and nothing may start a sweeper it would not
	// stop (a Close after Finalize is outside NCCL's contract); Init clears it.
	final bool
}

// drainGroup is what one closed send comm left.
type drainGroup struct {
	live    int
	deadAge int64 // Last_ack_recv age (ns) on live that means the host is gone; 0: never
	fds     []int // control and data streams with bytes unsent at close, until acknowledged
	info    unix.TCPInfo
	buf     [64]byte
}

// adopt takes over a closing send comm's streams: the liveness stream live
// (with its policy) and the control and data streams fds. Those with nothing
// unsent are closed at once, and live with them when none is left; the
// others are shut for writing, which queues the FIN after their bytes, and
// kept. A nil drainer closes everything.
func (d *drainer) adopt(live int, pol livePolicy, fds []int) {
	g := &drainGroup{live: live}
	if pol.timeout > 0 {
		// The keepalive probes an idle stream every keepIdle seconds (a
		// quarter timeout, at least 1 s): a live host's last ACK is never
		// older than that plus a round trip.
		g.deadAge = max(pol.timeout, 2*int64(pol.keepIdle)*int64(time.Second))
	}
	for _, fd := range fds {
		if d == nil || !unsent(fd) || unix.Shutdown(fd, unix.SHUT_WR) != nil {
			forkguard.Close(fd)
		} else {
			g.fds = append(g.fds, fd)
		}
	}
	if len(g.fds) == 0 || unix.Shutdown(live, unix.SHUT_WR) != nil {
		g.close()
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.final {
		g.close()
		return
	}
	d.groups = append(d.groups, g)
	if !d.running {
		d.running = true
		d.stop, d.exited = make(chan struct{}), make(chan struct{})
		go d.sweeper(d.stop, d.exited)
	}
}

func (d *drainer) sweeper(stop <-chan struct{}, exited chan<- struct{}) {
	defer close(exited)
	wait := time.Millisecond
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if !d.sweep(stop) {
			return
		}
		wait = min(2*wait, time.Second)
		t.Reset(wait)
	}
}

// sweep closes the groups that are done. It reports whether any is left;
// when none is, the sweeper that called it is no longer running. A sweeper
// that closeAll stopped while it waited for the lock (stop is no longer the
// current one) leaves everything to the sweeper started since, if any.
func (d *drainer) sweep(stop <-chan struct{}) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stop != stop || !d.running {
		return false
	}
	keep := d.groups[:0]
	for _, g := range d.groups {
		if g.done() {
			g.close()
		} else {
			keep = append(keep, g)
		}
	}
	clear(d.groups[len(keep):])
	d.groups = keep
	if len(keep) == 0 {
		d.running = false
		return false
	}
	return true
}

// done reports whether g has nothing left to wait for.
func (g *drainGroup) done() bool {
	keep := g.fds[:0]
	reset := false
	for _, fd := range g.fds {
		switch {
		case !drained(fd):
			keep = append(keep, fd)
		case outq(fd) > 0:
			reset = true // bytes left that will never go: the receiver reset it
			forkguard.Close(fd)
		default:
			forkguard.Close(fd)
		}
	}
	g.fds = keep
	if len(keep) == 0 || reset {
		return true
	}
	// The receiver's end of the liveness stream closed with its comm.
	if closed, err := readPings(g.live, &g.buf); closed || err != nil {
		return true
	}
	if g.deadAge > 0 {
		if err := tcpInfo(g.live, &g.info); err != nil {
			return true
		}
		if int64(g.info.Last_ack_recv)*int64(time.Millisecond) >= g.deadAge {
			return true
		}
	}
	return false
}

func (g *drainGroup) close() {
	for _, fd := range g.fds {
		forkguard.Close(fd)
	}
	g.fds = nil
	forkguard.Close(g.live)
}

// closeAll (Finalize) stops the sweeper and closes every kept stream,
// logging what was still unacknowledged: from here the kernel sends it as an
// orphan.
func (d *drainer) closeAll(log nccl.Logger) {
	d.mu.Lock()
	groups, exited := d.groups, d.exited
	d.groups = nil
	d.final = true
	if d.running {
		close(d.stop)
		d.running = false
	}
	d.mu.Unlock()
	if exited != nil {
		<-exited
	}
	var n, bytes int
	for _, g := range groups {
		for _, fd := range g.fds {
			// Less the FIN, queued behind the bytes since SHUT_WR.
			if q := outq(fd) - 1; q > 0 {
				n++
				bytes += q
			}
		}
		g.close()
	}
	if n > 0 {
		log.Infof(nccl.SubsysNet, "NET/GoSocket : finalize: %d stream(s) of closed connections still had %d byte(s) "+
			"their receivers had not acknowledged; the kernel goes on sending them", n, bytes)
	}
}

// reopen lets a transport initialised again after Finalize keep streams.
func (d *drainer) reopen() {
	d.mu.Lock()
	d.final = false
	d.mu.Unlock()
}

// kept reports how many control and data streams are kept (tests).
func (d *drainer) kept() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, g := range d.groups {
		n += len(g.fds)
	}
	return n
}

// drained reports whether fd has nothing left for its peer to acknowledge,
// or never will: the peer reset it, or the kernel gave up on it (both leave
// the state CLOSE). Not SO_ERROR, which also returns (and clears) the soft
// error an ICMP or ARP failure leaves during a link flap the stream survives.
func drained(fd int) bool {
	var info unix.TCPInfo
	if err := tcpInfo(fd, &info); err != nil || info.State == tcpClose {
		return true
	}
	return outq(fd) <= 0
}

// unsent reports whether fd holds bytes it has not sent yet (a shut window),
// the ones an orphan could lose.
func unsent(fd int) bool {
	var info unix.TCPInfo
	return tcpInfo(fd, &info) == nil && info.State != tcpClose && info.Notsent_bytes > 0
}

// tcpClose is TCP_CLOSE in tcp_info's state: a reset or timed-out stream.
const tcpClose = 7

// outq is what the kernel still holds for fd's peer to acknowledge (sent or
// not, the FIN included); -1 when it cannot say.
func outq(fd int) int {
	n, err := unix.IoctlGetInt(fd, unix.SIOCOUTQ)
	if err != nil {
		return -1
	}
	return n
}
