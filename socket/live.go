package socket

import (
	"time"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Liveness, not progress, decides that a peer is dead (docs/socket.md,
// "Liveness"). Progress cannot: a receiver that is busy elsewhere (writing a
// checkpoint) closes its window, and a sender with nothing to send is silent,
// however long. What only a live peer does is answer at the TCP level: its
// kernel ACKs whatever reaches it, whether or not its application reads, and
// even when the process is stopped (SIGSTOP), which therefore counts as alive
// (NCCL's and the framework's watchdogs own that decision).
//
// Each connection has one extra TCP stream that carries no data. Both ends
// enable keepalive on it (probes every NCCL_GO_TIMEOUT/4, at least 1 s), so
// the peer's kernel is asked regularly without any thread of ours. NCCL's
// thread reads TCP_INFO from time to time (at most every maxCheckPeriod, only
// while a request is pending): the age of the last ACK is how long the peer
// host has been silent. When it comes within a check period and a grace of
// the timeout (half the timeout for timeouts under about 0.6 s; this happens
// only below the keepalive's 1 s granularity, or when the host is gone) the
// check writes one byte, which the peer's kernel must ACK within a round trip
// plus its delayed-ACK time; the peer drains these bytes in its own checks. A
// peer is dead when the last ACK is older than the timeout (less a check
// period) and such a ping is outstanding past its grace. The ping comes that
// late because, unanswered, it suspends the keepalive probes and is itself
// retransmitted with exponential backoff: an early one could leave a link
// that came back unasked until after the deadline. Nothing on this
// stream ever waits for the peer's application, and data streams carry no
// TCP_USER_TIMEOUT, which Linux would also apply to a closed window.
//
// The same stream tells each end promptly that the other closed (FIN) or
// died (the kernel closes a killed process's sockets).
type liveness struct {
	fd     int
	pol    livePolicy
	next   int64 // monotonic time of the next check
	pingAt int64 // when the outstanding ping was written; 0 when none
	// ackedAt is when the peer's kernel last acknowledged anything before
	// the outstanding ping (pingAt less the age of the last ACK then). A
	// segment the peer sends while our ping stays unacknowledged (its own
	// ping, or that ping's retransmissions) refreshes tcpi_last_ack_recv
	// without answering ours: a host that cannot hear us (a one-way cut) is
	// silent from here on, however much it talks.
	ackedAt int64
	// A peer that cannot hear us retransmits: our ACKs do not reach it.
	// Each of its segments refreshes tcpi_last_ack_recv all the same (its
	// ping's retransmissions, its close once NCCL aborts on its error), so
	// once a data segment arrives that brings no new byte (every ping is
	// one byte, sent on its own: only a retransmission does that), this end
	// is in doubt: silence counts from heardBefore, what was heard as of the
	// check before the peer's first new byte in half a timeout (which its
	// first unanswered segment refreshed), and only an answer to a ping of
	// ours ends the doubt. A peer that hears us retransmits nothing, so its
	// pings are no reason to ping back. segsIn and bytesIn are
	// tcpi_data_segs_in and tcpi_bytes_received as of the last check
	// (kernels before 4.6 lack the first: then no doubt is ever raised, and
	// a host that cannot hear us is declared dead once it stops sending, or
	// by the streams' keepalive once it closed). heard: when the peer's
	// kernel last answered as far as this end can tell.
	heard, heardBefore int64
	newAt              int64 // when the latest check found a new byte
	doubt              bool
	segsIn             uint32
	bytesIn            uint64
	last               int64 // when the previous check ran; 0 before the first
	// idled: since the previous check, the comm's last pending request
	// completed (so NCCL's thread had no reason to call test). A check late
	// by more than two periods without it follows a stall of NCCL's thread
	// with a request pending, not an idle spell.
	idled    bool
	silent   int64 // how long the peer had not answered, as of the last check
	closed   bool  // the peer closed its end (EOF or reset), at closedAt
	closedAt int64
	calls    uint32 // checkLive calls, for reading the clock only every liveClockEvery
	info     unix.TCPInfo
	buf      [64]byte
	// Counters for tests and docs: checks run, pings written.
	checks, pings uint64
}

const liveClockEvery = 16

// liveState is what a check found.
type liveState int

const (
	liveOK liveState = iota
	livePeerClosed
	liveDead
)

// due reports whether a check is due at t (the caller's clock read).
func (l *liveness) due(t int64) bool { return t >= l.next }

// check runs one liveness check at time t. err explains liveDead.
func (l *liveness) check(t int64) (liveState, error) {
	l.next = t + l.pol.period
	l.checks++
	// A check more than two periods after the previous one follows an idle
	// spell (no request pending, no check): what was heard before it is too
	// old to say, and an ACK of a ping of ours seen now may have come before
	// a retransmission that raises a doubt now. Only an idle spell: when a
	// request stayed pending all along, NCCL's thread was held up (a busy
	// or stopped process), and what this end knew still holds. Taken for
	// idle, the stall dropped our outstanding ping and took silence from the
	// last segment again, which a deaf peer's retransmissions keep young:
	// the verdict on a one-way cut came up to a timeout late after each
	// stall of 0.2 s or more (the CI failure of 2026-11-29, 4.0009 s against
	// NCCL_GO_TIMEOUT + 2 s).
	first, gap := l.last == 0, l.idled && t-l.last > 2*l.pol.period
	l.last, l.idled = t, false
	if gap {
		l.pingAt = 0
	}
	if !l.closed {
		if closed, err := readPings(l.fd, &l.buf); closed {
			l.closed, l.closedAt = true, t
		} else if err != nil {
			return liveDead, err
		}
	}
	// After the peer's end of file only a doubt, or a ping of ours still
	// unanswered, is worth a look, and for a timeout the peer's
	// retransmissions: a host that stopped hearing us (a one-way cut)
	// pinged us before its verdict, which may come, and its close with it,
	// before its first retransmission of that ping reaches us; the streams
	// still owed bytes would otherwise wait for it through their keepalive,
	// several quarters of the timeout more. A peer that closed with none of
	// these closed for reasons of its own; the streams' keepalive asks its
	// host from then on.
	if l.pol.timeout <= 0 || l.closed && !l.doubt && l.pingAt == 0 && t-l.closedAt > l.pol.timeout {
		return l.alive(), nil
	}
	if err := tcpInfo(l.fd, &l.info); err != nil {
		if l.closed {
			return livePeerClosed, nil
		}
		return liveDead, err
	}
	age := int64(l.info.Last_ack_recv) * int64(time.Millisecond)
	segs, bytes := l.info.Data_segs_in, l.info.Bytes_received
	if finReceived(l.info.State) {
		// The kernel counts the peer's FIN as a byte received, though no
		// data segment brings it: counted, it hid a retransmission that
		// reached us in the same period (a deaf host retrying its ping,
		// then closing).
		bytes--
	}
	if first {
		// The baseline: bytes already in it (the connector's hello, a
		// ping that came before this end had a request pending) may yet
		// be retransmitted, raising a doubt before any new byte set
		// heardBefore; silence then counts from now at the earliest.
		l.heardBefore = t - age
	} else {
		newBytes := bytes - l.bytesIn
		if newBytes > 0 {
			// The first of the peer's bytes in half a timeout: the ones
			// after it may have been written while it already could not
			// hear us, and refreshed what was heard since.
			if t-l.newAt > l.pol.timeout/2 {
				l.heardBefore = l.heard
				if gap {
					// Unknown: the new byte refreshed the age; the
					// verdict can only come later for it, never earlier.
					l.heardBefore = t - age
				}
			}
			l.newAt = t
		}
		if uint64(segs-l.segsIn) > newBytes && !l.doubt {
			l.doubt, l.heard = true, l.heardBefore
		}
	}
	l.segsIn, l.bytesIn = segs, bytes
	if !l.doubt || gap {
		l.heard = t - age
	}
	// How long the peer has not answered as far as we can tell: the age of
	// the last ACK, or, in doubt, since the last ACK we trusted.
	quiet := max(age, t-l.heard)
	l.silent = quiet
	// A ping still in the send queue is outstanding too: with the local link
	// down the kernel cannot transmit it, so it never counts as unacked, and
	// without this the check would write another ping every period and never
	// declare the silent peer dead (faults lane, link-down-timeout).
	if l.info.Unacked > 0 || l.info.Notsent_bytes > 0 {
		if l.pingAt == 0 {
			l.pingAt, l.ackedAt = t, t-quiet
		}
		// Silence counts from the last ACK before the ping, not the last
		// segment: while the ping is unanswered, whatever else the peer
		// sends answers nothing of ours.
		l.silent = max(quiet, t-l.ackedAt)
		if l.silent >= l.pol.deadAfter && t-l.pingAt >= l.pol.grace {
			return liveDead, nil
		}
		return l.alive(), nil
	}
	if l.pingAt != 0 {
		// Our ping was answered (an ACK, or a closed peer's reset): the
		// peer hears us.
		l.pingAt, l.doubt = 0, false
		l.heard, l.silent = t-age, age
	}
	if l.closed && !l.doubt {
		return livePeerClosed, nil
	}
	if l.silent >= l.pol.pingAfter {
		n, err := sendSlice(l.fd, l.buf[:1])
		if err != nil {
			if l.closed {
				// Reset (the peer closed with our pings unread, so it
				// heard them): no ping can go out any more, and the
				// streams' keepalive is what is left to ask.
				l.doubt = false
				return livePeerClosed, nil
			}
			return liveDead, err
		}
		if n == 1 {
			l.pingAt, l.ackedAt = t, t-l.silent
			l.pings++
		}
	}
	return l.alive(), nil
}

// requestDone notes that one of the comm's requests completed, leaving
// inUse pending: the last one starts an idle spell (idled).
func (l *liveness) requestDone(inUse int) {
	if inUse == 0 {
		l.idled = true
	}
}

// finReceived reports whether a TCP state is one reached only after the
// peer's FIN arrived. CLOSE is not: a reset leads there too.
func finReceived(state uint8) bool {
	switch state {
	case unix.BPF_TCP_CLOSE_WAIT, unix.BPF_TCP_LAST_ACK, unix.BPF_TCP_CLOSING, unix.BPF_TCP_TIME_WAIT:
		return true
	}
	return false
}

// alive is a check's verdict on a peer not found dead.
func (l *liveness) alive() liveState {
	if l.closed {
		return livePeerClosed
	}
	return liveOK
}

// readPings drains the peer's pings from a liveness stream (at most 16
// reads). closed: end of file or a reset, also one with our pings unread:
// the peer closed its end.
func readPings(fd int, buf *[64]byte) (closed bool, err error) {
	for i := 0; i < 16; i++ {
		n, eof, err := recvSlice(fd, buf[:])
		if err == unix.ECONNRESET || eof {
			return true, nil
		}
		if err != nil || n < len(buf) {
			return false, err
		}
	}
	return false, nil
}

// silentFor is how long the peer's kernel has not answered, as of the last
// check (for the WARN that declares it dead).
func (l *liveness) silentFor() time.Duration {
	return time.Duration(l.silent)
}

// setupLiveness applies the keepalive policy to a liveness stream.
func setupLiveness(fd int, pol livePolicy) error {
	if err := setNoDelay(fd); err != nil {
		return err
	}
	if pol.timeout <= 0 {
		return nil
	}
	return setKeepalive(fd, pol.keepIdle, pol.keepCnt)
}

// setKeepalive has the kernel probe fd after idle seconds without a segment
// from the peer, every idle seconds, and fail it (ETIMEDOUT) after cnt
// unanswered probes.
func setKeepalive(fd, idle, cnt int) error {
	for _, o := range []struct{ level, opt, v int }{
		{unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
		{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, idle},
		{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, idle},
		{unix.IPPROTO_TCP, unix.TCP_KEEPCNT, cnt},
	} {
		if err := unix.SetsockoptInt(fd, o.level, o.opt, o.v); err != nil {
			return err
		}
	}
	return nil
}

// keepCntAfterClose is the keepalive count of a receiving stream once the
// sender closed: its host is then asked every keepIdleAfterClose, and after
// this many silent probes in a row the kernel fails the stream, one interval
// after the last of them: (keepCntAfterClose+1) intervals after the stream's
// last segment. A cut that swallows them all spans (keepCntAfterClose-1)
// intervals at least (from just before the first to just after the last),
// so with 5 that is 4 quarters of NCCL_GO_TIMEOUT: a cut shorter than the
// timeout recovers, as the liveness stream promises.
const keepCntAfterClose = 5

// keepIdleAfterClose is NCCL_GO_TIMEOUT/4 in whole seconds, rounded up (the
// kernel counts keepalive in seconds), at least 1.
func keepIdleAfterClose(timeout int64) int {
	s := (timeout/4 + int64(time.Second) - 1) / int64(time.Second)
	return int(min(max(s, 1), 32767))
}

// watchStreamsAfterClose covers the one wait the liveness stream cannot:
// the sender closed (its liveness stream is at end of file, at once, since
// nothing is queued on it) while bytes of a message were still on their way:
// an inline payload or later headers on the control stream, whose own end of
// file waits behind them, or chunks on the data streams. The receive then
// waits for bytes only the sender's kernel still sends, and if that host
// dies nothing would ever end the wait. The control and data streams get TCP
// keepalive instead: a live kernel answers the probes however long it takes
// to deliver (and with an open window that is not long: the sender's
// application has nothing left to do), a dead one does not, and the kernel
// fails the stream with ETIMEDOUT (or the unreachable error an ARP or ICMP
// failure left), which the next read reports (streamFailed). Probes are sent
// only on a stream that received nothing for keepIdleAfterClose, so a
// stream still moving pays nothing. With NCCL_GO_TIMEOUT <= 0 (no dead-host
// detection) nothing is set.
func (c *core) watchStreamsAfterClose() {
	if c.watchedAfterClose || c.live.pol.timeout <= 0 {
		return
	}
	c.watchedAfterClose = true
	idle := keepIdleAfterClose(c.live.pol.timeout)
	arm := func(fd int) {
		if err := setKeepalive(fd, idle, keepCntAfterClose); err != nil {
			c.log.Infof(nccl.SubsysNet, "NET/GoSocket : receive connection from %s: TCP keepalive on a stream after the sender's close failed (%v); "+
				"a receive still waiting for its bytes there is then bounded only by NCCL's own watchdog", c.peer, err)
		}
	}
	arm(c.ctrl)
	for _, s := range c.streams {
		arm(s.fd)
	}
}
