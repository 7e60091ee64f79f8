package socket

import (
	"bytes"
	"encoding/binary"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// A peer whose host vanishes (power loss, cut link) sends neither FIN nor
// RST; only its silence tells. These tests make both ends live in a private
// network namespace whose loopback they take down: every packet between
// them is then dropped, as on a cut link. The transport creates all its
// sockets on the calling thread (connect and accept are driven by the
// caller), so locking the test goroutine to a thread that entered the
// namespace puts them all there.

// enterPrivateNetns moves the calling goroutine, for good, into a new
// network namespace with its loopback up. The thread is discarded when the
// test's goroutine ends (it stays locked). Skips only where namespaces
// cannot be created (no CAP_SYS_ADMIN/CAP_NET_ADMIN), saying so.
func enterPrivateNetns(t *testing.T) {
	t.Helper()
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		if errors.Is(err, unix.EPERM) {
			t.Skipf("cannot create a network namespace (%v): these tests need CAP_SYS_ADMIN; run them as root", err)
		}
		t.Fatalf("unshare(CLONE_NEWNET): %v", err)
	}
	setLoopback(t, true)
}

// setLoopback brings the namespace's lo up or down: down, every packet
// between the two ends is dropped and the routes to 127/8 vanish.
func setLoopback(t *testing.T, up bool) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	require.NoError(t, err)
	require.NoError(t, unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr))
	f := ifr.Uint16()
	if up {
		f |= unix.IFF_UP
	} else {
		f &^= unix.IFF_UP
	}
	ifr.SetUint16(f)
	require.NoError(t, unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr))
}

// TestUnreachablePeerDetected: the link is cut; whichever end is waiting
// fails within NCCL_GO_TIMEOUT (plus this test's polling slack), with data in
// flight or not, with and without data streams.
func TestUnreachablePeerDetected(t *testing.T) {
	cases := []struct {
		name    string
		streams string
		side    string // which end waits: "send" (large message in flight) or "recv"
		inFlt   bool   // recv side: a message half arrived
	}{
		{"recv-idle-streams=0", "0", "recv", false},
		{"recv-idle-streams=4", "4", "recv", false},
		{"recv-midmessage-streams=0", "0", "recv", true},
		{"recv-midmessage-streams=4", "4", "recv", true},
		{"send-inflight-streams=0", "0", "send", true},
		{"send-inflight-streams=4", "4", "send", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			enterPrivateNetns(t)
			const timeout = time.Second
			withEnv(t, map[string]string{envTimeout: "1", envNThreads: c.streams})
			log := &captureLog{}
			tr := initLoopback(t, log)
			s, r := pair(t, tr)
			const size = 128 << 20
			src := make([]byte, size)
			dst := make([]byte, size)
			var test func() (bool, error)
			live := &s.live
			switch c.side {
			case "recv":
				rq, err := r.Irecv([]nccl.RecvBuffer{{Data: bufPtr(dst), Size: size, Tag: 1}})
				require.NoError(t, err)
				if c.inFlt {
					// The sender's first bytes arrive; its host then vanishes
					// with the message half sent.
					sq, err := s.Isend(bufPtr(src), size, 1, 0)
					require.NoError(t, err)
					for i := 0; i < 3; i++ {
						s.Test(sq)
						r.Test(rq, nil)
					}
				}
				test = func() (bool, error) { return r.Test(rq, nil) }
				live = &r.live
			case "send":
				sq, err := s.Isend(bufPtr(src), size, 1, 0)
				require.NoError(t, err)
				test = func() (bool, error) { done, _, err := s.Test(sq); return done, err }
			}
			setLoopback(t, false)
			start := time.Now()
			var err error
			for err == nil {
				var done bool
				done, err = test()
				require.False(t, done, "nothing can complete over a cut link")
				require.Less(t, time.Since(start), timeout+5*time.Second, "a peer behind a cut link was never declared dead")
				pace()
			}
			took := time.Since(start)
			t.Logf("declared dead after %v (NCCL_GO_TIMEOUT=%v)", took.Round(time.Millisecond), timeout)
			assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
			assert.Contains(t, err.Error(), "unreachable")
			assert.Contains(t, err.Error(), envTimeout)
			// The host's silence counts from its last ACK, which may predate
			// the cut when nothing asked it anything (no check runs between
			// two Test calls): the time since the cut is no measure of it.
			assert.GreaterOrEqual(t, live.silentFor(), timeout/2, "declared dead before its host was silent for half the timeout")
			runtime.KeepAlive(src)
			runtime.KeepAlive(dst)
		})
	}
}

// TestLinkBackLateInTheTimeout: the link comes back when the sender's
// liveness stream has heard nothing for 7.5 s of an 8 s timeout, and the
// receiver, slow but alive, has posted nothing, so no check of its own can
// help. The host answers again before the timeout, so nothing may fail. A
// ping written at half the timeout would still be unanswered then, its
// retransmissions backed off past the deadline (at about 4.2, 4.6, 5.4, 7.1
// and 10.3 s), and the peer would be declared dead 0.4 s after it came back.
func TestLinkBackLateInTheTimeout(t *testing.T) {
	enterPrivateNetns(t)
	withEnv(t, map[string]string{envTimeout: "8", envNThreads: "0"})
	log := &captureLog{}
	tr := initLoopback(t, log)
	s, r := pair(t, tr)
	const size = 64 << 20
	src := make([]byte, size)
	pattern(src, 5)
	dst := make([]byte, size)
	sq, err := s.Isend(bufPtr(src), size, 1, 0)
	require.NoError(t, err)
	age := func() time.Duration {
		var ti unix.TCPInfo
		require.NoError(t, tcpInfo(s.live.fd, &ti))
		return time.Duration(ti.Last_ack_recv) * time.Millisecond
	}
	a0 := age()
	setLoopback(t, false)
	cut := time.Now()
	upAt := cut.Add(7500*time.Millisecond - a0)
	back := false
	for end := upAt.Add(3 * time.Second); time.Now().Before(end); {
		if !back && time.Now().After(upAt) {
			setLoopback(t, true)
			back = true
			t.Logf("link back after %v, the liveness stream silent for %v", time.Since(cut).Round(time.Millisecond), age())
		}
		_, _, err = s.Test(sq)
		require.NoError(t, err, "the peer's host answered again %v after the link came back, before NCCL_GO_TIMEOUT=8s",
			time.Since(upAt).Round(time.Millisecond))
		pace()
	}
	rq, err := r.Irecv([]nccl.RecvBuffer{{Data: bufPtr(dst), Size: size, Tag: 1}})
	require.NoError(t, err)
	for sd, rd := false, false; !sd || !rd; pace() {
		if !sd {
			sd, _, err = s.Test(sq)
			require.NoError(t, err)
		}
		if !rd {
			rd, err = r.Test(rq, nil)
			require.NoError(t, err)
		}
	}
	require.Equal(t, src, dst)
	assert.NotContains(t, log.String(), "WARN")
}

// TestLinkFlapRecovers: the link goes down for less than NCCL_GO_TIMEOUT
// and comes back: nothing fails and every byte arrives.
func TestLinkFlapRecovers(t *testing.T) {
	for _, streams := range []string{"0", "4"} {
		t.Run("streams="+streams, func(t *testing.T) {
			enterPrivateNetns(t)
			withEnv(t, map[string]string{envTimeout: "8", envNThreads: streams})
			log := &captureLog{}
			tr := initLoopback(t, log)
			s, r := pair(t, tr)
			const size = 64 << 20
			src := make([]byte, size)
			pattern(src, 3)
			dst := make([]byte, size)
			rq, err := r.Irecv([]nccl.RecvBuffer{{Data: bufPtr(dst), Size: size, Tag: 1}})
			require.NoError(t, err)
			sq, err := s.Isend(bufPtr(src), size, 1, 0)
			require.NoError(t, err)
			// The message is under way when the link goes down.
			sd, _, err := s.Test(sq)
			require.NoError(t, err)
			rd, err := r.Test(rq, nil)
			require.NoError(t, err)
			require.False(t, sd && rd)
			setLoopback(t, false)
			down := time.Now().Add(2 * time.Second)
			for !sd || !rd {
				if down != (time.Time{}) && time.Now().After(down) {
					setLoopback(t, true)
					down = time.Time{}
				}
				if !sd {
					sd, _, err = s.Test(sq)
					require.NoError(t, err, "a link down for less than the timeout is not a dead peer")
				}
				if !rd {
					rd, err = r.Test(rq, nil)
					require.NoError(t, err, "a link down for less than the timeout is not a dead peer")
				}
				pace()
			}
			require.Equal(t, src, dst)
			assert.NotContains(t, log.String(), "WARN")
		})
	}
}

// The liveness ping goes out one grace before the verdict (half the timeout
// at the shortest timeouts), the verdict comes within the timeout (from 1 s), and from
// 2 s on a live host's keepalive answers keep the ping from ever being sent.
func TestLivePolicyPingsLate(t *testing.T) {
	for _, d := range []time.Duration{300 * time.Millisecond, time.Second, 2 * time.Second, 8 * time.Second, 300 * time.Second} {
		p := livePolicyFor(d)
		T := int64(d)
		if d >= time.Second { // below, a ping's 250 ms grace outlasts half the timeout
			assert.LessOrEqual(t, p.deadAfter, T, "%v: verdict after the timeout", d)
		}
		assert.GreaterOrEqual(t, p.deadAfter-p.pingAfter, p.grace, "%v: a ping gets its grace before the verdict", d)
		assert.GreaterOrEqual(t, p.pingAfter, T/2, "%v", d)
		if d >= time.Second {
			assert.Equal(t, p.grace, p.deadAfter-p.pingAfter, "%v: the ping is not as late as the verdict allows", d)
		}
		if d >= 2*time.Second {
			assert.Less(t, int64(p.keepIdle)*int64(time.Second), p.pingAfter, "%v: keepalive answers come later than the ping", d)
		}
	}
}

// TestClosedSendersHostDiesMidMessage: the sender closes once its last
// message is handed to the kernel, so a matched receive can still be waiting
// for chunks on the data streams when the control and liveness streams are
// already at end of file. If the sender's host dies then, only those data
// streams could tell, and until 2026-11-28 nothing asked them: the receive
// waited forever. Now each gets TCP keepalive at the close, and the receive
// fails 6 × max(1 s, NCCL_GO_TIMEOUT/4 rounded up to seconds) after the last
// segment (6 s here); a host that answers keeps it waiting, and its chunks
// complete it. In "dies-later-header" a second message's header, whose
// receive is not posted, sits in front of the control stream's end of file,
// so only the liveness stream says that the sender closed.
func TestClosedSendersHostDiesMidMessage(t *testing.T) {
	for _, c := range []struct {
		name    string
		helpers string
		dies    bool
		later   bool // a second header, for a receive never posted, comes before the close
	}{
		{"dies", "0", true, false},
		{"dies-helpers", "4", true, false},
		{"dies-later-header", "0", true, true},
		{"alive-helpers", "4", false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			enterPrivateNetns(t)
			withEnv(t, map[string]string{envTimeout: "0.3", envNThreads: "4", envHelpers: c.helpers})
			log := &captureLog{}
			tr := initLoopback(t, log)
			rc, hi, ctrl, beat, data := acceptRogue(t, tr, 44)
			require.Equal(t, 4, hi.streams)
			r := rc.(*recvComm)
			const size = 1 << 20
			dst := make([]byte, size)
			rq, err := rc.Irecv([]nccl.RecvBuffer{{Data: bufPtr(dst), Size: size, Tag: 3}})
			require.NoError(t, err)
			var hdr [hdrLen]byte
			binary.LittleEndian.PutUint32(hdr[0:], size)
			binary.LittleEndian.PutUint32(hdr[4:], 0) // all of it on the data streams
			binary.LittleEndian.PutUint32(hdr[8:], 3)
			binary.LittleEndian.PutUint32(hdr[12:], hdrCheck) // sequence 0
			_, err = ctrl.Write(hdr[:])
			require.NoError(t, err)
			src := make([]byte, size)
			pattern(src, 4)
			cs := r.chunkSize(size)
			_, err = data[0].Write(src[:1000]) // the first chunk's first bytes
			require.NoError(t, err)
			if c.later {
				binary.LittleEndian.PutUint32(hdr[0:], 64)
				binary.LittleEndian.PutUint32(hdr[4:], 64) // inline
				binary.LittleEndian.PutUint32(hdr[12:], hdrCheck^1)
				_, err = ctrl.Write(append(hdr[:], make([]byte, 64)...))
				require.NoError(t, err)
			}
			// The sender's process closes; its kernel still holds the rest.
			require.NoError(t, ctrl.Close())
			require.NoError(t, beat.Close())
			deadline := time.Now().Add(10 * time.Second)
			for !r.watchedAfterClose {
				done, err := rc.Test(rq, nil)
				require.NoError(t, err, "the matched receive failed on the sender's close")
				require.False(t, done)
				require.True(t, time.Now().Before(deadline), "the sender's close was never noticed")
				pace()
			}
			assert.Equal(t, !c.later, r.ctrlEOF, "the control stream's end of file is read only when no header waits in front of it")
			if c.dies {
				setLoopback(t, false)
			}
			// Longer than keepalive needs to give up on a silent host:
			// 1 s idle and 4 probes a second apart.
			silence := time.Now().Add(keepWait)
			for time.Now().Before(silence) {
				done, err := rc.Test(rq, nil)
				require.False(t, done)
				if err != nil {
					require.True(t, c.dies, "a closed sender whose host answers was declared dead: %v", err)
					assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
					assert.Contains(t, err.Error(), "stopped answering")
					assert.Contains(t, log.String(), "WARN")
					return
				}
				pace()
			}
			require.False(t, c.dies, "the receive still waits %v after the closed sender's host went silent", keepWait)
			// The host was alive all along: the rest of the message comes.
			_, err = data[0].Write(src[1000:cs])
			require.NoError(t, err)
			for off, i := cs, 1; off < size; off, i = off+cs, i+1 {
				_, err := data[i%len(data)].Write(src[off:min(off+cs, size)])
				require.NoError(t, err)
			}
			sizes := []int{-1}
			for deadline = time.Now().Add(10 * time.Second); ; pace() {
				done, err := rc.Test(rq, sizes)
				require.NoError(t, err)
				if done {
					break
				}
				require.True(t, time.Now().Before(deadline), "the matched receive never completed")
			}
			assert.Equal(t, []int{size}, sizes)
			assert.True(t, bytes.Equal(src, dst), "payload differs")
			assert.NotContains(t, log.String(), "WARN")
		})
	}
}

// TestClosedInlineSendersHostDies: the same with the real sender and no data
// streams (the default below 8 CPUs). Its last message, 2 MiB inline, is
// handed to its kernel (its test completes) and it closes: the liveness
// stream's end of file arrives at once, the control stream's waits behind
// the bytes the receiver's small buffer has not taken yet. Then the host
// dies. Only the liveness stream says that the sender closed, and the wait
// is for the control stream's bytes: it gets keepalive too.
func TestClosedInlineSendersHostDies(t *testing.T) {
	enterPrivateNetns(t)
	withEnv(t, map[string]string{envTimeout: "1", envNThreads: "0", envSndBuf: "4194304", envRcvBuf: "131072"})
	log := &captureLog{}
	tr := initLoopback(t, log)
	s, r := pair(t, tr)
	src, dst, sq, rq := postOne(t, s, r, 2<<20)
	waitSent(t, s, sq)
	// The receiver has not read yet: most of the message is still in the
	// sender's kernel when it closes and its host dies.
	require.NoError(t, s.Close())
	setLoopback(t, false)
	start := time.Now()
	for {
		done, err := r.Test(rq, nil)
		require.False(t, done, "2 MiB cannot have fit the receiver's buffer")
		if err != nil {
			assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
			assert.Contains(t, err.Error(), "stopped answering")
			break
		}
		require.Less(t, time.Since(start), keepWait, "the receive still waits after the closed sender's host died")
		pace()
	}
	assert.True(t, r.watchedAfterClose)
	assert.False(t, r.ctrlEOF, "the control stream's end of file cannot have come before its bytes")
	runtime.KeepAlive(src)
	runtime.KeepAlive(dst)
}

// TestKeepIdleAfterCloseNeverUndercutsTheTimeout: the kernel takes keepalive
// times in whole seconds; truncating NCCL_GO_TIMEOUT/4 (7 s: 1 s) or giving
// up after 4 probes (a cut of 3 intervals, 3/4 of the timeout, swallows
// them) would fail a receive over a cut shorter than the timeout.
func TestKeepIdleAfterCloseNeverUndercutsTheTimeout(t *testing.T) {
	for _, c := range []struct {
		timeout time.Duration
		idle    int
	}{
		{300 * time.Millisecond, 1}, {4 * time.Second, 1}, {7 * time.Second, 2},
		{11 * time.Second, 3}, {300 * time.Second, 75}, {301 * time.Second, 76},
	} {
		idle := keepIdleAfterClose(int64(c.timeout))
		assert.Equal(t, c.idle, idle, "NCCL_GO_TIMEOUT=%v", c.timeout)
		// A cut from just before the first of keepCntAfterClose probes
		// to just after the last swallows them all.
		assert.GreaterOrEqual(t, time.Duration(keepCntAfterClose-1)*time.Duration(idle)*time.Second, c.timeout,
			"NCCL_GO_TIMEOUT=%v: a cut shorter than the timeout would fail the receive", c.timeout)
	}
}

// keepWait bounds how long the kernel takes to fail a data stream whose
// peer's host is silent, at the tests' 0.3 s and 1 s NCCL_GO_TIMEOUT: 1 s
// idle, keepCntAfterClose probes 1 s apart and the verdict 1 s after the
// last, plus slack.
const keepWait = time.Duration(1+keepCntAfterClose)*time.Second + 3*time.Second
