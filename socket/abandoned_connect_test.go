package socket

import (
	"encoding/binary"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// blackHoleHandle is a handle of a real listener of tr with its port
// replaced by blackhole's, so that a connect to it stays in progress.
func blackHoleHandle(t *testing.T, tr *Transport) nccl.Handle {
	var h nccl.Handle
	l, err := tr.Listen(0, &h)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	_, port, err := net.SplitHostPort(blackhole(t))
	require.NoError(t, err)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	binary.LittleEndian.PutUint16(h[12:], uint16(p))
	return h
}

// A connect NCCL stops calling (ncclCommAbort during connection set-up) is
// ended by the next connect or listen after its deadline: its sockets must
// not wait for a Finalize that another communicator may keep from coming.
// A late call with its handle gets the error.
func TestAbandonedConnectIsClosedByTheNextSetUpCall(t *testing.T) {
	withEnv(t, map[string]string{envNThreads: "0", envTimeout: "1"})
	log := &captureLog{}
	tr := initLoopback(t, log)
	peer := blackHoleHandle(t, tr)
	sc, err := tr.Connect(0, &peer, nccl.ConnectOptions{})
	require.NoError(t, err)
	require.Nil(t, sc, "the connect must still be in progress")
	id, ok := pendingConn(&peer)
	require.True(t, ok)
	tr.mu.Lock()
	op := tr.pending[id]
	tr.mu.Unlock()
	require.NotNil(t, op)
	open := func() int {
		op.mu.Lock()
		defer op.mu.Unlock()
		n := 0
		for _, s := range op.socks {
			if s.fd >= 0 {
				n++
			}
		}
		return n
	}
	require.Positive(t, open())

	time.Sleep(1200 * time.Millisecond) // past NCCL_GO_TIMEOUT; nobody calls connect again
	assert.Positive(t, open(), "nothing runs in the background: the sockets wait for the next set-up call")
	var h2 nccl.Handle
	l2, err := tr.Listen(0, &h2) // another communicator's set-up
	require.NoError(t, err)
	defer l2.Close()
	assert.Zero(t, open(), "the abandoned connect's sockets must be closed")
	assert.Contains(t, log.String(), "not called again within NCCL_GO_TIMEOUT=1s")

	_, err = tr.Connect(0, &peer, nccl.ConnectOptions{})
	assert.ErrorContains(t, err, "abandoned")
}

// A connect NCCL keeps calling ends by itself at its first call after the
// deadline, with the deadline's own error; another communicator's set-up
// calls in between must not end it as "abandoned".
func TestPolledConnectPastItsDeadlineIsNotSwept(t *testing.T) {
	withEnv(t, map[string]string{envNThreads: "0", envTimeout: "1"})
	log := &captureLog{}
	tr := initLoopback(t, log)
	peer := blackHoleHandle(t, tr)
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(300 * time.Millisecond) {
		var h2 nccl.Handle
		l2, err := tr.Listen(0, &h2) // another communicator's set-up: sweeps
		require.NoError(t, err)
		l2.Close()
		sc, err := tr.Connect(0, &peer, nccl.ConnectOptions{})
		require.Nil(t, sc)
		if err != nil {
			assert.ErrorContains(t, err, "not connected within NCCL_GO_TIMEOUT=1s")
			assert.NotContains(t, err.Error(), "abandoned")
			return
		}
	}
	t.Fatal("the connect to a black hole did not end within 5 s (NCCL_GO_TIMEOUT=1s)")
}
