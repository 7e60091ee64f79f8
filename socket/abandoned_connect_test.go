package socket

import (
	"encoding/binary"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// blackHolePort is a loopback port whose listen backlog is full, so SYNs to
// it go unanswered and a connect to it stays in progress.
func blackHolePort(t *testing.T) uint16 {
	lfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(lfd) })
	require.NoError(t, unix.Bind(lfd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	require.NoError(t, unix.Listen(lfd, 0))
	sa, err := unix.Getsockname(lfd)
	require.NoError(t, err)
	port := sa.(*unix.SockaddrInet4).Port
	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return uint16(port)
}

// A connect NCCL stops calling (ncclCommAbort during connection set-up) is
// ended by the next connect or listen after its deadline: its sockets must
// not wait for a Finalize that another communicator may keep from coming.
// A late call with its handle gets the error.
func TestAbandonedConnectIsClosedByTheNextSetUpCall(t *testing.T) {
	withEnv(t, map[string]string{envNThreads: "0", envTimeout: "1"})
	log := &captureLog{}
	tr := initLoopback(t, log)
	var h nccl.Handle
	l, err := tr.Listen(0, &h)
	require.NoError(t, err)
	defer l.Close()
	peer := h
	binary.LittleEndian.PutUint16(peer[12:], blackHolePort(t))
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
	var h nccl.Handle
	l, err := tr.Listen(0, &h)
	require.NoError(t, err)
	defer l.Close()
	peer := h
	binary.LittleEndian.PutUint16(peer[12:], blackHolePort(t))
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
