package plugin

import (
	"bytes"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Regression tests of how NCCL really drives the glue (issue 9: forged
// requests, close and finalize at any moment, exhaustion; issue 12: request
// ids). They use only entry points and helpers that predate those fixes, so
// this file also runs against the old glue, where every test here fails.

// hookTransport is a fakeTransport whose connect, comms and finalize a test
// can replace.
type hookTransport struct {
	*fakeTransport
	newSend   func() nccl.SendComm
	onConnect func()
	inConnect atomic.Int32
	// finalizeDuringConnect counts Finalize calls made while a Connect call
	// was still inside the transport.
	finalizeDuringConnect atomic.Int32
	finalized             chan struct{}
}

func (h *hookTransport) Connect(dev int, hd *nccl.Handle, o nccl.ConnectOptions) (nccl.SendComm, error) {
	h.inConnect.Add(1)
	defer h.inConnect.Add(-1)
	if h.onConnect != nil {
		h.onConnect()
	}
	if h.newSend != nil {
		return h.newSend(), nil
	}
	return h.fakeTransport.Connect(dev, hd, o)
}

func (h *hookTransport) Finalize() error {
	if h.inConnect.Load() > 0 {
		h.finalizeDuringConnect.Add(1)
	}
	if h.finalized != nil {
		close(h.finalized)
	}
	return h.fakeTransport.Finalize()
}

var hookSeq atomic.Int32

// initHook registers h under a fresh name, forces it and runs init for API
// version (v11+ returns a context).
func initHook(t *testing.T, h *hookTransport, version int) (*captureSink, uintptr) {
	t.Helper()
	name := registerHook(t, h)
	h.name = name
	sink := setup(t, map[string]string{"NCCL_GO_TRANSPORT": name})
	ctx, res := netInit(version, version >= 11, -1)
	require.Equal(t, nccl.Success, res)
	return sink, ctx
}

// registerHook registers tr under a fresh name for the test's duration.
func registerHook(t *testing.T, tr nccl.Transport) string {
	name := fmt.Sprintf("hook-%d", hookSeq.Add(1))
	nccl.Register(name, 7000+int(hookSeq.Load()), func() nccl.Transport { return tr })
	t.Cleanup(func() { nccl.Unregister(name) })
	return name
}

// acceptOnHook forces h (v10 init) and returns a listen comm and the recv
// comm its listener's Accept hands out.
func acceptOnHook(t *testing.T, h *listenHook) (lh, rh uintptr) {
	t.Helper()
	setup(t, map[string]string{"NCCL_GO_TRANSPORT": registerHook(t, h)})
	_, res := netInit(10, false, -1)
	require.Equal(t, nccl.Success, res)
	var handle nccl.Handle
	lh, res = netListen(0, &handle)
	require.Equal(t, nccl.Success, res)
	rh, res = netAccept(lh)
	require.Equal(t, nccl.Success, res)
	return lh, rh
}

// unboundedSend accepts every send (never NoRequest) and numbers requests
// from base upwards; Test completes them at once.
type unboundedSend struct {
	fakeSend
	base  nccl.Request
	n     nccl.Request
	sizes map[nccl.Request]int
}

func (s *unboundedSend) Isend(_ unsafe.Pointer, size, _ int, _ nccl.MemHandle) (nccl.Request, error) {
	id := s.base + s.n
	s.n++
	s.sizes[id] = size
	return id, nil
}

func (s *unboundedSend) Test(r nccl.Request) (bool, int, error) {
	size, ok := s.sizes[r]
	if !ok {
		return false, 0, fmt.Errorf("test of request %d the transport never returned", r)
	}
	delete(s.sizes, r)
	return true, size, nil
}

func connectUnbounded(t *testing.T, base nccl.Request) (*unboundedSend, uintptr) {
	t.Helper()
	s := &unboundedSend{base: base, sizes: map[nccl.Request]int{}}
	h := &hookTransport{fakeTransport: &fakeTransport{name: "unbounded", devs: 1}, newSend: func() nccl.SendComm { return s }}
	initHook(t, h, 10)
	var handle nccl.Handle
	sh, res := netConnect(0, -1, &handle)
	require.Equal(t, nccl.Success, res)
	require.NotZero(t, sh)
	t.Cleanup(func() { netClose(sh, tagSend) })
	return s, sh
}

// A transport may number its requests with any non-negative int32: the glue
// keeps its own per-comm request slots.
func TestTransportMayUseAnyNonNegativeRequestID(t *testing.T) {
	_, sh := connectUnbounded(t, 1<<30)
	buf := make([]byte, 64)
	for round := 0; round < 3; round++ {
		var reqs []uintptr
		for i := 0; i < 20; i++ {
			req, res := netIsend(sh, unsafe.Pointer(&buf[0]), int64(i), 0, 7, 0)
			require.Equal(t, nccl.Success, res, "isend %d: a request id above 1023 is not an error", i)
			require.NotZero(t, req)
			reqs = append(reqs, req)
		}
		for i, req := range reqs {
			var sz int32 = -1
			done, res := netTest(req, &sz)
			require.Equal(t, nccl.Success, res)
			require.True(t, done)
			assert.EqualValues(t, i, sz)
		}
	}
}

// Running out of request slots is a NULL request NCCL retries, at the glue as
// in the transports, never an error; completing requests frees slots again.
func TestGlueExhaustionIsNullNotError(t *testing.T) {
	s, sh := connectUnbounded(t, 0)
	buf := make([]byte, 8)
	var reqs []uintptr
	nulls := 0
	for i := 0; i < 5000; i++ {
		req, res := netIsend(sh, unsafe.Pointer(&buf[0]), 8, 0, 7, 0)
		require.Equal(t, nccl.Success, res, "isend %d with every request in flight must return NULL, not an error", i)
		if req == 0 {
			nulls++
			continue
		}
		reqs = append(reqs, req)
	}
	assert.Greater(t, nulls, 0, "5000 sends never tested cannot all be in flight")
	assert.GreaterOrEqual(t, len(reqs), nccl.MaxRequests, "NCCL_NET_MAX_REQUESTS requests per comm must fit")
	assert.EqualValues(t, len(reqs), s.n, "a NULL request must not leave a transport request behind")
	for _, req := range reqs {
		done, res := netTest(req, nil)
		require.Equal(t, nccl.Success, res)
		require.True(t, done)
	}
	req, res := netIsend(sh, unsafe.Pointer(&buf[0]), 8, 0, 7, 0)
	require.Equal(t, nccl.Success, res)
	assert.NotZero(t, req, "completed requests free their slots")
	_, res = netTest(req, nil)
	assert.Equal(t, nccl.Success, res)
}

// Whatever NCCL hands test (a value that was never a request, NCCL's 0x1
// marker, a request handle with a slot beyond the comm's table), the answer is
// ncclInvalidArgument with a WARN, never a recovered panic.
func TestTestOnForgedRequestIsInvalidArgument(t *testing.T) {
	sink := initWith(t, &fakeTransport{name: "forge", devs: 1})
	_, _, sh, _ := connectPair(t)
	buf := make([]byte, 8)
	req, res := netIsend(sh, unsafe.Pointer(&buf[0]), 8, 0, 7, 0)
	require.Equal(t, nccl.Success, res)
	for _, forged := range []uintptr{req | 0x7fff, req&^0xffff | 0x7ff0, req ^ 1<<20, 0, 1, ^uintptr(0), 0x51 << 56} {
		var done bool
		before := len(sink.warns())
		panicked := func() (p any) {
			defer func() { p = recover() }()
			done, res = netTest(forged, nil)
			return nil
		}()
		require.Nil(t, panicked, "test(%#x) panicked", forged)
		assert.Equal(t, nccl.InvalidArgument, res, "test(%#x)", forged)
		assert.False(t, done)
		warns := sink.warns()
		if assert.Len(t, warns, before+1, "test(%#x): one WARN saying what was wrong", forged) {
			assert.Contains(t, warns[before], "test failed: ", "test(%#x)", forged)
			assert.Contains(t, warns[before], fmt.Sprintf("%#x", forged), "the WARN names the value NCCL passed")
			assert.NotContains(t, warns[before], "please report", "a bad argument from NCCL is not an internal error")
		}
	}
	var sz int32
	done, res := netTest(req, &sz)
	require.Equal(t, nccl.Success, res, "the real request is untouched")
	assert.True(t, done)
	assert.EqualValues(t, 8, sz)
}

// goid is the running goroutine's id, from its stack header.
func goid() string {
	b := make([]byte, 64)
	b = b[:runtime.Stack(b, false)]
	f := bytes.Fields(b)
	if len(f) < 2 {
		return ""
	}
	return string(f[1])
}

type goroutineRecvComm struct {
	fakeRecv
	closedOn string
}

func (r *goroutineRecvComm) Close() error {
	r.closedOn = goid()
	return nil
}

type goroutineListener struct{ c *goroutineRecvComm }

func (l goroutineListener) Accept() (nccl.RecvComm, error) { return l.c, nil }
func (l goroutineListener) Close() error                   { return nil }

type listenHook struct {
	*hookTransport
	l nccl.Listener
}

func (h *listenHook) Listen(int, *nccl.Handle) (nccl.Listener, error) { return h.l, nil }

// close runs the transport's Close on the caller's thread and returns after
// it: NCCL frees what the comm still used as soon as close returns, so a Close left
// running on a goroutine could touch freed memory.
func TestCloseRunsTransportCloseOnCallersThread(t *testing.T) {
	rc := &goroutineRecvComm{}
	h := &listenHook{hookTransport: &hookTransport{fakeTransport: &fakeTransport{name: "closer", devs: 1}}, l: goroutineListener{c: rc}}
	lh, rh := acceptOnHook(t, h)
	require.Equal(t, nccl.Success, netClose(lh, tagListen))
	require.Equal(t, nccl.Success, netClose(rh, tagRecv))
	assert.Equal(t, goid(), rc.closedOn, "Close must run on the goroutine (thread) that called close")
}

// The last finalize must not end the transport while another NCCL thread is
// inside a set-up call of it (ncclCommAbort racing connection set-up).
func TestFinalizeWaitsForSetupCallsInsideTheTransport(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := &hookTransport{fakeTransport: &fakeTransport{name: "slowconnect", devs: 1}, finalized: make(chan struct{})}
	h.onConnect = func() {
		once.Do(func() { close(entered) })
		<-release
	}
	_, ctx := initHook(t, h, 11)
	connected := make(chan nccl.Result, 1)
	go func() {
		var handle nccl.Handle
		_, res := netConnect(0, -1, &handle)
		connected <- res
	}()
	<-entered
	finalized := make(chan nccl.Result, 1)
	go func() { finalized <- netFinalize(ctx) }()
	// Finalize may not reach the transport while Connect is inside it. The
	// only way to see that it does not is to give it the chance.
	select {
	case <-h.finalized:
		t.Errorf("transport finalized while a connect call was still inside it")
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	assert.Equal(t, nccl.Success, <-connected)
	assert.Equal(t, nccl.Success, <-finalized)
	<-h.finalized
	assert.Zero(t, h.finalizeDuringConnect.Load(), "Finalize ran concurrently with Connect")
}

// v11+: a finalize that finds comms still open (ncclCommAbort) leaves the
// transport to the last close, which finalizes it; nothing is leaked.
func TestLastCloseAfterFinalizeEndsTheTransport(t *testing.T) {
	f := &fakeTransport{name: "late", devs: 1}
	h := &hookTransport{fakeTransport: f}
	_, ctx := initHook(t, h, 12)
	_, _, sh, rh := connectPair(t)
	require.Equal(t, nccl.Success, netFinalize(ctx))
	assert.Equal(t, 0, f.finals, "comms are open: the transport must live on")
	require.Equal(t, nccl.Success, netClose(sh, tagSend))
	assert.Equal(t, 0, f.finals)
	require.Equal(t, nccl.Success, netClose(rh, tagRecv))
	assert.Equal(t, 1, f.finals, "the last close after the last finalize ends the transport")
	ctx2, res := netInit(12, true, -1)
	require.Equal(t, nccl.Success, res)
	assert.Equal(t, 2, f.inits, "a later communicator starts it again")
	require.Equal(t, nccl.Success, netFinalize(ctx2))
	assert.Equal(t, 2, f.finals)
}

// A stale v11 context (finalized, its slot reused by another communicator)
// must not finalize the communicator that now holds the slot.
func TestFinalizeOfStaleContextLeavesTheNewOneAlone(t *testing.T) {
	f := &fakeTransport{name: "stalectx", devs: 1}
	_, c1 := initHook(t, &hookTransport{fakeTransport: f}, 11)
	keep, res := netInit(11, true, -1) // keeps the transport up
	require.Equal(t, nccl.Success, res)
	require.Equal(t, nccl.Success, netFinalize(c1))
	c2, res := netInit(11, true, 5)
	require.Equal(t, nccl.Success, res)
	assert.NotEqual(t, nccl.Success, netFinalize(c1), "a finalized context is stale, whatever reuses its slot")
	tc, err := trafficClassOf(c2)
	require.NoError(t, err, "the new context must survive")
	assert.Equal(t, 5, tc)
	require.Equal(t, nccl.Success, netFinalize(c2))
	require.Equal(t, nccl.Success, netFinalize(keep))
	assert.Equal(t, 1, f.finals)
}

// A comm closed while NCCL still holds its handles, whose slot a new comm then
// takes, must not reach the new comm through the old comm or request handles.
func TestHandlesOfAClosedCommDoNotReachItsSlotsNextComm(t *testing.T) {
	initWith(t, &fakeTransport{name: "reuse", devs: 1})
	oldSend, _, oldSH, _ := connectPair(t)
	buf := make([]byte, 8)
	oldReq, res := netIsend(oldSH, unsafe.Pointer(&buf[0]), 8, 0, 7, 0)
	require.Equal(t, nccl.Success, res)
	oldSlot := oldSend.slot
	require.Equal(t, nccl.Success, netClose(oldSH, tagSend))

	var handle nccl.Handle
	handle[0] = 1 // the fake connects at once
	newSH, res := netConnect(0, -1, &handle)
	require.Equal(t, nccl.Success, res)
	newSend, err := lookup(newSH, tagSend)
	require.NoError(t, err)
	require.Equal(t, oldSlot, newSend.slot, "the freed slot is reused")
	req, res := netIsend(newSH, unsafe.Pointer(&buf[0]), 8, 0, 7, 0)
	require.Equal(t, nccl.Success, res)

	_, res = netIsend(oldSH, unsafe.Pointer(&buf[0]), 8, 0, 7, 0)
	assert.Equal(t, nccl.InvalidArgument, res, "the closed comm's handle")
	_, res = netTest(oldReq, nil)
	assert.Equal(t, nccl.InvalidArgument, res, "the closed comm's request")
	done, res := netTest(req, nil)
	assert.Equal(t, nccl.Success, res, "the new comm is untouched")
	assert.True(t, done)
}

// fuseTransport is a fresh transport per New(), as ib is: two physical
// devices, and makeVDevice appends a virtual one.
type fuseTransport struct {
	fakeTransport
	vdevs int
}

func (f *fuseTransport) Devices() int { return 2 + f.vdevs }
func (f *fuseTransport) MakeVDevice([]int) (int, error) {
	f.vdevs++
	return 1 + f.vdevs, nil
}

func registerFuse(t *testing.T) string {
	regSeq++
	name := fmt.Sprintf("fuse-%d", regSeq)
	nccl.Register(name, 3000+regSeq, func() nccl.Transport {
		return &fuseTransport{fakeTransport: fakeTransport{name: name, devs: 2}}
	})
	t.Cleanup(func() { nccl.Unregister(name) })
	return name
}

// With NCCL_NET_PLUGIN_REF_COUNT > 0 NCCL never unloads the plugin: it calls
// devices and fuses NICs at the first communicator only ("Virtual devices
// are only created once per network", graph/topo.cc) and asks every later
// one for the fused NIC by index. The transport must outlive the last
// finalize, or the next communicator's getProperties(2) fails.
func TestFusedNICSurvivesTheLastFinalizeWhenNCCLNeverUnloads(t *testing.T) {
	name := registerFuse(t)
	setup(t, map[string]string{"NCCL_GO_TRANSPORT": name, "NCCL_NET_PLUGIN_REF_COUNT": "1"})
	c1, res := netInit(12, true, -1)
	require.Equal(t, nccl.Success, res)
	n, _ := netDevices()
	require.Equal(t, 2, n)
	v, res := netMakeVDevice([]int{0, 1}, 8)
	require.Equal(t, nccl.Success, res)
	require.Equal(t, 2, v)
	require.Equal(t, nccl.Success, netFinalize(c1))
	c2, res := netInit(12, true, -1) // no devices() call: NCCL kept its counts
	require.Equal(t, nccl.Success, res)
	defer netFinalize(c2)
	_, res = netProperties(v)
	assert.Equal(t, nccl.Success, res, "fused NIC %d, which NCCL still uses, is gone", v)
}

// With the default NCCL_NET_PLUGIN_REF_COUNT (0) NCCL 2.28+ unloads the
// plugin at the last finalize and, on the next communicator, calls devices
// and fuses afresh, taking every index below the count as physical. A comm
// NCCL never closes (the listen comm of a connection whose set-up was
// aborted: recvProxyFree acts only on connected ones) must not keep the old
// transport, and its fused NIC, alive into that new load.
func TestCommLeftOpenDoesNotCarryFusedNICsIntoTheNextLoad(t *testing.T) {
	name := registerFuse(t)
	setup(t, map[string]string{"NCCL_GO_TRANSPORT": name})
	c1, res := netInit(12, true, -1)
	require.Equal(t, nccl.Success, res)
	var h nccl.Handle
	lh, res := netListen(0, &h)
	require.Equal(t, nccl.Success, res)
	_, res = netMakeVDevice([]int{0, 1}, 8)
	require.Equal(t, nccl.Success, res)
	require.Equal(t, nccl.Success, netFinalize(c1))
	c2, res := netInit(12, true, -1)
	require.Equal(t, nccl.Success, res)
	defer netFinalize(c2)
	n, _ := netDevices()
	assert.Equal(t, 2, n, "after a reload devices() must count the physical NICs only")
	assert.Zero(t, comms.Len(), "the previous load's listen comm must be closed")
	assert.Equal(t, nccl.Success, netClose(lh, tagListen), "a late closeListen of it succeeds")
	assert.NotEqual(t, nccl.Success, netClose(lh, tagListen), "once")
}

// NCCL closes a listen comm only after an accept on it succeeded; one whose
// connection set-up was aborted is left open when its communicator is
// finalized. That finalize closes it, even while another communicator keeps
// the transport up, and leaves the other communicator's listen comms alone.
func TestFinalizeClosesItsCommunicatorsListenComms(t *testing.T) {
	f := &fakeTransport{name: "listens", devs: 1}
	_, a := initHook(t, &hookTransport{fakeTransport: f}, 12)
	b, res := netInit(12, true, -1)
	require.Equal(t, nccl.Success, res)
	var h1, h2, h3 nccl.Handle
	la, res := netListenCtx(a, 0, &h1)
	require.Equal(t, nccl.Success, res)
	_, res = netListenCtx(b, 0, &h2)
	require.Equal(t, nccl.Success, res)
	lb2, res := netListenCtx(b, 0, &h3)
	require.Equal(t, nccl.Success, res)
	require.Equal(t, nccl.Success, netClose(lb2, tagListen)) // closed by NCCL itself: fine
	require.Equal(t, 2, comms.Len())

	require.Equal(t, nccl.Success, netFinalize(a))
	assert.Equal(t, 1, comms.Len(), "a's listen comm must be closed, b's kept")
	// An abort may finalize before its service thread closes what exists:
	// that closeListen still succeeds, once.
	assert.Equal(t, nccl.Success, netClose(la, tagListen), "closeListen after the finalize that closed it")
	assert.NotEqual(t, nccl.Success, netClose(la, tagListen), "a second closeListen of the same handle")
	assert.Equal(t, 0, f.finals, "b keeps the transport up")

	require.Equal(t, nccl.Success, netFinalize(b))
	assert.Zero(t, comms.Len())
	assert.Equal(t, 1, f.finals, "with every listen comm closed, the last finalize ends the transport")

	_, res = netListenCtx(a, 0, &h1)
	assert.NotEqual(t, nccl.Success, res, "listen under a finalized context is refused")
}

// memberTransport fuses like ib: a virtual device's members are the
// physical devices of every device it was made from, and its Properties
// list them.
type memberTransport struct {
	fakeTransport
	vdevs [][]int
}

func (m *memberTransport) Devices() int { return m.devs + len(m.vdevs) }
func (m *memberTransport) members(d int) []int {
	if d < m.devs {
		return []int{d}
	}
	return m.vdevs[d-m.devs]
}
func (m *memberTransport) Properties(dev int) (nccl.Properties, error) {
	p, err := m.fakeTransport.Properties(dev)
	p.VDevs = m.members(dev)
	return p, err
}
func (m *memberTransport) MakeVDevice(devs []int) (int, error) {
	var all []int
	for _, d := range devs {
		all = append(all, m.members(d)...)
	}
	m.vdevs = append(m.vdevs, all)
	return m.devs + len(m.vdevs) - 1, nil
}

// TestFusingFusedDevicesKeepsTheVersionsMemberLimit: NCCL's vProps holds 4
// members below API v12 (8 from v12). Fusing a fused device with more
// devices passed the glue's check, which counted the indices NCCL passed,
// not the members: the transport made a 6-member device whose properties
// NCCL then read cut to 4, a NIC that is not the one it uses.
func TestFusingFusedDevicesKeepsTheVersionsMemberLimit(t *testing.T) {
	regSeq++
	name := fmt.Sprintf("members-%d", regSeq)
	mt := &memberTransport{fakeTransport: fakeTransport{name: name, devs: 8}}
	nccl.Register(name, 3000+regSeq, func() nccl.Transport { return mt })
	t.Cleanup(func() { nccl.Unregister(name) })
	setup(t, map[string]string{"NCCL_GO_TRANSPORT": name})
	c, res := netInit(10, true, -1)
	require.Equal(t, nccl.Success, res)
	defer netFinalize(c)
	v, res := netMakeVDevice([]int{0, 1, 2}, 4)
	require.Equal(t, nccl.Success, res)
	_, res = netMakeVDevice([]int{v, 3, 4}, 4) // 5 members
	assert.Equal(t, nccl.InvalidUsage, res)
	assert.Len(t, mt.vdevs, 1, "the transport made a device the API version cannot describe")
	w, res := netMakeVDevice([]int{v, 3}, 4) // 4 members
	require.Equal(t, nccl.Success, res)
	p, res := netProperties(w)
	require.Equal(t, nccl.Success, res)
	assert.Equal(t, []int{0, 1, 2, 3}, p.VDevs)
	_, res = netMakeVDevice([]int{v, 3, 4, 5, 6}, 8) // v12: 7 members
	assert.Equal(t, nccl.Success, res)
}
