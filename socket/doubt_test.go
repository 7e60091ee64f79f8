package socket

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/internal/clock"
)

// driveLive runs both ends' liveness checks as their Tests would with a
// request pending on each, for d. It fails the test on any liveDead.
func driveLive(t *testing.T, a, b *liveness, d time.Duration) {
	t.Helper()
	start := time.Now()
	for time.Since(start) < d {
		for _, l := range []*liveness{a, b} {
			now := clock.Now()
			if l.due(now) {
				st, err := l.check(now)
				require.NotEqual(t, liveDead, st, "a live peer was declared dead after %v (silent %v, err %v)",
					time.Since(start).Round(time.Millisecond), l.silentFor(), err)
			}
		}
		time.Sleep(time.Millisecond)
	}
}

// TestOnePingDoesNotStartPingPong: a peer's doubt ping makes this end
// confirm with a ping of its own (live.go); were that ping a doubt in turn,
// one ping (a lost keepalive answer, a cut that healed late) would leave the
// two ends pinging each other for ever, about once a timeout, each ping a
// verdict if its ACK is lost (found in review on 2026-11-29: 8 pings in 8 s
// at NCCL_GO_TIMEOUT=2, where keepalive alone keeps both last ACKs young).
func TestOnePingDoesNotStartPingPong(t *testing.T) {
	withEnv(t, map[string]string{envTimeout: "2", envNThreads: "0"})
	tr := initLoopback(t, &captureLog{})
	s, r := pair(t, tr)
	_, err := sendSlice(s.live.fd, []byte{pingDoubt}) // the sender's one ping
	require.NoError(t, err)
	driveLive(t, &s.live, &r.live, 8*time.Second)
	t.Logf("pings: sender %d, receiver %d", s.live.pings, r.live.pings)
	assert.Equal(t, uint64(1), r.live.pings, "the receiver confirms the sender's doubt once")
	assert.Zero(t, s.live.pings, "the receiver's confirmation raised a doubt in turn")
	assert.False(t, r.live.suspect, "the confirmation was answered")
}

// TestStalePingDoesNotClearDoubt: a ping of ours answered before an idle
// spell (no request pending, so no check) must not count as the answer to
// a doubt the peer raised during it.
func TestStalePingDoesNotClearDoubt(t *testing.T) {
	withEnv(t, map[string]string{envTimeout: "2", envNThreads: "0"})
	tr := initLoopback(t, &captureLog{})
	s, r := pair(t, tr)
	now := clock.Now()
	_, err := r.live.check(now)
	require.NoError(t, err)
	// A ping of ours went out and was answered; then the request completed.
	r.live.pingAt = now
	time.Sleep(500 * time.Millisecond)
	_, err = sendSlice(s.live.fd, []byte{pingDoubt}) // the peer's doubt, while we were idle
	require.NoError(t, err)
	time.Sleep(50 * time.Millisecond)
	_, err = r.live.check(clock.Now())
	require.NoError(t, err)
	assert.True(t, r.live.suspect, "an answer that came before the peer's ping cleared its doubt")
}

// TestConfirmingPingDoesNotRaiseDoubt: the two ping bytes as the wire
// carries them: a confirmation is no doubt, anything else (a doubt, or a
// byte from a build that sends no confirmations) is.
func TestConfirmingPingDoesNotRaiseDoubt(t *testing.T) {
	withEnv(t, map[string]string{envTimeout: "2", envNThreads: "0"})
	tr := initLoopback(t, &captureLog{})
	s, r := pair(t, tr)
	for _, c := range []struct {
		b     byte
		doubt bool
	}{{pingConfirm, false}, {pingDoubt, true}, {7, true}} {
		_, err := sendSlice(s.live.fd, []byte{c.b})
		require.NoError(t, err)
		time.Sleep(20 * time.Millisecond)
		doubt, closed, err := readPings(r.live.fd, &r.live.buf)
		require.NoError(t, err)
		assert.False(t, closed)
		assert.Equal(t, c.doubt, doubt, "byte %d", c.b)
	}
}
