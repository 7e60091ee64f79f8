package nccl

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/libnccl-net-go/libnccl-net-go/internal/timeout"
)

// The deprecated names forward to internal/timeout, which tests the values.
func TestDeprecatedTimeoutHelpersForward(t *testing.T) {
	SetEnvLookup(func(k string) (string, bool) { return "20", k == EnvTimeout })
	t.Cleanup(func() { SetEnvLookup(nil) })
	assert.Equal(t, 20*time.Second, PeerTimeout(nil))
	assert.Equal(t, timeout.KeepAlive(20*time.Second), KeepAlive(20*time.Second))
	assert.Equal(t, timeout.Default, DefaultTimeout)
}
