package plugin

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"math/bits"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/internal/slots"
	"github.com/libnccl-net-go/libnccl-net-go/metrics"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// fakeTransport completes sends immediately and receives after complete() is
// called; it records what the glue asked of it.
type fakeTransport struct {
	name      string
	initErr   error
	devs      int
	inits     int
	finals    int
	props     nccl.Properties
	panicTest bool
}

func (f *fakeTransport) Name() string { return f.name }
func (f *fakeTransport) Init(nccl.InitContext) error {
	f.inits++
	return f.initErr
}
func (f *fakeTransport) Devices() int { return f.devs }
func (f *fakeTransport) Properties(dev int) (nccl.Properties, error) {
	p := f.props
	if p.Name == "" {
		p.Name = fmt.Sprintf("fake%d", dev)
	}
	return p, nil
}
func (f *fakeTransport) Listen(dev int, h *nccl.Handle) (nccl.Listener, error) {
	return &fakeListener{t: f}, nil
}
func (f *fakeTransport) Connect(dev int, h *nccl.Handle, o nccl.ConnectOptions) (nccl.SendComm, error) {
	if h[0] == 0 { // first call: "in progress", as a real transport may answer
		h[0] = 1
		return nil, nil
	}
	return &fakeSend{t: f}, nil
}
func (f *fakeTransport) Finalize() error { f.finals++; return nil }

type fakeListener struct{ t *fakeTransport }

func (l *fakeListener) Accept() (nccl.RecvComm, error) { return &fakeRecv{t: l.t}, nil }
func (l *fakeListener) Close() error                   { return nil }

type fakeSend struct {
	t      *fakeTransport
	next   nccl.Request
	sizes  [32]int
	retry  bool
	badID  bool
	closed bool
}

func (s *fakeSend) RegMr(unsafe.Pointer, int, nccl.PtrType) (nccl.MemHandle, error) { return 7, nil }
func (s *fakeSend) DeregMr(nccl.MemHandle) error                                    { return nil }
func (s *fakeSend) Close() error                                                    { s.closed = true; return nil }
func (s *fakeSend) PeerAddr() string                                                { return "10.0.0.2:1234" }
func (s *fakeSend) Isend(data unsafe.Pointer, size, tag int, mh nccl.MemHandle) (nccl.Request, error) {
	if s.retry {
		return nccl.NoRequest, nil
	}
	if s.badID {
		return -5, nil // negative and not NoRequest: a transport bug
	}
	id := s.next
	s.next = (s.next + 1) % 32
	s.sizes[id] = size
	return id, nil
}
func (s *fakeSend) Test(r nccl.Request) (bool, int, error) {
	if s.t.panicTest {
		panic("boom")
	}
	return true, s.sizes[r], nil
}

type fakeRecv struct {
	t       *fakeTransport
	next    nccl.Request
	done    bool
	fail    error
	posted  [128][]int
	flushes int
}

func (r *fakeRecv) RegMr(unsafe.Pointer, int, nccl.PtrType) (nccl.MemHandle, error) { return 9, nil }
func (r *fakeRecv) DeregMr(nccl.MemHandle) error                                    { return nil }
func (r *fakeRecv) Close() error                                                    { return nil }
func (r *fakeRecv) Irecv(bufs []nccl.RecvBuffer) (nccl.Request, error) {
	id := r.next
	r.next = (r.next + 1) % 32
	r.posted[id] = r.posted[id][:0]
	for _, b := range bufs {
		r.posted[id] = append(r.posted[id], b.Size/2) // "peer sent half of each buffer"
	}
	return id, nil
}
func (r *fakeRecv) Iflush(bufs []nccl.RecvBuffer) (nccl.Request, error) {
	r.flushes++
	if bufs[0].Size == 0 {
		return nccl.NoRequest, nil
	}
	return 100, nil
}
func (r *fakeRecv) Test(id nccl.Request, sizes []int) (bool, error) {
	if r.fail != nil {
		return false, r.fail
	}
	if !r.done {
		return false, nil
	}
	copy(sizes, r.posted[id])
	return true, nil
}

type captureSink struct {
	mu    sync.Mutex
	lines []string
}

func (c *captureSink) log(level int, _ uint64, msg string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lines = append(c.lines, fmt.Sprintf("%d %s", level, msg))
}

func (c *captureSink) warns() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var w []string
	for _, l := range c.lines {
		if strings.HasPrefix(l, "2 ") {
			w = append(w, l[2:])
		}
	}
	return w
}

var testRegs struct {
	sync.Mutex
	current map[string]*fakeTransport
}

// withTransports registers fakes under unique names (the registry is
// process-wide and refuses duplicates) and forces them via NCCL_GO_TRANSPORT or
// priority; it returns a cleanup that finalizes the glue.
func setup(t *testing.T, env map[string]string, fakes ...*fakeTransport) *captureSink {
	t.Helper()
	sink := &captureSink{}
	setSink(sink)
	ncclenv.SetLookup(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	t.Cleanup(func() {
		state.mu.Lock()
		state.ready, state.transport = false, nil
		state.ctxRefs.Store(0)
		state.finalizePending.Store(false)
		state.pinned.Store(false)
		state.neverUnloaded = false
		state.mu.Unlock()
		profiler.Store(nil)
		// Comms or contexts a test left open must not make a later test's
		// finalize keep its transport (go test -count=N, -shuffle).
		clearSlots(&comms)
		clearSlots(&ctxs)
		ncclenv.SetLookup(nil)
		currentSink.Store(nil)
	})
	return sink
}

// netListen is listen as a v10 NCCL calls it (no context).
func netListen(dev int, handle *nccl.Handle) (uintptr, nccl.Result) {
	return netListenCtx(0, dev, handle)
}

func clearSlots[T any](tab *slots.Table[T]) {
	tab.Range(func(r slots.Ref, _ *T) bool {
		tab.Remove(r)
		return true
	})
}

var regSeq int

func register(t testing.TB, f *fakeTransport, prio int) string {
	testRegs.Lock()
	defer testRegs.Unlock()
	regSeq++
	name := fmt.Sprintf("%s-%d", f.name, regSeq)
	f.name = name
	nccl.Register(name, prio, func() nccl.Transport { return f })
	t.Cleanup(func() { nccl.Unregister(name) })
	return name
}

func initWith(t *testing.T, f *fakeTransport) *captureSink {
	name := register(t, f, 1000+regSeq)
	sink := setup(t, map[string]string{"NCCL_GO_TRANSPORT": name, "NCCL_DEBUG": "INFO"})
	_, res := netInit(10, false, -1)
	require.Equal(t, nccl.Success, res)
	return sink
}

func TestHandlesAreNeverNullOrOneAndRoundTrip(t *testing.T) {
	for _, tag := range []uint8{tagSend, tagRecv, tagListen, tagCtx} {
		h := commHandle(tag, 1, 0)
		assert.Greater(t, uint64(h), uint64(1))
		gt, gg, gs := splitCommHandle(commHandle(tag, 0xdeadbeef, 0xabcde))
		assert.Equal(t, tag, gt)
		assert.Equal(t, uint32(0xdeadbeef), gg)
		assert.Equal(t, uint32(0xabcde), gs)
	}
	r := requestHandle(0x12345, 0xfedc, 0xabc, maxReqSlots-1)
	ok, g, s, gen, idx := splitRequestHandle(r)
	assert.True(t, ok)
	assert.Equal(t, uint32(0x2345), g)
	assert.Equal(t, uint32(0xfedc), s)
	assert.Equal(t, uint16(0xabc), gen)
	assert.Equal(t, maxReqSlots-1, idx)
	ok, _, _, _, _ = splitRequestHandle(1)
	assert.False(t, ok, "0x1 (NCCL's LL marker) must not decode as a request")
}

func TestInitOnceAndV11Refcount(t *testing.T) {
	f := &fakeTransport{name: "refc", devs: 1}
	name := register(t, f, 2000)
	setup(t, map[string]string{"NCCL_GO_TRANSPORT": name})
	c1, res := netInit(11, true, -1)
	require.Equal(t, nccl.Success, res)
	c2, res := netInit(11, true, 3)
	require.Equal(t, nccl.Success, res)
	assert.NotEqual(t, c1, c2)
	assert.Equal(t, 1, f.inits, "real set-up runs once")
	tc, err := trafficClassOf(c2)
	require.NoError(t, err)
	assert.Equal(t, 3, tc, "v11 config travels with the context")
	require.Equal(t, nccl.Success, netFinalize(c1))
	assert.Equal(t, 0, f.finals, "still one communicator")
	assert.Equal(t, nccl.InvalidArgument, netFinalize(c1), "finalize twice is caught")
	require.Equal(t, nccl.Success, netFinalize(c2))
	assert.Equal(t, 1, f.finals)
	// NCCL 2.28+ "unloads" and loads again: init must work once more.
	c3, res := netInit(11, true, -1)
	require.Equal(t, nccl.Success, res)
	assert.Equal(t, 2, f.inits)
	require.Equal(t, nccl.Success, netFinalize(c3))
}

// The last finalize logs each device's traffic, unless NCCL_GO_METRICS=0
// turned counting off, when every figure would be a misleading 0.
func TestFinalizeSummaryOnlyWhenCounting(t *testing.T) {
	for _, c := range []struct {
		env  string
		want bool
	}{{"1", true}, {"0", false}} {
		f := &fakeTransport{name: "summary", devs: 1}
		name := register(t, f, 2000)
		sink := setup(t, map[string]string{"NCCL_GO_TRANSPORT": name, "NCCL_GO_METRICS": c.env, "NCCL_DEBUG": "INFO"})
		ctx, res := netInit(11, true, -1)
		require.Equal(t, nccl.Success, res)
		require.Equal(t, nccl.Success, netFinalize(ctx))
		sink.mu.Lock()
		summary := false
		for _, l := range sink.lines {
			summary = summary || strings.Contains(l, "messages, received")
		}
		sink.mu.Unlock()
		assert.Equal(t, c.want, summary, "NCCL_GO_METRICS=%s: per-device summary logged", c.env)
	}
}

func TestV10InitAgainWithoutFinalize(t *testing.T) {
	f := &fakeTransport{name: "v10", devs: 2}
	initWith(t, f)
	_, res := netInit(10, false, -1)
	require.Equal(t, nccl.Success, res)
	assert.Equal(t, 1, f.inits)
	n, res := netDevices()
	require.Equal(t, nccl.Success, res)
	assert.Equal(t, 2, n)
}

// Two NCCLs in one process, one using a v8-v10 table (no finalize) and one
// v11+: the newer one's last finalize must leave the transport to the older
// one, which never calls init again.
func TestV11FinalizeLeavesTheTransportToAV10User(t *testing.T) {
	f := &fakeTransport{name: "mixed", devs: 1}
	initWith(t, f) // v10
	ctx, res := netInit(12, true, -1)
	require.Equal(t, nccl.Success, res)
	require.Equal(t, nccl.Success, netFinalize(ctx))
	assert.Equal(t, 0, f.finals, "a v12 finalize ended the transport under the v10 user")
	n, res := netDevices()
	require.Equal(t, nccl.Success, res, "the v10 user's devices call after the v12 finalize")
	assert.Equal(t, 1, n)
	var handle nccl.Handle
	lc, res := netListen(0, &handle)
	require.Equal(t, nccl.Success, res, "the v10 user's listen after the v12 finalize")
	require.Equal(t, nccl.Success, netClose(lc, tagListen))
	assert.Equal(t, 0, f.finals, "closing the v10 user's last comm ended the transport")
	assert.Equal(t, 1, f.inits)
}

func TestFallbackToNextTransportOnNoDevice(t *testing.T) {
	ib := &fakeTransport{name: "noib", initErr: fmt.Errorf("%w: no RDMA port", nccl.ErrNoDevice)}
	sock := &fakeTransport{name: "sock", devs: 1}
	// Priorities below every other test's so these two are tried first.
	register(t, ib, -200)
	register(t, sock, -100)
	sink := setup(t, map[string]string{"NCCL_DEBUG": "INFO"})
	_, res := netInit(9, false, -1)
	require.Equal(t, nccl.Success, res)
	tr, err := acquire()
	require.NoError(t, err)
	state.mu.RUnlock()
	assert.Equal(t, sock.name, tr.Name())
	assert.Empty(t, sink.warns(), "missing RDMA is not a warning")
	joined := strings.Join(sink.lines, "\n")
	assert.Contains(t, joined, "transport "+sock.name)
	assert.Contains(t, joined, "NCCL net API v9", "the init INFO line names the API version")
}

func TestUnknownForcedTransportIsAClearError(t *testing.T) {
	register(t, &fakeTransport{name: "known", devs: 1}, 6000)
	sink := setup(t, map[string]string{"NCCL_GO_TRANSPORT": "nope"})
	_, res := netInit(10, false, -1)
	assert.Equal(t, nccl.InvalidArgument, res)
	require.NotEmpty(t, sink.warns())
	assert.Contains(t, sink.warns()[0], "NCCL_GO_TRANSPORT=nope")
}

func TestZeroDevicesFailsInit(t *testing.T) {
	f := &fakeTransport{name: "zero", devs: 0}
	name := register(t, f, 3000)
	setup(t, map[string]string{"NCCL_GO_TRANSPORT": name})
	_, res := netInit(10, false, -1)
	assert.Equal(t, nccl.SystemError, res, "NCCL must never see devices()==0 from an initialised plugin")
	assert.Equal(t, 1, f.finals)
}

func TestPropertiesAreMadeValid(t *testing.T) {
	initWith(t, &fakeTransport{name: "props", devs: 1})
	p, res := netProperties(0)
	require.Equal(t, nccl.Success, res)
	assert.EqualValues(t, nccl.MaxNetSizeBytes, p.MaxP2PBytes)
	assert.EqualValues(t, nccl.MaxCollSize, p.MaxCollBytes)
	assert.Equal(t, []int{0}, p.VDevs)
	assert.Equal(t, 1, p.MaxRecvs)
	assert.Equal(t, 1, p.MaxMultiRequestSize)
	assert.Equal(t, nccl.PtrHost, p.PtrSupport)
	_, res = netProperties(5)
	assert.Equal(t, nccl.InvalidArgument, res)
}

func TestMakeVDeviceWithoutFusion(t *testing.T) {
	initWith(t, &fakeTransport{name: "vdev", devs: 2})
	d, res := netMakeVDevice([]int{1}, 4)
	require.Equal(t, nccl.Success, res)
	assert.Equal(t, 1, d)
	_, res = netMakeVDevice([]int{0, 1}, 4)
	assert.Equal(t, nccl.InvalidUsage, res)
	_, res = netMakeVDevice([]int{0, 1, 0, 1, 0}, 4)
	assert.Equal(t, nccl.InvalidUsage, res)
}

func connectPair(t *testing.T) (send, recv *commEntry, sh, rh uintptr) {
	t.Helper()
	var handle nccl.Handle
	lh, res := netListen(0, &handle)
	require.Equal(t, nccl.Success, res)
	sh, res = netConnect(0, -1, &handle)
	require.Equal(t, nccl.Success, res)
	require.Zero(t, sh, "first connect call reports in-progress")
	sh, res = netConnect(0, -1, &handle)
	require.Equal(t, nccl.Success, res)
	require.NotZero(t, sh)
	rh, res = netAccept(lh)
	require.Equal(t, nccl.Success, res)
	require.Equal(t, nccl.Success, netClose(lh, tagListen))
	send, err := lookup(sh, tagSend)
	require.NoError(t, err)
	recv, err = lookup(rh, tagRecv)
	require.NoError(t, err)
	return send, recv, sh, rh
}

func TestDataPathCountsBytesAndWritesSizes(t *testing.T) {
	initWith(t, &fakeTransport{name: "data", devs: 1})
	send, recv, sh, rh := connectPair(t)
	m := send.m
	before := m.Snapshot()

	buf := make([]byte, 64)
	req, res := netIsend(sh, unsafe.Pointer(&buf[0]), 48, 3, 7, 0)
	require.Equal(t, nccl.Success, res)
	require.NotZero(t, req)
	var sz int32 = -1
	done, res := netTest(req, &sz)
	require.Equal(t, nccl.Success, res)
	require.True(t, done)
	assert.EqualValues(t, 48, sz)
	_, res = netTest(req, nil)
	assert.Equal(t, nccl.InvalidArgument, res, "testing a completed request again is caught")

	recv.bufs[0] = nccl.RecvBuffer{Data: unsafe.Pointer(&buf[0]), Size: 64, Tag: 3}
	recv.bufs[1] = nccl.RecvBuffer{Data: unsafe.Pointer(&buf[0]), Size: 20, Tag: 3}
	rreq, res := recv.irecv(2, nil)
	require.Equal(t, nccl.Success, res)
	sizes := [2]int32{-1, -1}
	done, res = netTest(rreq, &sizes[0])
	require.Equal(t, nccl.Success, res)
	assert.False(t, done)
	recv.recv.(*fakeRecv).done = true
	done, res = netTest(rreq, &sizes[0])
	require.Equal(t, nccl.Success, res)
	require.True(t, done)
	assert.Equal(t, [2]int32{32, 10}, sizes)

	after := m.Snapshot()
	assert.EqualValues(t, 48, after.Bytes[metrics.Send]-before.Bytes[metrics.Send])
	assert.EqualValues(t, 42, after.Bytes[metrics.Recv]-before.Bytes[metrics.Recv])
	assert.EqualValues(t, 0, after.Inflight[metrics.Send])
	assert.EqualValues(t, 0, after.Inflight[metrics.Recv])
	require.Equal(t, nccl.Success, netClose(sh, tagSend))
	require.Equal(t, nccl.Success, netClose(rh, tagRecv))
	_, res = netIsend(sh, nil, 0, 0, 0, 0)
	assert.Equal(t, nccl.InvalidArgument, res, "a closed comm's handle is rejected")
}

func TestRetryAndBadRequestIDs(t *testing.T) {
	initWith(t, &fakeTransport{name: "retry", devs: 1})
	send, _, sh, _ := connectPair(t)
	fs := send.send.(*fakeSend)
	fs.retry = true
	req, res := netIsend(sh, nil, 0, 0, 0, 0)
	assert.Equal(t, nccl.Success, res)
	assert.Zero(t, req, "NoRequest becomes a NULL request: NCCL retries")
	fs.retry, fs.badID = false, true
	_, res = netIsend(sh, nil, 0, 0, 0, 0)
	assert.Equal(t, nccl.InternalError, res)
	fs.badID = false
	_, res = netIsend(sh, nil, nccl.MaxNetSize+1, 0, 0, 0)
	assert.Equal(t, nccl.InvalidArgument, res)
}

func TestFailedRequestIsCountedAndWarned(t *testing.T) {
	sink := initWith(t, &fakeTransport{name: "fail", devs: 1})
	_, recv, _, _ := connectPair(t)
	recv.bufs[0] = nccl.RecvBuffer{Size: 8}
	rreq, res := recv.irecv(1, nil)
	require.Equal(t, nccl.Success, res)
	recv.recv.(*fakeRecv).fail = nccl.Errorf(nccl.SystemError, "connection reset by 10.0.0.9:5")
	before := recv.m.Snapshot()
	_, res = netTest(rreq, nil)
	assert.Equal(t, nccl.SystemError, res)
	after := recv.m.Snapshot()
	assert.EqualValues(t, 1, after.Errors[metrics.Recv][metrics.ErrSystem]-before.Errors[metrics.Recv][metrics.ErrSystem])
	require.NotEmpty(t, sink.warns())
	assert.Contains(t, sink.warns()[len(sink.warns())-1], "connection reset")
}

func TestFlushNullAndReal(t *testing.T) {
	initWith(t, &fakeTransport{name: "flush", devs: 1})
	_, recv, _, _ := connectPair(t)
	recv.bufs[0] = nccl.RecvBuffer{Size: 0}
	req, res := recv.iflush(1)
	require.Equal(t, nccl.Success, res)
	assert.Zero(t, req)
	recv.bufs[0] = nccl.RecvBuffer{Size: 10}
	req, res = recv.iflush(1)
	require.Equal(t, nccl.Success, res)
	require.NotZero(t, req)
	recv.recv.(*fakeRecv).done = true
	done, res := netTest(req, nil)
	require.Equal(t, nccl.Success, res)
	assert.True(t, done)
}

func TestStallWarnNamesPeerAndBacksOff(t *testing.T) {
	f := &fakeTransport{name: "stall", devs: 1}
	name := register(t, f, 4000)
	sink := setup(t, map[string]string{"NCCL_GO_TRANSPORT": name, "NCCL_GO_STALL_WARN": "0.02"})
	_, res := netInit(10, false, -1)
	require.Equal(t, nccl.Success, res)
	_, recv, _, _ := connectPair(t)
	recv.bufs[0] = nccl.RecvBuffer{Size: 4096}
	start := time.Now()
	rreq, res := recv.irecv(1, nil)
	require.Equal(t, nccl.Success, res)
	deadline := time.Now().Add(5 * time.Second)
	for len(sink.warns()) == 0 && time.Now().Before(deadline) {
		_, res = netTest(rreq, nil)
		require.Equal(t, nccl.Success, res)
	}
	require.NotEmpty(t, sink.warns(), "a stalled request must be reported")
	w := sink.warns()[0]
	assert.Contains(t, w, "recv request of 4096 bytes")
	assert.Contains(t, w, "fake0")
	assert.Contains(t, w, "NCCL_GO_STALL_WARN")
	for i := 0; i < 1000; i++ {
		netTest(rreq, nil)
	}
	assert.LessOrEqual(t, len(sink.warns()), stallWarnsWithin(time.Since(start), 20*time.Millisecond), "WARNs back off instead of flooding")
	assert.EqualValues(t, 1, recv.m.Snapshot().Stalls[metrics.Recv]-0, "counted once")
}

func TestCloseWithOutstandingRequestsSettlesInflight(t *testing.T) {
	initWith(t, &fakeTransport{name: "abort", devs: 1})
	_, recv, _, rh := connectPair(t)
	for i := 0; i < 5; i++ {
		recv.bufs[0] = nccl.RecvBuffer{Size: 8}
		_, res := recv.irecv(1, nil)
		require.Equal(t, nccl.Success, res)
	}
	assert.EqualValues(t, 5, recv.m.Snapshot().Inflight[metrics.Recv])
	require.Equal(t, nccl.Success, netClose(rh, tagRecv))
	assert.EqualValues(t, 0, recv.m.Snapshot().Inflight[metrics.Recv])
	assert.Equal(t, nccl.InvalidArgument, netClose(rh, tagRecv), "closing twice is caught")
}

// A panic in the transport, under an exported entry point, becomes
// ncclInternalError and a WARN with the stack (CONVENTIONS §3); it never
// unwinds into NCCL's C frames (here: never ends the test binary).
func TestPanicUnderAnExportIsInternalError(t *testing.T) {
	f := &fakeTransport{name: "panicexp", devs: 1}
	sink := initWith(t, f)
	_, _, sh, _ := connectPair(t)
	buf := make([]byte, 8)
	var req _Ctype_uintptr_t
	require.EqualValues(t, nccl.Success, goNetIsend(_Ctype_uintptr_t(sh), unsafe.Pointer(&buf[0]), 8, 1, 7, 0, &req))
	require.NotZero(t, req)
	f.panicTest = true
	t.Cleanup(func() { f.panicTest = false })
	before := len(sink.warns())
	done, size := _Ctype_int(7), _Ctype_int(-1)
	assert.EqualValues(t, nccl.InternalError, goNetTest(req, &done, &size))
	assert.Zero(t, done, "a failed test is not done")
	warns := sink.warns()
	require.Len(t, warns, before+1, "one WARN for the panic")
	assert.Contains(t, warns[before], "internal error in test: boom")
	assert.Contains(t, warns[before], "goroutine ", "the WARN carries the stack")
}

// Every exported function defers guard first, so that no panic, in the glue
// or in a transport, can cross into C. The tests above prove guard works for
// two entries; this keeps a new entry from forgetting it.
func TestEveryExportDefersGuardFirst(t *testing.T) {
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, "exports_cgo.go", nil, parser.ParseComments)
	require.NoError(t, err)
	exports := 0
	for _, d := range file.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Doc == nil || !hasExportDirective(fn.Doc) {
			continue
		}
		exports++
		require.NotEmpty(t, fn.Body.List, "%s has an empty body", fn.Name.Name)
		def, ok := fn.Body.List[0].(*ast.DeferStmt)
		if !ok {
			t.Errorf("%s (%s): first statement is not `defer guard(...)`", fn.Name.Name, fset.Position(fn.Pos()))
			continue
		}
		if id, ok := def.Call.Fun.(*ast.Ident); !ok || id.Name != "guard" {
			t.Errorf("%s (%s): first statement defers something other than guard", fn.Name.Name, fset.Position(fn.Pos()))
		}
	}
	assert.GreaterOrEqual(t, exports, 15, "found the //export functions")
}

func hasExportDirective(doc *ast.CommentGroup) bool {
	for _, c := range doc.List {
		if strings.HasPrefix(c.Text, "//export ") {
			return true
		}
	}
	return false
}

func TestDeregNullSucceeds(t *testing.T) {
	setup(t, nil)
	assert.Equal(t, nccl.Success, netDeregMr(0xdead, 0))
}

// BenchmarkIsendTest measures the glue's per-message cost (handle lookup,
// request table, metrics) around a transport that does nothing.
func BenchmarkIsendTest(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("metrics=%v", on), func(b *testing.B) {
			f := &fakeTransport{name: "bench", devs: 1}
			name := register(b, f, 5000+regSeq)
			ncclenv.SetLookup(func(k string) (string, bool) {
				if k == "NCCL_GO_TRANSPORT" {
					return name, true
				}
				return "", false
			})
			defer func() {
				state.mu.Lock()
				state.ready, state.transport = false, nil
				state.mu.Unlock()
				ncclenv.SetLookup(nil)
			}()
			if _, res := netInit(10, false, -1); res != nccl.Success {
				b.Fatal(res)
			}
			state.countMetrics = on
			var handle nccl.Handle
			handle[0] = 1
			sh, _ := netConnect(0, -1, &handle)
			buf := make([]byte, 8)
			var sz int32
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				req, res := netIsend(sh, unsafe.Pointer(&buf[0]), 8, 0, 7, 0)
				if res != nccl.Success {
					b.Fatal(res)
				}
				if done, res := netTest(req, &sz); !done || res != nccl.Success {
					b.Fatal(done, res)
				}
			}
			b.StopTimer()
			netClose(sh, tagSend)
		})
	}
}

// countingProfiler stands in for NCCL's profiler callback.
type countingProfiler struct{ starts, stops int }

func (p *countingProfiler) start(phandle uintptr, _ int, _ int, _ int64, _ int, _ uintptr) uintptr {
	p.starts++
	return uintptr(p.starts)
}
func (p *countingProfiler) stop(uintptr) { p.stops++ }

// The data path, with metrics, stall checks and profiler events on, never
// allocates (it runs millions of times a second on NCCL's progress thread).
func TestDataPathDoesNotAllocate(t *testing.T) {
	initWith(t, &fakeTransport{name: "noalloc", devs: 1, props: nccl.Properties{MaxRecvs: 2}})
	prof := &countingProfiler{}
	setProfiler(prof)
	send, recv, sh, _ := connectPair(t)
	require.NotNil(t, send.prof, "comms copy the profiler at connect/accept")
	recv.recv.(*fakeRecv).done = true
	buf := make([]byte, 64)
	var sizes [2]int32
	phs := []uintptr{0x10, 0x20}
	round := func() {
		req, res := netIsend(sh, unsafe.Pointer(&buf[0]), 48, 3, 7, 0x30)
		if res != nccl.Success || req == 0 {
			t.Fatalf("isend: %v %#x", res, req)
		}
		if done, res := netTest(req, &sizes[0]); !done || res != nccl.Success {
			t.Fatalf("test send: %v %v", done, res)
		}
		require.NoError(t, recv.checkRecvCount("irecv", 2))
		require.NoError(t, recv.setRecvBuf("irecv", 0, unsafe.Pointer(&buf[0]), 32, 1, 9))
		require.NoError(t, recv.setRecvBuf("irecv", 1, unsafe.Pointer(&buf[32]), 32, 1, 9))
		rreq, res := recv.irecv(2, phs)
		if res != nccl.Success || rreq == 0 {
			t.Fatalf("irecv: %v %#x", res, rreq)
		}
		if done, res := netTest(rreq, &sizes[0]); !done || res != nccl.Success {
			t.Fatalf("test recv: %v %v", done, res)
		}
	}
	for i := 0; i < 64; i++ { // the fake transport's own buffers settle
		round()
	}
	allocs := testing.AllocsPerRun(1000, round)
	assert.Zero(t, allocs, "isend+test and irecv+test allocate")
	assert.Equal(t, prof.starts, prof.stops, "every profiler event is stopped")
	assert.Equal(t, 3*(64+1001), prof.starts)
}

// init runs on application threads while other communicators move data; the
// profiler it installs must be published safely (go test -race catches a plain
// write here, as the C harness's concurrent mode did on a -race build).
func TestInitWhileCommsMoveDataIsRaceFree(t *testing.T) {
	_, ctx := initHook(t, &hookTransport{fakeTransport: &fakeTransport{name: "initrace", devs: 1}}, 12)
	setProfiler(&countingProfiler{})
	_, _, sh, _ := connectPair(t)
	stop := make(chan struct{})
	inits := make(chan error, 1)
	go func() {
		defer close(inits)
		for {
			select {
			case <-stop:
				return
			default:
			}
			setProfiler(&countingProfiler{}) // as goNetInit does with NCCL's callback
			c, res := netInit(12, true, -1)
			if res != nccl.Success {
				inits <- fmt.Errorf("init: %v", res)
				return
			}
			if res := netFinalize(c); res != nccl.Success {
				inits <- fmt.Errorf("finalize: %v", res)
				return
			}
		}
	}()
	buf := make([]byte, 8)
	for i := 0; i < 2000; i++ {
		req, res := netIsend(sh, unsafe.Pointer(&buf[0]), 8, 0, 7, 0x40)
		require.Equal(t, nccl.Success, res)
		done, res := netTest(req, nil)
		require.Equal(t, nccl.Success, res)
		require.True(t, done)
	}
	close(stop)
	assert.NoError(t, <-inits)
	require.Equal(t, nccl.Success, netFinalize(ctx))
}

// A slow transport Close is waited for and reported, naming the transport,
// the peer and the setting that bounds it.
func TestSlowCloseIsWaitedForAndWarned(t *testing.T) {
	sink := initWith(t, &fakeTransport{name: "slowclose", devs: 1})
	_, _, sh, rh := connectPair(t)
	require.Equal(t, nccl.Success, netClose(rh, tagRecv))
	assert.Empty(t, sink.warns(), "a prompt close says nothing")
	old := now
	t.Cleanup(func() { now = old })
	var clock int64
	now = func() int64 { clock += int64(2 * time.Second); return clock }
	require.Equal(t, nccl.Success, netClose(sh, tagSend))
	require.Len(t, sink.warns(), 1)
	w := sink.warns()[0]
	assert.Contains(t, w, "took 2.0s to close the send comm with 10.0.0.2:1234")
	assert.Contains(t, w, "NCCL_GO_TIMEOUT")
}

// n of a grouped receive is checked once, against the device's own maxRecvs
// (capped at what NCCL can pass), before the transport sees it.
func TestGroupedReceiveCheckedAgainstDeviceMaxRecvs(t *testing.T) {
	initWith(t, &fakeTransport{name: "maxrecvs", devs: 1, props: nccl.Properties{MaxRecvs: 4}})
	_, recv, _, _ := connectPair(t)
	assert.Equal(t, 4, recv.maxRecvs)
	for _, n := range []int{0, -1, 5, 65} {
		err := recv.checkRecvCount("irecv", n)
		require.Error(t, err, "n=%d", n)
		assert.Equal(t, nccl.InvalidArgument, nccl.ResultOf(err))
		assert.Contains(t, err.Error(), "takes 1 to 4 (its maxRecvs)")
	}
	assert.NoError(t, recv.checkRecvCount("irecv", 4))
	for _, size := range []int64{-1, nccl.MaxNetSize + 1} {
		err := recv.setRecvBuf("irecv", 0, nil, size, 0, 0)
		require.Error(t, err, "size %d", size)
		assert.Equal(t, nccl.InvalidArgument, nccl.ResultOf(err))
	}
	var one byte
	assert.NoError(t, recv.setRecvBuf("irecv", 3, unsafe.Pointer(&one), nccl.MaxNetSize, 0, 0))
	p, res := netProperties(0)
	require.Equal(t, nccl.Success, res)
	assert.Equal(t, 4, p.MaxRecvs)
}

func TestMaxRecvsCappedAtABILimit(t *testing.T) {
	initWith(t, &fakeTransport{name: "bigrecvs", devs: 1, props: nccl.Properties{MaxRecvs: 100}})
	_, recv, _, _ := connectPair(t)
	assert.Equal(t, maxABIRecvs, recv.maxRecvs)
	assert.Equal(t, maxReqSlots, len(recv.reqs.slots), "request slots grow with maxRecvs up to the handle's limit")
}

// Every entry that takes a handle answers a forged, closed or wrong-kind one
// with ncclInvalidArgument, never a panic or another comm's data.
func TestForgedHandlesAreInvalidArgumentEverywhere(t *testing.T) {
	sink := initWith(t, &fakeTransport{name: "forgeall", devs: 1})
	_, _, sh, rh := connectPair(t)
	closed := sh
	_, _, sh, _ = connectPair(t)
	require.Equal(t, nccl.Success, netClose(closed, tagSend))
	forged := []uintptr{0, 1, closed, rh ^ 1<<30, ^uintptr(0), commHandle(tagSend, 1, maxSlots+3)}
	before := len(sink.warns())
	for _, h := range forged {
		_, res := netIsend(h, nil, 0, 0, 0, 0)
		assert.Equal(t, nccl.InvalidArgument, res, "isend(%#x)", h)
		_, res = netRegMr(h, nil, 8, int(nccl.PtrHost))
		assert.Equal(t, nccl.InvalidArgument, res, "regMr(%#x)", h)
		assert.Equal(t, nccl.InvalidArgument, netDeregMr(h, 7), "deregMr(%#x)", h)
		_, res = netAccept(h)
		assert.Equal(t, nccl.InvalidArgument, res, "accept(%#x)", h)
		assert.Equal(t, nccl.InvalidArgument, netClose(h, tagSend), "closeSend(%#x)", h)
		assert.Equal(t, nccl.InvalidArgument, netClose(h, tagListen), "closeListen(%#x)", h)
		assert.Equal(t, nccl.InvalidArgument, netFinalize(h), "finalize(%#x)", h)
		_, err := trafficClassOf(h | 1)
		assert.Error(t, err)
	}
	warns := sink.warns()[before:]
	assert.Len(t, warns, 7*len(forged), "one WARN per refused call")
	for _, w := range warns {
		assert.NotContains(t, w, "please report", "a bad argument from NCCL is not an internal error")
	}
	_, res := netIsend(rh, nil, 0, 0, 0, 0)
	assert.Equal(t, nccl.InvalidArgument, res, "a recv comm is not a send comm")
	_, res = netIsend(sh, nil, 0, 0, 0, 0)
	assert.Equal(t, nccl.Success, res, "the open comm still works")
}

type panickyRecv struct{ fakeRecv }

func (*panickyRecv) Close() error { panic("close exploded") }

type panickyListener struct{}

func (panickyListener) Accept() (nccl.RecvComm, error) { return &panickyRecv{}, nil }
func (panickyListener) Close() error                   { return nil }

// A transport's Close that panics becomes ncclInternalError at the boundary;
// the glue must not keep the transport's lifetime lock (every later init or
// finalize would hang).
func TestPanickingCloseReleasesTheLifetimeLock(t *testing.T) {
	h := &listenHook{hookTransport: &hookTransport{fakeTransport: &fakeTransport{name: "panicky", devs: 1}}, l: panickyListener{}}
	lh, rh := acceptOnHook(t, h)
	sink := &captureSink{}
	setSink(sink) // setup's cleanup removes it
	before := len(sink.warns())
	assert.EqualValues(t, nccl.InternalError, goNetClose(_Ctype_uintptr_t(rh), _Ctype_int(tagRecv)))
	warns := sink.warns()
	require.Len(t, warns, before+1, "one WARN for the panic")
	assert.Contains(t, warns[before], "internal error in close: close exploded")
	if !state.mu.TryLock() {
		state.mu.RUnlock() // what the panic leaked, so that the cleanup does not hang
		t.Fatal("the lifetime lock is still held after the panic")
	}
	state.mu.Unlock()
	require.Equal(t, nccl.Success, netClose(lh, tagListen))
}

// NCCL counts a NULL flush request as a finished flush, so iflush on a comm
// whose request slots are all taken must fail rather than answer NULL (as
// isend and irecv may, which NCCL retries): the GPU would read unflushed data.
func TestIflushWithEveryRequestSlotTakenFails(t *testing.T) {
	sink := &captureSink{}
	initWith(t, &fakeTransport{name: "flushfull", devs: 1})
	setSink(sink)
	_, recv, _, _ := connectPair(t)
	fr := recv.recv.(*fakeRecv)
	recv.bufs[0] = nccl.RecvBuffer{Size: 8}
	posted := 0
	for ; posted <= maxReqSlots; posted++ {
		req, res := recv.irecv(1, nil)
		require.Equal(t, nccl.Success, res)
		if req == 0 {
			break
		}
	}
	require.Less(t, posted, maxReqSlots+1, "irecv never ran out of request slots")
	recv.bufs[0] = nccl.RecvBuffer{Size: 4096}
	before := fr.flushes
	req, res := recv.iflush(1)
	assert.Zero(t, req)
	assert.Equal(t, nccl.InternalError, res, "iflush with %d receives in flight (every slot) answered %v", posted, res)
	assert.Equal(t, before, fr.flushes)
	require.NotEmpty(t, sink.warns())
	assert.Contains(t, sink.warns()[len(sink.warns())-1], "a flush cannot wait for one")
}

// A connect the glue itself fails (the transport made the comm, the comm
// table is full) is a failed connect in ncclnet_errors_total like any other.
func TestConnectFailedByTheGlueIsCounted(t *testing.T) {
	initWith(t, &fakeTransport{name: "fulltable", devs: 1, props: nccl.Properties{Name: "fulltable"}})
	m, _ := deviceInfo(state.transport, 0)
	before := m.Snapshot()
	for {
		if _, ok := comms.Add(&commEntry{tag: tagListen}); !ok {
			break
		}
	}
	var handle nccl.Handle
	handle[0] = 1
	sh, res := netConnect(0, -1, &handle)
	assert.Zero(t, sh)
	assert.Equal(t, nccl.InternalError, res)
	after := m.Snapshot()
	assert.Equal(t, before.ConnsOpen[metrics.Send], after.ConnsOpen[metrics.Send])
	assert.EqualValues(t, 1, after.Errors[metrics.Send][metrics.ErrInternal]-before.Errors[metrics.Send][metrics.ErrInternal],
		"a connect that failed (too many open comms) is not in ncclnet_errors_total")
}

// NCCL_GO_METRICS=0 leaves every counter at 0, the connection counters too.
func TestMetricsOffCountsNoConnections(t *testing.T) {
	f := &fakeTransport{name: "metricsoff", devs: 1, props: nccl.Properties{Name: "metricsoff"}}
	name := register(t, f, 9100)
	setup(t, map[string]string{"NCCL_GO_TRANSPORT": name, "NCCL_GO_METRICS": "0"})
	_, res := netInit(10, false, -1)
	require.Equal(t, nccl.Success, res)
	send, _, sh, rh := connectPair(t)
	require.False(t, send.counting)
	require.Equal(t, nccl.Success, netClose(sh, tagSend))
	require.Equal(t, nccl.Success, netClose(rh, tagRecv))
	s := send.m.Snapshot()
	assert.Zero(t, s.ConnsOpened[metrics.Send], "connections_opened_total counts")
	assert.Zero(t, s.ConnsOpened[metrics.Recv], "connections_opened_total counts")
	assert.Zero(t, s.ConnsClosed[metrics.Send], "connections_closed_total counts")
	assert.Zero(t, s.ConnsClosed[metrics.Recv], "connections_closed_total counts")
}

// stallWarnsWithin is the most WARNs a stall may have given d after it
// began: the first NCCL_GO_STALL_WARN (first) in, then at doubling
// intervals, the k-th at first x (2^k - 1). The tests bound the WARNs by the
// time taken, not by "one more than before the loop": a loaded machine that
// descheduled the loop past the next doubling got a third WARN, rightly. A
// check that did not back off gives one per clock read.
func stallWarnsWithin(d, first time.Duration) int {
	return bits.Len64(uint64(d/first)+1) - 1
}

// stallWarnPair connects a pair over a fake transport with a 20 ms
// NCCL_GO_STALL_WARN, returning the send side.
func stallWarnPair(t *testing.T, name string, prio int) (*captureSink, *commEntry, uintptr, *fakeSend) {
	f := &fakeTransport{name: name, devs: 1}
	reg := register(t, f, prio)
	sink := setup(t, map[string]string{"NCCL_GO_TRANSPORT": reg, "NCCL_GO_STALL_WARN": "0.02"})
	_, res := netInit(10, false, -1)
	require.Equal(t, nccl.Success, res)
	send, _, sh, _ := connectPair(t)
	return sink, send, sh, send.send.(*fakeSend)
}

// A send the transport keeps refusing (ib and shm wait for the receiver's
// clear-to-send) is no request yet, so only this check can say that the
// receiver posts nothing: WARN after NCCL_GO_STALL_WARN, backing off, counted
// once as a stalled send, and a last line when a send is accepted again.
func TestRefusedSendsAreReportedAsStalled(t *testing.T) {
	sink, send, sh, fs := stallWarnPair(t, "starved", 4100)
	buf := make([]byte, 64)
	fs.retry = true
	isend := func() uintptr {
		req, res := netIsend(sh, unsafe.Pointer(&buf[0]), 48, 0, 0, 0)
		require.Equal(t, nccl.Success, res)
		return req
	}
	start := time.Now()
	for deadline := time.Now().Add(5 * time.Second); len(sink.warns()) == 0 && time.Now().Before(deadline); {
		require.Zero(t, isend())
	}
	require.NotEmpty(t, sink.warns(), "a send refused for longer than NCCL_GO_STALL_WARN must be reported")
	w := sink.warns()[0]
	assert.Contains(t, w, "send of 48 bytes")
	assert.Contains(t, w, "refused by the transport")
	assert.Contains(t, w, "NCCL_GO_STALL_WARN")
	for i := 0; i < 10000; i++ {
		isend()
	}
	assert.LessOrEqual(t, len(sink.warns()), stallWarnsWithin(time.Since(start), 20*time.Millisecond), "WARNs back off instead of flooding")
	assert.EqualValues(t, 1, send.m.Snapshot().Stalls[metrics.Send], "counted once")
	assert.Zero(t, testing.AllocsPerRun(1000, func() { isend() }), "a refused isend allocates")
	fs.retry = false
	require.NotZero(t, isend())
	assert.Contains(t, sink.warns()[len(sink.warns())-1], "accepted after")
	assert.EqualValues(t, 1, send.m.Snapshot().Stalls[metrics.Send])
}

// Refusals behind a request still in flight (socket's full send queue) are
// that request's story, told by its own stall check: no refusal WARN.
func TestRefusedSendsBehindAPendingOneAreNotReported(t *testing.T) {
	sink, send, sh, fs := stallWarnPair(t, "behind", 4200)
	buf := make([]byte, 64)
	first, res := netIsend(sh, unsafe.Pointer(&buf[0]), 48, 0, 0, 0)
	require.Equal(t, nccl.Success, res)
	require.NotZero(t, first)
	fs.retry = true
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); {
		req, res := netIsend(sh, unsafe.Pointer(&buf[0]), 48, 0, 0, 0)
		require.Equal(t, nccl.Success, res)
		require.Zero(t, req)
	}
	for _, w := range sink.warns() {
		assert.NotContains(t, w, "refused by the transport")
	}
	assert.Zero(t, send.m.Snapshot().Stalls[metrics.Send])
}

// What NCCL calls is the exported entries, not the Go functions behind them,
// so the same check is made through those (with the cgo-generated argument
// types, since a test file cannot import "C"). setNetAttr is among them:
// NCCL 2.28+ calls it from the progress thread as a transfer's attributes
// change, and at INFO its trace line used to allocate before being dropped.
func TestExportedDataPathDoesNotAllocate(t *testing.T) {
	initWith(t, &fakeTransport{name: "noallocexp", devs: 1, props: nccl.Properties{MaxRecvs: 2}})
	setProfiler(&countingProfiler{})
	_, recv, sh, _ := connectPair(t)
	recv.recv.(*fakeRecv).done = true
	rh := commHandle(tagRecv, recv.gen, recv.slot)
	buf := make([]byte, 64)
	var sizes [2]_Ctype_int
	var done _Ctype_int
	var req _Ctype_uintptr_t
	data := [2]unsafe.Pointer{unsafe.Pointer(&buf[0]), unsafe.Pointer(&buf[32])}
	sz := [2]_Ctype_size_t{32, 32}
	tags := [2]_Ctype_int{1, 1}
	mhs := [2]_Ctype_uintptr_t{9, 9}
	phs := [2]_Ctype_uintptr_t{0x10, 0x20}
	round := func() {
		if r := goNetIsend(_Ctype_uintptr_t(sh), unsafe.Pointer(&buf[0]), 48, 3, 7, 0x30, &req); r != 0 || req == 0 {
			t.Fatalf("isend: %v %#x", r, req)
		}
		if r := goNetTest(req, &done, &sizes[0]); r != 0 || done != 1 {
			t.Fatalf("test send: %v %v", r, done)
		}
		if r := goNetIrecv(_Ctype_uintptr_t(rh), 2, &data[0], &sz[0], nil, &tags[0], &mhs[0], &phs[0], &req); r != 0 || req == 0 {
			t.Fatalf("irecv: %v %#x", r, req)
		}
		if r := goNetTest(req, &done, &sizes[0]); r != 0 || done != 1 {
			t.Fatalf("test recv: %v %v", r, done)
		}
	}
	for i := 0; i < 64; i++ {
		round()
	}
	assert.Zero(t, testing.AllocsPerRun(1000, round), "exported isend+test and irecv+test allocate")
	attr := func() {
		if r := goNetSetNetAttr(0, 16, 16); r != 0 {
			t.Fatalf("setNetAttr: %v", r)
		}
	}
	assert.Zero(t, testing.AllocsPerRun(1000, attr), "exported setNetAttr allocates at NCCL_DEBUG=INFO")
}
