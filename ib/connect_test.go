package ib

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// A listener drops, without a word, a connection whose secret is not its
// own (a stale handle: its listen was closed and the port reused, or the
// handle belongs to another job). The connector then only sees EOF, and its
// error must say what that means rather than "hello reply: EOF".
func TestStaleHandleIsAClearError(t *testing.T) {
	setEnv(t)
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	_, h := listenOn(t, b, 0)
	h[hOffSecret] ^= 1
	var cerr error
	within(t, "connect fails", func() (bool, error) {
		var sc nccl.SendComm
		sc, cerr = a.t.Connect(0, h, nccl.ConnectOptions{TrafficClass: nccl.TrafficClassUndef})
		require.Nil(t, sc)
		return cerr != nil, nil
	})
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(cerr))
	assert.ErrorContains(t, cerr, "closed the connection without answering")
	assert.ErrorContains(t, cerr, "stale")
}
