package nccl

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestPeerTimeoutAndKeepAlive(t *testing.T) {
	env := map[string]string{}
	SetEnvLookup(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	t.Cleanup(func() { SetEnvLookup(nil) })
	assert.Equal(t, DefaultTimeout, PeerTimeout(DiscardLogger{}))
	env[EnvTimeout] = "20"
	assert.Equal(t, 20*time.Second, PeerTimeout(DiscardLogger{}))

	k := KeepAlive(20 * time.Second)
	assert.True(t, k.Enable)
	assert.Equal(t, 10*time.Second, k.Idle)
	assert.Equal(t, 2*time.Second, k.Interval)
	assert.Equal(t, 5, k.Count)
	short := KeepAlive(500 * time.Millisecond)
	assert.Equal(t, time.Second, short.Idle, "probes are at least a second apart")
	assert.Equal(t, time.Second, short.Interval)
	assert.False(t, KeepAlive(0).Enable, "0 disables the dead-peer checks")
}
