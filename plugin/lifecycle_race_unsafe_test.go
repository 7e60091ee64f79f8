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

// gatedListen tells the test when a listen has entered the transport, and
// with a release channel holds it there until the test lets it go.
type gatedListen struct {
	*hookTransport
	entered, release chan struct{} // release nil: do not wait
}

func (s *gatedListen) Listen(dev int, h *nccl.Handle) (nccl.Listener, error) {
	s.entered <- struct{}{}
	if s.release != nil {
		<-s.release
	}
	return s.hookTransport.Listen(dev, h)
}

// finalize(ctx) racing a listen under ctx on the service thread.
func TestListenRacingItsContextsFinalizeLeavesNothingOpen(t *testing.T) {
	s := &gatedListen{hookTransport: &hookTransport{fakeTransport: &fakeTransport{name: "slowlisten", devs: 1}},
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

// From the re-review: a listen racing its context's finalize, with and
// without hooks, and the restart's early return.

// No hooks: listen under a racing finalize(a), repeated; -race reports
// finalizeListens reading e.slot/e.gen that register writes after comms.Add.
func TestListenAndItsContextsFinalizeRaceCleanly(t *testing.T) {
	s := &gatedListen{hookTransport: &hookTransport{fakeTransport: &fakeTransport{name: "rv2race", devs: 1}}, entered: make(chan struct{})}
	setup(t, map[string]string{"NCCL_GO_TRANSPORT": registerHook(t, s)})
	b, res := netInit(12, true, -1)
	require.Equal(t, nccl.Success, res)
	for i := 0; i < 300; i++ {
		a, res := netInit(12, true, -1)
		require.Equal(t, nccl.Success, res)
		got := make(chan uintptr, 1)
		go func() {
			var h nccl.Handle
			lh, _ := netListenCtx(a, 0, &h)
			got <- lh
		}()
		<-s.entered
		require.Equal(t, nccl.Success, netFinalize(a))
		if lh := <-got; lh != 0 {
			// listen returned before finalize's remove: finalize closed it
			_, err := lookup(lh, tagListen)
			assert.Error(t, err)
		}
		require.Zero(t, comms.Len(), "iteration %d", i)
	}
	netFinalize(b)
}

// Hooks: a listen that passed its first check, then the last finalize
// (comm X open -> finalizePending), then X's close while the listen's entry
// is registered, then the listen's re-check removes it: nobody ends the
// transport.
func TestListenWithdrawnAfterTheLastFinalizeEndsTheTransport(t *testing.T) {
	f := &fakeTransport{name: "rv2pend", devs: 1}
	_, a := initHook(t, &hookTransport{fakeTransport: f}, 12)
	_, _, sh, rh := connectPair(t)
	require.Equal(t, nccl.Success, netClose(rh, tagRecv))
	checked, goOn := make(chan struct{}), make(chan struct{})
	listenStep.Set(t, func(step string) {
		switch step {
		case "checked":
			close(checked)
			<-goOn
		case "registered":
			done := make(chan nccl.Result)
			go func() { done <- netClose(sh, tagSend) }() // service thread's late closeSend
			assert.Equal(t, nccl.Success, <-done)
		}
	})
	got := make(chan nccl.Result, 1)
	go func() {
		var h nccl.Handle
		_, r := netListenCtx(a, 0, &h)
		got <- r
	}()
	<-checked
	require.Equal(t, nccl.Success, netFinalize(a)) // last context; X open
	require.True(t, state.finalizePending.Load())
	close(goOn)
	assert.NotEqual(t, nccl.Success, <-got)
	assert.Zero(t, comms.Len())
	assert.Zero(t, state.ctxRefs.Load())
	assert.False(t, state.ready, "no comm and no context left, but the transport was never finalized (finalizePending=%v)", state.finalizePending.Load())
	assert.Equal(t, 1, f.finals)
}

func TestRestartKeepsTheTransportForOpenDataCommsThenEndsIt(t *testing.T) {
	f := &fakeTransport{name: "rv2restart", devs: 1}
	_, ctx := initHook(t, &hookTransport{fakeTransport: f}, 12)
	_, _, sh, rh := connectPair(t)
	var hl nccl.Handle
	_, res := netListen(0, &hl) // ctx-less leftover listen
	require.Equal(t, nccl.Success, res)
	require.Equal(t, nccl.Success, netFinalize(ctx))
	require.True(t, state.finalizePending.Load())
	ctx2, res := netInit(12, true, -1)
	require.Equal(t, nccl.Success, res)
	assert.Equal(t, 2, comms.Len(), "listen closed, data comms kept")
	assert.Equal(t, 0, f.finals)
	require.Equal(t, nccl.Success, netClose(sh, tagSend))
	require.Equal(t, nccl.Success, netClose(rh, tagRecv))
	assert.Equal(t, 0, f.finals, "ctx2 alive")
	require.Equal(t, nccl.Success, netFinalize(ctx2))
	assert.Equal(t, 1, f.finals)
	assert.False(t, state.ready)
}
