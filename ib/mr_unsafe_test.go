package ib

import (
	"runtime"
	"testing"
	"unsafe"
	"weak"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/metrics"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

func TestMRCacheSharesRegistrations(t *testing.T) {
	setEnv(t)
	f, a, b := twoHosts(t, softnic.DeviceConfig{})
	sc, _ := connectPair(t, a, 0, b, 0)
	dev := f.Device("simA_0")
	base := dev.MRCount() // FIFO and size records
	mem, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	defer unix.Munmap(mem)
	p := unsafe.Pointer(&mem[0])

	whole, err := sc.RegMr(p, len(mem), nccl.PtrHost)
	require.NoError(t, err)
	inner, err := sc.RegMr(unsafe.Add(p, 5000), 100, nccl.PtrHost) // inside: a cache hit
	require.NoError(t, err)
	assert.NotEqual(t, whole, inner)
	assert.Equal(t, base+1, dev.MRCount(), "one registration serves both")
	st, ok := a.t.MRStats(0)
	require.True(t, ok)
	assert.Equal(t, MRStats{Hits: 1, Misses: 1, RegisteredBytes: 1 << 20}, st)

	require.NoError(t, sc.DeregMr(whole))
	assert.Equal(t, base+1, dev.MRCount(), "still referenced")
	require.NoError(t, sc.DeregMr(inner))
	assert.Equal(t, base, dev.MRCount())
	st, _ = a.t.MRStats(0)
	assert.Equal(t, MRStats{Hits: 1, Misses: 1, Deregistrations: 1}, st)

	assert.NoError(t, sc.DeregMr(0), "NCCL deregisters NULL handles")
	err = sc.DeregMr(inner)
	assert.Equal(t, nccl.InternalError, nccl.ResultOf(err), "double deregistration is caught")
	_, err = sc.RegMr(p, 10, nccl.PtrCUDA)
	assert.Equal(t, nccl.InternalError, nccl.ResultOf(err), "no CUDA support without peer memory")
	_, ok = a.t.MRStats(99)
	assert.False(t, ok)

	// A send through a handle that does not cover the buffer is refused.
	small, err := sc.RegMr(p, 64, nccl.PtrHost)
	require.NoError(t, err)
	defer sc.DeregMr(small)
	assert.True(t, lookupMR(small).covers(uint64(uintptr(p)), 64))
	assert.False(t, lookupMR(small).covers(uint64(uintptr(p)), 65))
}

// A dma-buf registration survives NCCL closing its fd right away (the
// kernel holds the buffer), and is cached like host memory: the same range
// registered twice is one MR, with hits and misses counted.
func TestDMABufRegistrationIsCached(t *testing.T) {
	setEnv(t)
	f := softnic.NewFabric()
	dev := f.AddDevice(softnic.DeviceConfig{Name: "simA_0"})
	f.AddDevice(softnic.DeviceConfig{Name: "simB_0"})
	feat := verbs.Features{DMABuf: true}
	a, b := newHost(t, f, feat, "simA_0"), newHost(t, f, feat, "simB_0")
	sc, rc := connectPair(t, a, 0, b, 0)

	// A memfd stands in for a GPU dma-buf: the software NIC maps it.
	fd, err := unix.MemfdCreate("dmabuf", 0)
	require.NoError(t, err)
	require.NoError(t, unix.Ftruncate(fd, 3*4096))
	view, err := unix.Mmap(fd, 0, 3*4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(view)
	gpu := fakeGPU(0x7f0000000000)
	mh, err := rc.RegMrDMABuf(gpu, 4096, nccl.PtrCUDA, 4096, fd)
	require.NoError(t, err)
	before := f.Device("simB_0").MRCount()
	mh2, err := rc.RegMrDMABuf(gpu, 4096, nccl.PtrCUDA, 4096, fd)
	require.NoError(t, err)
	require.NoError(t, unix.Close(fd)) // NCCL closes it right away
	assert.Equal(t, before, f.Device("simB_0").MRCount(), "the second registration is a cache hit")
	st, _ := b.t.MRStats(0)
	assert.Equal(t, uint64(1), st.Hits)
	require.NoError(t, rc.DeregMr(mh2))
	defer rc.DeregMr(mh)

	r, err := rc.Irecv([]nccl.RecvBuffer{{Data: gpu, Size: 4096, MH: mh}})
	require.NoError(t, err)
	sb := newBuf(t, sc, 100, 0)
	copy(sb.b, pattern(100, 3))
	var sr nccl.Request = nccl.NoRequest
	within(t, "isend", func() (bool, error) {
		var err error
		sr, err = sc.Isend(sb.ptr(), 100, 0, sb.mh)
		return sr != nccl.NoRequest, err
	})
	within(t, "recv", func() (bool, error) { return rc.Test(r, make([]int, 1)) })
	within(t, "send", func() (bool, error) { d, _, err := sc.Test(sr); return d, err })
	assert.Equal(t, pattern(100, 3), view[4096:4196], "data landed at the dma-buf offset")
	_ = dev
}

// The cache is sorted by start address. A registration that starts earlier
// and covers a range must be found even when a smaller registration sorts
// between it and the range (a sort.Search on "end > start" is not
// monotonic there and misses it).
func TestMRCacheFindsCoveringEntryPastSmallerOne(t *testing.T) {
	setEnv(t)
	f, a, b := twoHosts(t, softnic.DeviceConfig{})
	sc, _ := connectPair(t, a, 0, b, 0)
	dev := f.Device("simA_0")
	mem := mmapBytes(t, 10*4096)
	p := unsafe.Pointer(&mem[0])
	small, err := sc.RegMr(unsafe.Add(p, 4096), 4096, nccl.PtrHost) // pages [1,2)
	require.NoError(t, err)
	large, err := sc.RegMr(p, 10*4096, nccl.PtrHost) // pages [0,10): sorts before small
	require.NoError(t, err)
	n := dev.MRCount()
	st0, _ := a.t.MRStats(0)
	inner, err := sc.RegMr(unsafe.Add(p, 5*4096), 4096, nccl.PtrHost) // page 5: only large covers it
	require.NoError(t, err)
	assert.Equal(t, n, dev.MRCount(), "page 5 lies inside the large registration: no new MR")
	st, _ := a.t.MRStats(0)
	assert.Equal(t, st0.Hits+1, st.Hits)
	assert.Equal(t, st0.Misses, st.Misses)
	for _, mh := range []nccl.MemHandle{inner, large, small} {
		require.NoError(t, sc.DeregMr(mh))
	}
}

// A range whose page-rounded end wraps past the end of the address space is
// no memory at all. The cache took its small wrapped end for a hit on any
// registration starting below it and returned that (unrelated) registration
// with ncclSuccess; it must be InvalidArgument and leave the cache alone.
func TestRegMrRangeThatWrapsIsInvalidArgument(t *testing.T) {
	setEnv(t)
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	sc, _ := connectPair(t, a, 0, b, 0)
	mem := mmapBytes(t, 4096)
	reg, err := sc.RegMr(unsafe.Pointer(&mem[0]), len(mem), nccl.PtrHost)
	require.NoError(t, err)
	st0, _ := a.t.MRStats(0)
	for _, c := range []struct {
		addr uintptr
		size int
	}{
		{^uintptr(0) &^ 4095, 8192},     // the last page and one past it
		{^uintptr(0) - 0xff, 1 << 20},   // a byte range that wraps
		{^uintptr(0), 1},                // its page-rounded end wraps
		{^uintptr(0) - 4094, 4096 + 10}, // likewise, not page aligned
	} {
		mh, err := sc.RegMr(fakeGPU(c.addr), c.size, nccl.PtrHost)
		require.Error(t, err, "regMr(%#x, %d) wraps", c.addr, c.size)
		assert.Equal(t, nccl.InvalidArgument, nccl.ResultOf(err))
		assert.Contains(t, err.Error(), "wraps past the end of the address space")
		assert.Zero(t, mh)
	}
	st, _ := a.t.MRStats(0)
	assert.Equal(t, st0, st, "a rejected range neither hits nor misses the cache")
	require.NoError(t, sc.DeregMr(reg))
}

// The MR cache's counters reach the plugin's metrics (docs/metrics.md): the
// series of the port the cache belongs to.
func TestMRCacheCountersReachMetrics(t *testing.T) {
	setEnv(t)
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	sc, _ := connectPair(t, a, 0, b, 0)
	m := metrics.ForDevice("ib", "simA_0", 1)
	h0, m0, r0 := m.MRHits.Load(), m.MRMisses.Load(), m.MRRegistered.Load()
	mem := mmapBytes(t, 2*4096)
	whole, err := sc.RegMr(unsafe.Pointer(&mem[0]), len(mem), nccl.PtrHost)
	require.NoError(t, err)
	part, err := sc.RegMr(unsafe.Pointer(&mem[100]), 10, nccl.PtrHost)
	require.NoError(t, err)
	assert.Equal(t, h0+1, m.MRHits.Load())
	assert.Equal(t, m0+1, m.MRMisses.Load())
	assert.Equal(t, r0+2*4096, m.MRRegistered.Load())
	require.NoError(t, sc.DeregMr(part))
	require.NoError(t, sc.DeregMr(whole))
	assert.Equal(t, r0, m.MRRegistered.Load(), "released when the last reference goes")
}

// The registration series of a port carry the same port label as its
// traffic series: the port number NCCL shows (ibv port + realPort), which the
// glue labels traffic with (docs/metrics.md). The second port of a one-function
// dual-port card is NCCL port 3; its registrations were counted under ibv
// port 2, a series no traffic series matched.
func TestMRCacheCountersUseNCCLsPortNumber(t *testing.T) {
	setEnv(t)
	f := softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "mrportA_0", Ports: 2})
	f.AddDevice(softnic.DeviceConfig{Name: "mrportB_0", Ports: 2})
	a := newHost(t, f, verbs.Features{}, "mrportA_0")
	b := newHost(t, f, verbs.Features{}, "mrportB_0")
	p, err := a.t.Properties(1)
	require.NoError(t, err)
	require.Equal(t, []any{"mrportA_0", 3}, []any{p.Name, p.Port}, "ibv port 2 after one port on the same PCI path")
	sc, _ := connectPair(t, a, 1, b, 1)
	want, ibvPort := metrics.ForDevice("ib", p.Name, p.Port), metrics.ForDevice("ib", p.Name, 2)
	m0, stray := want.MRMisses.Load(), ibvPort.MRMisses.Load()
	mem := mmapBytes(t, 4096)
	mh, err := sc.RegMr(unsafe.Pointer(&mem[0]), len(mem), nccl.PtrHost)
	require.NoError(t, err)
	assert.Equal(t, m0+1, want.MRMisses.Load(), "counted under the port NCCL shows (%d)", p.Port)
	assert.Equal(t, stray, ibvPort.MRMisses.Load(), "nothing counted under the bare ibv port")
	require.NoError(t, sc.DeregMr(mh))
}

// TestDataPathDoesNotAllocate runs the steady-state isend/irecv/test loop
// and requires zero heap allocations per message.
func TestDataPathDoesNotAllocate(t *testing.T) {
	setEnv(t, "NCCL_IB_QPS_PER_CONNECTION", "2")
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	sc, rc := connectPair(t, a, 0, b, 0)
	sb, rb := newBuf(t, sc, 4096, 1), newBuf(t, rc, 4096, 0)
	loop := newPingLoop(sc, rc, sb, rb, 4096)
	loop.run(t, 10) // warm up
	allocs := testing.AllocsPerRun(200, func() { loop.run(t, 1) })
	assert.Zero(t, allocs, "allocations per message on the data path")
}

// A flush is on the data path too (after every GPU-direct receive).
func TestFlushDoesNotAllocate(t *testing.T) {
	setEnv(t, "NCCL_GO_IB_FORCE_FLUSH", "1")
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	_, rc := connectPair(t, a, 0, b, 0)
	require.True(t, rc.flush.enabled)
	rb := newBuf(t, rc, 64, 0)
	bufs := []nccl.RecvBuffer{{Data: rb.ptr(), Size: 64, MH: rb.mh}}
	flush := func() {
		r, err := rc.Iflush(bufs)
		if err != nil || r == nccl.NoRequest {
			t.Fatalf("iflush: %v %v", r, err)
		}
		for done := false; !done; {
			if done, err = rc.Test(r, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	flush() // warm up
	assert.Zero(t, testing.AllocsPerRun(200, flush), "allocations per flush")
}

type pingLoop struct {
	sc     *sendComm
	rc     *recvComm
	sb, rb *buf
	size   int
	bufs   [1]nccl.RecvBuffer
	sizes  [1]int
}

func newPingLoop(sc *sendComm, rc *recvComm, sb, rb *buf, size int) *pingLoop {
	l := &pingLoop{sc: sc, rc: rc, sb: sb, rb: rb, size: size}
	l.bufs[0] = nccl.RecvBuffer{Data: rb.ptr(), Size: size, MH: rb.mh}
	return l
}

func (l *pingLoop) run(tb testing.TB, n int) {
	for i := 0; i < n; i++ {
		rr, err := l.rc.Irecv(l.bufs[:])
		if err != nil || rr == nccl.NoRequest {
			tb.Fatalf("irecv: %v %v", rr, err)
		}
		sr, err := l.sc.Isend(l.sb.ptr(), l.size, 0, l.sb.mh)
		if err != nil || sr == nccl.NoRequest {
			tb.Fatalf("isend: %v %v", sr, err)
		}
		for done := false; !done; {
			if done, _, err = l.sc.Test(sr); err != nil {
				tb.Fatal(err)
			}
		}
		for done := false; !done; {
			if done, err = l.rc.Test(rr, l.sizes[:]); err != nil {
				tb.Fatal(err)
			}
		}
	}
}

// BenchmarkSoftNICPingPong measures the transport's per-message overhead on
// the software NIC (the model's memcpy included) and reports allocations.
func BenchmarkSoftNICPingPong(b *testing.B) {
	for _, size := range []int{8, 64 << 10} {
		b.Run(byteSize(size), func(b *testing.B) {
			setEnvTB(b)
			f := softnic.NewFabric()
			f.AddDevice(softnic.DeviceConfig{Name: "simA_0"})
			f.AddDevice(softnic.DeviceConfig{Name: "simB_0"})
			ha, hb := benchHost(b, f, "simA_0"), benchHost(b, f, "simB_0")
			sc, rc := benchConnect(b, ha, hb)
			sb, rb := benchBuf(b, sc, size), benchBuf(b, rc, size)
			loop := newPingLoop(sc, rc, sb, rb, size)
			b.ReportAllocs()
			b.SetBytes(int64(size))
			b.ResetTimer()
			loop.run(b, b.N)
		})
	}
}

// The peer check runs on the data path (every 128th idle call): it must not
// allocate either.
func TestPeerCheckDoesNotAllocate(t *testing.T) {
	setEnv(t)
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	sc, _ := connectPair(t, a, 0, b, 0)
	require.NotNil(t, sc.watch.conn)
	allocs := testing.AllocsPerRun(10, func() {
		for i := 0; i < 4*peerCheckEvery; i++ {
			if sc.watch.gone() {
				t.Fatal("peer reported gone while alive")
			}
		}
	})
	assert.Zero(t, allocs)
}

// Registrations NCCL never deregistered are released when the device
// closes; the MR-cache series must say so, or the registered-bytes gauge
// (plugin-wide, shared by the next transport on the same port) keeps
// counting memory that is no longer registered.
func TestDeviceCloseReleasesLeakedRegistrationsInMetrics(t *testing.T) {
	setEnv(t)
	f, a, b := twoHosts(t, softnic.DeviceConfig{})
	sc, rc := connectPair(t, a, 0, b, 0)
	m := metrics.ForDevice("ib", "simA_0", 1)
	r0 := m.MRRegistered.Load()
	mem := mmapBytes(t, 3*4096)
	_, err := sc.RegMr(unsafe.Pointer(&mem[0]), len(mem), nccl.PtrHost) // never deregistered
	require.NoError(t, err)
	require.Equal(t, r0+3*4096, m.MRRegistered.Load())
	require.NoError(t, sc.Close())
	require.NoError(t, rc.Close())
	require.NoError(t, a.t.Finalize())
	assert.Zero(t, f.Device("simA_0").MRCount(), "the MR is gone")
	assert.Equal(t, r0, m.MRRegistered.Load(), "and no longer counted as registered")
}

// NCCL frees its buffers after deregMr, but a registration it never
// deregistered (closeMRCache's case) is released when the devices close.
// Its handle must go with it: the handle table is the package's, and an
// entry left there kept the closed devices (ports, HCA, its verbs context
// and PD objects, the MR caches) reachable for the life of the process, one more per restart (NCCL 2.28+
// restarts the transport per communicator): +2,000 handles and +8 MB of heap
// over 2,000 such cycles.
func TestUnreleasedRegistrationDoesNotKeepAClosedDevice(t *testing.T) {
	f, a, b := twoHosts(t, softnic.DeviceConfig{})
	before := handles.Len()
	c := &host{t: NewWithOptions(Options{Provider: f.Provider(verbs.Features{}, "simA_0"), SysfsRoot: a.root}), log: &captureLog{}}
	require.NoError(t, c.t.Init(nccl.InitContext{Log: c.log}))
	sc, rc, l := connectUncollected(t, c, b)
	mem := mmapBytes(t, 1<<16)
	mh, err := sc.RegMr(unsafe.Pointer(&mem[0]), len(mem), nccl.PtrHost)
	require.NoError(t, err)
	require.NotNil(t, lookupMR(mh))
	require.NoError(t, l.Close())
	require.NoError(t, sc.Close()) // no DeregMr: NCCL skipped it
	require.NoError(t, rc.Close())
	wd, wh := weak.Make(c.t.devs[0]), weak.Make(c.t.hcas[0])
	require.NoError(t, c.t.Finalize())
	sc, rc, l, c = nil, nil, nil, nil

	assert.Nil(t, lookupMR(mh), "the handle of a registration released with its device still resolves")
	assert.Equal(t, before, handles.Len(), "the handle table still holds the closed device's registration")
	for i := 0; i < 3; i++ {
		runtime.GC()
	}
	assert.Nil(t, wd.Value(), "a finalized transport's device is kept reachable by a registration NCCL never deregistered")
	assert.Nil(t, wh.Value(), "a closed HCA (context, PD, the other ports) is kept reachable by a registration NCCL never deregistered")
}
