package socket

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/internal/clock"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// A connector whose first connect call issued connect(2) for every stream
// (not yet connected when polled, as on any real network) and that then
// stalls (SIGSTOP, debugger, busy service thread) for longer than
// NCCL_GO_SOCKET_HELLO_TIMEOUT but far less than NCCL_GO_TIMEOUT: alive and
// within the documented bound, it must still get connected, and its first
// send must arrive. Before, the listener had dropped the streams, the
// connector wrote its hellos into closed connections and returned a comm
// whose first send failed ("broken pipe"), and accept never returned one.
func TestConnectorStalledPastTheHelloWaitStillConnects(t *testing.T) {
	withEnv(t, map[string]string{envNThreads: "0", envHelloTimeout: "1", envTimeout: "30"})
	log := &captureLog{}
	tr := initLoopback(t, log)
	var h nccl.Handle
	l, err := tr.Listen(0, &h)
	require.NoError(t, err)
	defer l.Close()

	// What NCCL's first connect call does when poll(0) does not yet see the
	// streams connected: connect(2) issued for each, nothing more.
	hi, err := decodeHandle(&h, magic(log))
	require.NoError(t, err)
	op := newConnectOp(0x1234567|1, hi, &tr.devs[0], log)
	op.mu.Lock()
	for i := range op.socks {
		op.dial(i, clock.Now())
		require.NotEqual(t, dialDone, op.socks[i].state)
	}
	op.mu.Unlock()
	tr.mu.Lock()
	tr.pending[op.id] = op
	tr.mu.Unlock()
	ch := h
	setPendingConn(&ch, op.id)

	// The connector stalls 1.5 s (< NCCL_GO_TIMEOUT=30 s); the acceptor
	// keeps polling as NCCL does.
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); {
		rc, err := l.Accept()
		require.NoError(t, err)
		require.Nil(t, rc)
		time.Sleep(10 * time.Millisecond)
	}
	// The connector runs again.
	var sc nccl.SendComm
	var rc nccl.RecvComm
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) && (sc == nil || rc == nil) {
		if sc == nil {
			sc, err = tr.Connect(0, &ch, nccl.ConnectOptions{})
			require.NoError(t, err)
		}
		if rc == nil {
			rc, err = l.Accept()
			require.NoError(t, err)
		}
		runtime.Gosched()
	}
	t.Logf("after the stall: connect returned a comm: %v; accept returned a comm: %v", sc != nil, rc != nil)
	if sc != nil {
		defer sc.Close()
		src := make([]byte, 8)
		q, err := sc.Isend(bufPtr(src), 8, 1, 0)
		for i := 0; err == nil && i < 100; i++ {
			var done bool
			done, _, err = sc.Test(q)
			if done {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		assert.NoError(t, err, "first send on the connector's comm")
	}
	assert.NotNil(t, rc, "an alive connector stalled 1.5 s (< NCCL_GO_TIMEOUT) never gets accepted; log:\n%s", log.String())
	if rc != nil {
		defer rc.Close()
	}
}
