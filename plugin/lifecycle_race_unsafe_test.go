package plugin

import (
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// The three tests below come from a review of the restart and of finalize's
// sweep of its listen comms: the first version closed comms another thread
// still used (a data race under -race) and lost a listen racing its
// context's finalize.

// The model of TestLastCloseAfterFinalizeEndsTheTransport (NCCL closes after
// the last finalize), with another communicator's init in between.
func TestInitBetweenFinalizeAndLateCloseKeepsTheOpenComms(t *testing.T) {
	f := &fakeTransport{name: "late2", devs: 1}
	_, ctx := initHook(t, &hookTransport{fakeTransport: f}, 12)
	_, _, sh, rh := connectPair(t)
	require.Equal(t, nccl.Success, netFinalize(ctx))
	ctx2, res := netInit(12, true, -1) // another app thread: a new communicator
	require.Equal(t, nccl.Success, res)
	defer netFinalize(ctx2)
	assert.Equal(t, nccl.Success, netClose(sh, tagSend), "service thread's late closeSend")
	assert.Equal(t, nccl.Success, netClose(rh, tagRecv), "service thread's late closeRecv")
}

// A progress thread still moving data on comm A (abort: finalize may come
// "at any moment ... with requests in flight") while another thread inits.
func TestInitDoesNotCloseCommsAnotherThreadStillUses(t *testing.T) {
	f := &fakeTransport{name: "late3", devs: 1}
	_, ctx := initHook(t, &hookTransport{fakeTransport: f}, 12)
	_, _, sh, _ := connectPair(t)
	var stop atomic.Bool
	var errs atomic.Int32
	var iters atomic.Int64
	done := make(chan struct{})
	go func() { // progress thread of A
		defer close(done)
		buf := make([]byte, 8)
		for !stop.Load() {
			iters.Add(1)
			req, res := netIsend(sh, unsafe.Pointer(&buf[0]), 8, 0, 7, 0)
			if res != nccl.Success {
				errs.Add(1)
				return
			}
			if req == 0 {
				continue
			}
			if _, res := netTest(req, nil); res != nccl.Success {
				errs.Add(1)
				return
			}
		}
	}()
	for iters.Load() < 1000 {
	}
	require.Equal(t, nccl.Success, netFinalize(ctx)) // A's app thread (abort)
	ctx2, res := netInit(12, true, -1)               // B's app thread
	require.Equal(t, nccl.Success, res)
	stop.Store(true)
	<-done
	assert.Zero(t, errs.Load(), "A's progress thread got errors: its comm was closed under it by B's init")
	netFinalize(ctx2)
}

type slowListen struct {
	*hookTransport
	entered, release chan struct{}
}

func (s *slowListen) Listen(dev int, h *nccl.Handle) (nccl.Listener, error) {
	close(s.entered)
	<-s.release
	return s.hookTransport.Listen(dev, h)
}

// finalize(ctx) racing a listen under ctx on the service thread.
func TestListenRacingItsContextsFinalizeLeavesNothingOpen(t *testing.T) {
	s := &slowListen{hookTransport: &hookTransport{fakeTransport: &fakeTransport{name: "slowlisten", devs: 1}},
		entered: make(chan struct{}), release: make(chan struct{})}
	setup(t, map[string]string{"NCCL_GO_TRANSPORT": registerHook(t, s)})
	a, res := netInit(12, true, -1)
	require.Equal(t, nccl.Success, res)
	b, res := netInit(12, true, -1) // another communicator keeps the transport up
	require.Equal(t, nccl.Success, res)
	got := make(chan nccl.Result, 1)
	go func() {
		var h nccl.Handle
		_, r := netListenCtx(a, 0, &h)
		got <- r
	}()
	<-s.entered
	require.Equal(t, nccl.Success, netFinalize(a))
	close(s.release)
	assert.NotEqual(t, nccl.Success, <-got, "the listen's context was finalized meanwhile")
	assert.Zero(t, comms.Len(), "a listen comm of finalized context a is left open (nobody will close it)")
	netFinalize(b)
}
