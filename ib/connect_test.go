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

// A handle from another plugin build or from the socket transport is a
// configuration mismatch between ranks, not a bug in the plugin: NCCL
// reports such mismatches as ncclInvalidUsage, and so does the socket
// transport for its own handles.
func TestHandleVersionMismatchIsInvalidUsage(t *testing.T) {
	setEnv(t)
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	_, h := listenOn(t, b, 0)
	h[hOffVersion] = handleVersion + 1
	sc, err := a.t.Connect(0, h, nccl.ConnectOptions{TrafficClass: nccl.TrafficClassUndef})
	require.Nil(t, sc)
	assert.Equal(t, nccl.InvalidUsage, nccl.ResultOf(err))
	assert.ErrorContains(t, err, "NET/GoIB : connect: handle version 2 is not 1")
	assert.ErrorContains(t, err, "NCCL_GO_TRANSPORT")

	// A corrupt handle of the right version stays an internal error.
	h[hOffVersion], h[hOffFamily] = handleVersion, 9
	_, err = a.t.Connect(0, h, nccl.ConnectOptions{TrafficClass: nccl.TrafficClassUndef})
	assert.Equal(t, nccl.InternalError, nccl.ResultOf(err))
}
