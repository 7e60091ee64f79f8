package socket

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/internal/fdtest"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// TestAcceptOutOfDescriptorsIsBounded: a process out of descriptors (a job at
// scale under a low ulimit -n) must not have NCCL call accept for ever while
// its peer already holds the connection: accept fails with SystemError
// saying what to raise once NCCL_GO_TIMEOUT has passed without a descriptor
// coming free. It used to answer "not yet" for ever (a silent hang of the
// communicator's set-up, since NCCL prints no WARN by default).
func TestAcceptOutOfDescriptorsIsBounded(t *testing.T) {
	withEnv(t, map[string]string{envTimeout: "1", envNThreads: "0"})
	log := &captureLog{}
	tr := newLoopback()
	require.NoError(t, tr.Init(nccl.InitContext{Log: log}))
	t.Cleanup(func() { tr.Finalize() })
	var h nccl.Handle
	l, err := tr.Listen(0, &h)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	var s nccl.SendComm
	deadline := time.Now().Add(10 * time.Second)
	for s == nil {
		require.True(t, time.Now().Before(deadline), "connect did not complete")
		s, err = tr.Connect(0, &h, nccl.ConnectOptions{})
		require.NoError(t, err)
	}
	t.Cleanup(func() { s.Close() })
	fdtest.Starve(t)
	deadline = time.Now().Add(10 * time.Second)
	for {
		r, err := l.Accept()
		require.Nil(t, r, "accept made a comm without a descriptor")
		if err != nil {
			assert.Equal(t, nccl.SystemError, nccl.ResultOf(err), "%v", err)
			assert.Contains(t, err.Error(), "ulimit -n")
			break
		}
		require.True(t, time.Now().Before(deadline), "accept still answers 'not yet' 10 s after it ran out of descriptors, with NCCL_GO_TIMEOUT=1")
		time.Sleep(10 * time.Millisecond)
	}
	assert.Contains(t, log.String(), "raise the open-files limit (ulimit -n)")
}
