package socket

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// TestClosedSenderKeepsUnsentBytes: a send completes with most of its bytes
// still in the sender's kernel, the receiver not reading, and the sender
// closes. Those bytes must stay on an open socket, not an orphan the kernel
// drops after a few minutes of closed window (drain.go); the receiver that
// reads later gets every byte, and once it acknowledged them the streams
// close. Runs in a private network namespace, so that
// /proc/thread-self/net/tcp lists only this test's sockets.
func TestClosedSenderKeepsUnsentBytes(t *testing.T) {
	for _, c := range []struct {
		name string
		env  map[string]string
	}{
		{"inline on the control stream", map[string]string{envNThreads: "0"}},
		{"striped over data streams", map[string]string{envNThreads: "2", envNSocks: "2", envHelpers: "0"}},
		{"striped, with helpers", map[string]string{envNThreads: "2", envNSocks: "2", envHelpers: "2"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			enterPrivateNetns(t)
			c.env[envSndBuf], c.env[envRcvBuf], c.env[envTimeout] = "4194304", "131072", "1"
			withEnv(t, c.env)
			tr := initLoopback(t, &captureLog{})
			m := closeWithUnsent(t, tr, 5)

			unacked, orphans := unackedSockets(t)
			require.NotZero(t, unacked, "the receiver has not read: 2 MiB cannot all have been sent")
			assert.Zero(t, orphans, "a closed sender's unacknowledged bytes were left on orphaned sockets, which the "+
				"kernel drops when the receiver keeps its window shut for minutes")
			// Not equal to unacked: a control stream whose header was
			// acknowledged meanwhile may already be closed.
			assert.NotZero(t, tr.drain.kept())

			// The receiver reads only after three timeouts: liveness, not
			// progress, decides, on either side.
			time.Sleep(3 * time.Second)
			unacked, orphans = unackedSockets(t)
			require.NotZero(t, unacked)
			assert.Zero(t, orphans)
			assert.NotZero(t, tr.drain.kept(), "the streams of a closed sender whose receiver's host answers were dropped")

			// The receiver reads now, and gets every byte.
			m.receiveAll(t, tr)
		})
	}
}

// TestClosedSenderDrainEndsOnReset: a receiver that closes without reading
// resets the streams, which then close; a close with a send pending keeps
// nothing; Finalize closes whatever is still kept.
func TestClosedSenderDrainEndsOnReset(t *testing.T) {
	enterPrivateNetns(t)
	withEnv(t, map[string]string{envNThreads: "2", envNSocks: "2", envHelpers: "0", envSndBuf: "4194304", envRcvBuf: "131072"})
	log := &captureLog{}
	tr := initLoopback(t, log)
	s, r := sendUnread(t, tr)
	require.NoError(t, s.Close())
	require.NotZero(t, tr.drain.kept())
	require.NoError(t, r.Close())
	for deadline := time.Now().Add(5 * time.Second); tr.drain.kept() > 0; time.Sleep(10 * time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "%d streams reset by their receiver still open", tr.drain.kept())
	}

	// An abort (a send still pending) keeps nothing: that message fails at
	// the receiver however its bytes end.
	s, _ = pair(t, tr)
	src := make([]byte, 2<<20)
	_, err := s.Isend(bufPtr(src), len(src), 1, 0)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	assert.Zero(t, tr.drain.kept())

	// Finalize closes what the receiver never acknowledged, saying so.
	s, _ = sendUnread(t, tr)
	require.NoError(t, s.Close())
	require.NotZero(t, tr.drain.kept())
	require.NoError(t, tr.Finalize())
	assert.Zero(t, tr.drain.kept())
	assert.Contains(t, log.String(), "still had")
	runtime.KeepAlive(src)
}

// unackedSockets counts this network namespace's TCP sockets that hold more
// than 256 KiB their peer has not acknowledged (tx_queue), and of those the
// orphans: sockets no descriptor refers to, listed with inode 0. With the
// receive buffer at 128 KiB, that much cannot all have been sent: it is the
// unsent bytes a closed sender must not leave on an orphan (bytes in flight,
// such as a last header awaiting a delayed ACK, may be; the receiver's kernel
// acknowledges them).
func unackedSockets(t *testing.T) (unacked, orphans int) {
	t.Helper()
	for _, name := range []string{"tcp", "tcp6"} {
		f, err := os.Open("/proc/thread-self/net/" + name)
		require.NoError(t, err)
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			require.GreaterOrEqual(t, len(fs), 10, "unexpected line in /proc/net/%s: %q", name, sc.Text())
			q, _, _ := strings.Cut(fs[4], ":")
			tx, err := strconv.ParseUint(q, 16, 64)
			require.NoError(t, err)
			// 0A: LISTEN, whose tx_queue is its backlog limit.
			if tx <= 256<<10 || fs[3] == "0A" {
				continue
			}
			unacked++
			if fs[9] == "0" {
				orphans++
			}
		}
		require.NoError(t, sc.Err())
		f.Close()
	}
	return unacked, orphans
}

// TestClosedSenderDrainEndsWhenReceiversHostDies: the kept streams go once
// the receiver's host stops answering for NCCL_GO_TIMEOUT (here the link is
// cut: the namespace's loopback goes down).
func TestClosedSenderDrainEndsWhenReceiversHostDies(t *testing.T) {
	enterPrivateNetns(t)
	withEnv(t, map[string]string{envTimeout: "1", envNThreads: "0", envSndBuf: "4194304", envRcvBuf: "131072"})
	tr := initLoopback(t, &captureLog{})
	s, _ := sendUnread(t, tr)
	require.NoError(t, s.Close())
	require.NotZero(t, tr.drain.kept())
	setLoopback(t, false)
	start := time.Now()
	for tr.drain.kept() > 0 {
		// 2 s (twice the 1 s keepalive interval), then the sweeper's
		// 1 s period.
		require.Less(t, time.Since(start), 6*time.Second, "the streams of a closed sender whose receiver's host died are still kept")
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("kept streams closed %v after the cut", time.Since(start).Round(time.Millisecond))
}

// TestUsualCloseKeepsNothing: once a message was received, a sender's close
// keeps nothing, even with its last header still awaiting a delayed ACK
// (those bytes were sent; the receiver's kernel acknowledges them).
func TestUsualCloseKeepsNothing(t *testing.T) {
	for _, c := range []struct {
		name string
		size int
		env  map[string]string
	}{
		{"inline", 64, map[string]string{envNThreads: "0"}},
		{"striped", 1 << 20, map[string]string{envNThreads: "2", envNSocks: "2", envHelpers: "0"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			withEnv(t, c.env)
			tr := initLoopback(t, &captureLog{})
			for i := 0; i < 20; i++ {
				s, r := pair(t, tr)
				src, dst, sq, rq := postOne(t, s, r, c.size)
				finish(t, s, r, sq, rq, src, dst)
				require.NoError(t, s.Close())
				require.Zero(t, tr.drain.kept(), "round %d: a close after a completed exchange kept streams", i)
				require.NoError(t, r.Close())
			}
		})
	}
}

// TestCloseAfterFinalizeKeepsNothing: Finalize stops the drainer for good (a
// comm closed after it, outside NCCL's contract, starts nothing that would
// outlive it) until Init runs again.
func TestCloseAfterFinalizeKeepsNothing(t *testing.T) {
	withEnv(t, map[string]string{envNThreads: "0", envSndBuf: "4194304", envRcvBuf: "131072"})
	log := &captureLog{}
	tr := initLoopback(t, log)
	s, _ := sendUnread(t, tr)
	require.NoError(t, tr.Finalize())
	require.NoError(t, s.Close())
	assert.Zero(t, tr.drain.kept(), "a close after Finalize kept streams")
	tr.drain.mu.Lock()
	running := tr.drain.running
	tr.drain.mu.Unlock()
	assert.False(t, running, "a close after Finalize started the sweeper")

	require.NoError(t, tr.Init(nccl.InitContext{Log: log}))
	s, _ = sendUnread(t, tr)
	require.NoError(t, s.Close())
	assert.NotZero(t, tr.drain.kept(), "after Init again, a closed sender's unsent bytes are kept again")
}

// TestStaleSweeperLeavesTheNewOne: a sweeper that Finalize stopped while it
// waited for the lock, after which Init and a close started a new one, must
// neither sweep nor mark the drainer idle (the new one would then run on,
// unseen by the next Finalize).
func TestStaleSweeperLeavesTheNewOne(t *testing.T) {
	var d drainer
	stale, current := make(chan struct{}), make(chan struct{})
	close(stale)
	d.running, d.stop = true, current
	assert.False(t, d.sweep(stale), "the stale sweeper did not stop")
	assert.True(t, d.running, "the stale sweeper marked the drainer idle while the current sweeper runs")
	assert.False(t, d.sweep(current), "nothing kept: the current sweeper stops")
	assert.False(t, d.running)
}

// waitSent tests send sq until it is done: all its bytes are in the
// sender's kernel.
func waitSent(t *testing.T, s *sendComm, sq nccl.Request) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; pace() {
		done, _, err := s.Test(sq)
		require.NoError(t, err)
		if done {
			return
		}
		require.True(t, time.Now().Before(deadline), "the send never reached the sender's kernel")
	}
}

// sendUnread connects a pair and sends 2 MiB the receiver does not read,
// until all of it is in the sender's kernel: with the receive buffer at
// 128 KiB, most of it unsent.
func sendUnread(t *testing.T, tr *Transport) (*sendComm, *recvComm) {
	t.Helper()
	s, r := pair(t, tr)
	src := make([]byte, 2<<20)
	sq, err := s.Isend(bufPtr(src), len(src), 1, 0)
	require.NoError(t, err)
	waitSent(t, s, sq)
	runtime.KeepAlive(src)
	return s, r
}

// unsentMessage is a 2 MiB message whose sender closed with most of it
// unsent, and its receive, posted but not yet tested.
type unsentMessage struct {
	r        *recvComm
	rq       nccl.Request
	src, dst []byte
}

// closeWithUnsent connects a pair, posts a 2 MiB receive, sends 2 MiB (the
// pattern of seed) until all of it is in the sender's kernel and closes the
// sender. With the receive buffer at 128 KiB and the receiver not testing,
// most of the message is unsent.
func closeWithUnsent(t *testing.T, tr *Transport, seed int) *unsentMessage {
	t.Helper()
	s, r := pair(t, tr)
	const size = 2 << 20
	m := &unsentMessage{r: r, src: make([]byte, size), dst: make([]byte, size)}
	pattern(m.src, seed)
	var err error
	m.rq, err = r.Irecv([]nccl.RecvBuffer{{Data: bufPtr(m.dst), Size: size, Tag: 1}})
	require.NoError(t, err)
	sq, err := s.Isend(bufPtr(m.src), size, 1, 0)
	require.NoError(t, err)
	waitSent(t, s, sq)
	require.NoError(t, s.Close())
	return m
}

// receiveAll tests the receive until it completes, checks every byte, and
// waits for the drained streams to close.
func (m *unsentMessage) receiveAll(t *testing.T, tr *Transport) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; pace() {
		done, err := m.r.Test(m.rq, nil)
		require.NoError(t, err)
		if done {
			break
		}
		require.True(t, time.Now().Before(deadline), "the receive did not complete")
	}
	require.Equal(t, m.src, m.dst)
	for deadline := time.Now().Add(5 * time.Second); tr.drain.kept() > 0; time.Sleep(10 * time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "%d drained streams still open", tr.drain.kept())
	}
	runtime.KeepAlive(m.src)
	runtime.KeepAlive(m.dst)
}
