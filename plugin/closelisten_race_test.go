package plugin

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// gatedCloseListener's Close tells the test it was entered and waits for a
// release (a listener whose Close takes a while: ib's handshake listener).
type gatedCloseListener struct {
	entered, release chan struct{}
}

func (l *gatedCloseListener) Accept() (nccl.RecvComm, error) { return nil, nil }
func (l *gatedCloseListener) Close() error {
	l.entered <- struct{}{}
	<-l.release
	return nil
}

// An abort that finalizes on the app thread while its service thread sends
// closeListen for the same (never accepted) listen comm: the docs promise
// that closeListen succeeds, once. While finalize's sweep is inside the
// transport's Close, the handle is neither in the table nor yet in
// closedListens, so closeListen gets ncclInvalidArgument.
func TestCloseListenDuringFinalizeSweepSucceeds(t *testing.T) {
	gl := &gatedCloseListener{entered: make(chan struct{}), release: make(chan struct{})}
	h := &listenHook{hookTransport: &hookTransport{fakeTransport: &fakeTransport{name: "sweeprace", devs: 1}}, l: gl}
	setup(t, map[string]string{"NCCL_GO_TRANSPORT": registerHook(t, h)})
	keep, res := netInit(12, true, -1) // another communicator keeps the transport up
	require.Equal(t, nccl.Success, res)
	a, res := netInit(12, true, -1)
	require.Equal(t, nccl.Success, res)
	var hd nccl.Handle
	lh, res := netListenCtx(a, 0, &hd)
	require.Equal(t, nccl.Success, res)
	fin := make(chan nccl.Result, 1)
	go func() { fin <- netFinalize(a) }() // app thread: ncclCommAbort
	<-gl.entered                          // finalize's sweep is closing lh
	closed := make(chan nccl.Result, 1)
	go func() { closed <- netClose(lh, tagListen) }() // service thread
	var got nccl.Result
	select {
	case got = <-closed:
	case <-time.After(2 * time.Second):
		t.Fatal("closeListen blocked behind finalize's sweep")
	}
	close(gl.release)
	require.Equal(t, nccl.Success, <-fin)
	assert.Equal(t, nccl.Success, got, "closeListen racing the finalize that closes it")
	require.Equal(t, nccl.Success, netFinalize(keep))
}
