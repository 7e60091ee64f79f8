package timeout

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/internal/testhook"
)

func TestReadAndBound(t *testing.T) {
	env := map[string]string{}
	ncclenv.SetLookup(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	t.Cleanup(func() { ncclenv.SetLookup(nil) })
	var l testhook.Warnings
	assert.Equal(t, Default, Read(&l, "NET/GoSocket"))
	env["NCCL_GO_TIMEOUT"] = "20"
	assert.Equal(t, 20*time.Second, Read(&l, "NET/GoSocket"))
	env["NCCL_GO_TIMEOUT"] = "1500ms"
	assert.Equal(t, 1500*time.Millisecond, Read(&l, "NET/GoSocket"))
	env["NCCL_GO_TIMEOUT"] = "never"
	assert.Equal(t, Default, Read(&l, "NET/GoShm"))
	warns := l.Take()
	assert.Len(t, warns, 1)
	assert.Contains(t, warns[0], "NET/GoShm : ignoring NCCL_GO_TIMEOUT=never")
	assert.Equal(t, Default, Bound(0))
	assert.Equal(t, Default, Bound(-time.Second))
	assert.Equal(t, time.Second, Bound(time.Second))
}

func TestKeepAlive(t *testing.T) {
	k := KeepAlive(20 * time.Second)
	assert.True(t, k.Enable)
	assert.Equal(t, 10*time.Second, k.Idle)
	assert.Equal(t, 2*time.Second, k.Interval)
	assert.Equal(t, 5, k.Count)
	short := KeepAlive(500 * time.Millisecond)
	assert.Equal(t, time.Second, short.Idle, "probes are at least a second apart")
	assert.Equal(t, time.Second, short.Interval)
	long := KeepAlive(100 * time.Hour) // Linux refuses more than 32767 s for either
	assert.Equal(t, 32767*time.Second, long.Idle)
	assert.Equal(t, 32767*time.Second, long.Interval)
	assert.False(t, KeepAlive(0).Enable)
	assert.False(t, KeepAlive(-1).Enable)
}
