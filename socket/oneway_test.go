package socket

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// deafen makes a comm's end hear nothing more from its peer, as a path cut
// in one direction only does (a failed link of a pair, a one-way ACL): a
// socket filter that accepts nothing drops every segment before TCP sees it,
// while what this end sends still reaches the peer.
func deafen(t *testing.T, c *core) {
	t.Helper()
	drop := []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: 0}}
	prog := &unix.SockFprog{Len: uint16(len(drop)), Filter: &drop[0]}
	fds := []int{c.ctrl, c.live.fd}
	for _, s := range c.streams {
		fds = append(fds, s.fd)
	}
	for _, fd := range fds {
		require.NoError(t, unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, prog))
	}
}

// TestOneWayCutIsDeclaredDead: the path is cut in one direction only, so
// the waiting end's pings are never acknowledged while the other end, which
// still has a request pending and hears nothing either, pings it in turn (and
// its kernel retransmits that ping with backoff, once it gave up, and
// possibly closes its comm, as NCCL then aborts). Those segments refresh the
// waiting end's tcpi_last_ack_recv without answering anything of its own:
// the peer cannot hear it, and it must be declared dead within
// NCCL_GO_TIMEOUT as for a cut in both directions. Until 2026-11-29 it was
// not: with NCCL_GO_TIMEOUT=2 the waiting end failed after 6.8-7.1 s (the
// peer keeps its comm: the first gap in its ping's retransmissions longer
// than the timeout decided) or, the peer closing, after 7.3 s (keepalive on
// the streams after the close; "connection timed out", naming no variable).
func TestOneWayCutIsDeclaredDead(t *testing.T) {
	cases := []struct {
		name      string
		waiter    string // "recv": the receive waits and the sender is deaf; "send": the other way
		midMsg    bool   // the message is half received when the cut comes
		peerClose bool   // the deaf end closes its comm once it failed
		// The deaf end pings the waiting end every few check periods, as
		// its ping's retransmissions do, so that the waiting end's last ACK
		// never grows old: which end of a one-way cut pings first, and
		// whether the deaf end fails and closes before the waiting end
		// pinged at all, is otherwise a race (lost on 2026-11-29 in CI).
		chatter bool
	}{
		{"recv-midmessage-peer-keeps-comm", "recv", true, false, false},
		{"recv-midmessage-peer-closes", "recv", true, true, false},
		{"send-inflight-peer-keeps-comm", "send", true, false, false},
		{"recv-midmessage-peer-chatters-keeps-comm", "recv", true, false, true},
		{"recv-midmessage-peer-chatters-closes", "recv", true, true, true},
		{"send-inflight-peer-chatters-closes", "send", true, true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			const timeout = 2 * time.Second
			withEnv(t, map[string]string{envTimeout: "2", envNThreads: "0"})
			tr := initLoopback(t, &captureLog{})
			s, r := pair(t, tr)
			const size = 128 << 20
			src := make([]byte, size)
			dst := make([]byte, size)
			rq, err := r.Irecv([]nccl.RecvBuffer{{Data: bufPtr(dst), Size: size, Tag: 1}})
			require.NoError(t, err)
			var sq nccl.Request
			if c.midMsg {
				sq, err = s.Isend(bufPtr(src), size, 1, 0)
				require.NoError(t, err)
				for i := 0; i < 3; i++ {
					s.Test(sq)
					r.Test(rq, nil)
				}
			}
			// The deaf end keeps a request pending, so that its own checks
			// ping the waiting end (a receive, or the message's send).
			waiter, deaf := &r.core, &s.core
			testWaiter := func() error { _, err := r.Test(rq, nil); return err }
			testDeaf := func() error { _, _, err := s.Test(sq); return err }
			if c.waiter == "send" {
				waiter, deaf = &s.core, &r.core
				testWaiter = func() error { _, _, err := s.Test(sq); return err }
				testDeaf = func() error { _, err := r.Test(rq, nil); return err }
			}
			deafen(t, deaf)
			start := time.Now()
			deafDone := false
			lastChatter := start
			for {
				err := testWaiter()
				if err != nil {
					took := time.Since(start)
					t.Logf("declared dead after %v (NCCL_GO_TIMEOUT=%v): %v", took.Round(time.Millisecond), timeout, err)
					assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
					assert.Contains(t, err.Error(), "unreachable")
					assert.Contains(t, err.Error(), envTimeout)
					assert.GreaterOrEqual(t, waiter.live.silentFor(), timeout/2, "declared dead before the peer was silent for half the timeout")
					break
				}
				// The bound the fault lane holds every verdict to.
				require.Less(t, time.Since(start), timeout+2*time.Second, "a peer that cannot hear us was not declared dead within %s + 2 s", envTimeout)
				if c.chatter && !deafDone && time.Since(lastChatter) >= 250*time.Millisecond {
					lastChatter = time.Now()
					_, err := sendSlice(deaf.live.fd, []byte{0})
					require.NoError(t, err)
				}
				if !deafDone && testDeaf() != nil {
					deafDone = true
					if c.peerClose {
						if deaf == &s.core {
							require.NoError(t, s.Close())
						} else {
							require.NoError(t, r.Close())
						}
					}
				}
				pace()
			}
			runtime.KeepAlive(src)
			runtime.KeepAlive(dst)
		})
	}
}

// TestAPingingPeerThatHearsUsIsAlive: a peer that pings (its own last ACK
// grew old) and hears us, so that this end's kernel acknowledges every ping
// at once, is alive however long it keeps pinging, and no reason for this
// end to ping: only its retransmissions would say that it cannot hear us.
func TestAPingingPeerThatHearsUsIsAlive(t *testing.T) {
	withEnv(t, map[string]string{envTimeout: "1", envNThreads: "0"})
	tr := initLoopback(t, &captureLog{})
	s, r := pair(t, tr)
	dst := make([]byte, 64)
	rq, err := r.Irecv([]nccl.RecvBuffer{{Data: bufPtr(dst), Size: len(dst), Tag: 1}})
	require.NoError(t, err)
	start, last := time.Now(), time.Time{}
	for time.Since(start) < 3*time.Second {
		if time.Since(last) >= 200*time.Millisecond {
			last = time.Now()
			_, err := sendSlice(s.live.fd, []byte{0})
			require.NoError(t, err)
		}
		done, err := r.Test(rq, nil)
		require.NoError(t, err, "a peer that pings and hears us was declared dead")
		require.False(t, done)
		pace()
	}
	assert.False(t, r.live.doubt, "pings that were acknowledged at once raised a doubt")
	assert.Zero(t, r.live.pings, "the peer's pings were answered with pings of ours")
	runtime.KeepAlive(dst)
}
