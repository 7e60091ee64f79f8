package ibv

import (
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
)

// absent skips, saying why, where the thing a test needs is truly absent;
// in the Soft-RoCE lane (RDMA_LANE=1), which exists to have it, it fails.
func absent(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("RDMA_LANE") == "1" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// libibverbsPresent reports whether the system library can be opened at all;
// tests that need it skip (with the reason) only when it is truly absent.
func libibverbsPresent(t *testing.T) {
	t.Helper()
	for _, dir := range []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"} {
		if _, err := os.Stat(dir + "/" + DefaultLibrary); err == nil {
			return
		}
	}
	absent(t, "%s is not installed (apt-get install libibverbs1); nothing to load", DefaultLibrary)
}

func TestLoadFailures(t *testing.T) {
	loadMu.Lock()
	already := loaded
	loadMu.Unlock()
	if already != "" {
		// Load keeps libibverbs for the life of the process, so once a test
		// loaded it (go test -count=N, -shuffle) every Load here would report
		// that instead: check the failure paths in a fresh process.
		cmd := exec.Command(os.Args[0], "-test.run=^TestLoadFailures$", "-test.count=1", "-test.v")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "TestLoadFailures in a fresh process (libibverbs was loaded from %s here):\n%s", already, out)
		require.Contains(t, string(out), "--- PASS: TestLoadFailures", "the fresh process must run the check, not skip it:\n%s", out)
		return
	}
	_, err := Load("/nonexistent/libibverbs.so.1")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "dlopen(/nonexistent/libibverbs.so.1)")

	// A library without the verbs: every required symbol is checked.
	_, err = Load("libc.so.6")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "has no symbol ibv_get_device_list")
}

func TestLoadResolvesSymbolsAndProbesOptionalOnes(t *testing.T) {
	libibverbsPresent(t)
	p, err := Load(DefaultLibrary)
	require.NoError(t, err)
	// Debian 12 ships rdma-core 44: every optional verb exists there.
	f := p.Features()
	t.Logf("features: %+v", f)
	assert.True(t, f.RegIova2, "ibv_reg_mr_iova2@IBVERBS_1.8")
	assert.True(t, f.DMABuf, "ibv_reg_dmabuf_mr@IBVERBS_1.12")
	assert.True(t, f.ECE, "ibv_query_ece@IBVERBS_1.10")
	// ibv_query_port_speed is newer than Debian 12's library: the feature
	// must say what the library's dynamic symbol table says.
	assert.Equal(t, exports(t, DefaultLibrary, "ibv_query_port_speed"), f.PortSpeed, "Features.PortSpeed")
	if !f.PortSpeed {
		// The shim answers without calling into the library (no device needed).
		_, err := (&context{}).QueryPortSpeed(1)
		assert.ErrorIs(t, err, verbs.EOPNOTSUPP, "ibv_query_port_speed without the symbol")
	}

	_, err = Load("/some/other/libibverbs.so.1")
	assert.ErrorContains(t, err, "already loaded", "one libibverbs per process")

	names, err := p.Devices()
	require.NoError(t, err)
	t.Logf("RDMA devices: %v", names)
	_, err = p.Open("no-such-device")
	assert.Error(t, err)
}

// ibv_fork_init on the system's libibverbs: it must succeed before anything
// is registered, answer the same when called again, and report a status
// (Debian 12's rdma-core has ibv_is_fork_initialized).
func TestForkInitOnTheSystemLibrary(t *testing.T) {
	libibverbsPresent(t)
	p, err := Load(DefaultLibrary)
	require.NoError(t, err)
	st, err := p.ForkInit()
	require.NoError(t, err)
	t.Logf("fork support: %v", st)
	assert.Contains(t, []verbs.ForkStatus{verbs.ForkEnabled, verbs.ForkUnneeded}, st)
	again, err := p.ForkInit()
	require.NoError(t, err)
	assert.Equal(t, st, again)
}

// TestRealDeviceBasics runs on a host (or the Soft-RoCE guest) with an RDMA
// device: open it, query it, and register memory.
// realDevice loads libibverbs and names its first device, skipping (with
// the reason) only where there is none.
func realDevice(t *testing.T) (*Provider, string) {
	t.Helper()
	libibverbsPresent(t)
	p, err := Load(DefaultLibrary)
	require.NoError(t, err)
	names, err := p.Devices()
	require.NoError(t, err)
	if len(names) == 0 {
		absent(t, "no RDMA device: ibv_get_device_list returned 0 devices")
	}
	return p, names[0]
}

func TestRealDeviceBasics(t *testing.T) {
	p, name := realDevice(t)
	names := []string{name}
	ctx, err := p.Open(names[0])
	require.NoError(t, err)
	defer func() { assert.NoError(t, ctx.Close()) }()
	da, err := ctx.QueryDevice()
	require.NoError(t, err)
	assert.Greater(t, da.PhysPortCnt, 0)
	assert.Greater(t, da.MaxQP, 0)
	pa, err := ctx.QueryPort(1)
	require.NoError(t, err)
	t.Logf("%s: %+v port1 %+v", names[0], da, pa)
	mbps, err := ctx.QueryPortSpeed(1)
	t.Logf("ibv_query_port_speed: %d Mbps, %v", mbps, err)
	switch {
	case !p.Features().PortSpeed:
		assert.ErrorIs(t, err, verbs.EOPNOTSUPP, "ibv_query_port_speed without the symbol")
	case err == nil:
		assert.Positive(t, mbps, "an ACTIVE port's effective speed")
	default: // a kernel without the verb
		assert.True(t, errors.Is(err, verbs.EOPNOTSUPP) || errors.Is(err, verbs.EPROTONOSUPPORT), "%v", err)
	}
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	defer func() { assert.NoError(t, pd.Dealloc()) }()
	cq, err := ctx.CreateCQ(16)
	require.NoError(t, err)
	defer func() { assert.NoError(t, cq.Destroy()) }()
}

// threads counts this process's OS threads.
func threads(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/task")
	require.NoError(t, err)
	return len(ents)
}

// TestRealAsyncEventsWaitInTheNetpoller: waiting for async events holds no
// OS thread (the fd is in Go's netpoller, not in a poll() loop), and both
// stop and Close end the wait promptly.
func TestRealAsyncEventsWaitInTheNetpoller(t *testing.T) {
	p, name := realDevice(t)
	names := []string{name}
	base := threads(t)
	var ctxs []verbs.Context
	done := make(chan error, 8)
	stop := make(chan struct{})
	for i := 0; i < 8; i++ {
		ctx, err := p.Open(names[0])
		require.NoError(t, err)
		ctxs = append(ctxs, ctx)
		go func() { _, err := ctx.NextAsyncEvent(stop); done <- err }()
	}
	time.Sleep(200 * time.Millisecond) // let all eight block (if they held threads, they would now)
	assert.LessOrEqual(t, threads(t), base+3, "eight waiters must not hold eight threads")
	close(stop)
	for i := 0; i < 8; i++ {
		select {
		case err := <-done:
			assert.ErrorIs(t, err, verbs.ErrClosed)
		case <-time.After(5 * time.Second):
			t.Fatal("a waiter did not notice stop")
		}
	}
	for _, c := range ctxs {
		assert.NoError(t, c.Close())
	}
	// Close alone ends a wait too.
	ctx, err := p.Open(names[0])
	require.NoError(t, err)
	go func() { _, err := ctx.NextAsyncEvent(nil); done <- err }()
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, ctx.Close())
	select {
	case err := <-done:
		assert.ErrorIs(t, err, verbs.ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("a waiter did not notice Close")
	}
}

// exports reports whether the installed library lib (found as
// libibverbsPresent finds it) exports symbol sym.
func exports(t *testing.T, lib, sym string) bool {
	t.Helper()
	for _, dir := range []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"} {
		f, err := elf.Open(dir + "/" + lib)
		if err != nil {
			continue
		}
		defer f.Close()
		syms, err := f.DynamicSymbols()
		require.NoError(t, err)
		for _, s := range syms {
			if s.Name == sym && s.Section != elf.SHN_UNDEF {
				return true
			}
		}
		return false
	}
	t.Fatalf("%s not found", lib)
	return false
}

// TestAsyncEventPortDecodedAsLibibverbsFillsIt: libibverbs' ibv_get_async_event
// (libibverbs/device.c) stores the kernel's element as the port number for
// every event that is not a CQ, QP, SRQ or WQ event, so the port of
// IBV_EVENT_DEVICE_SPEED_CHANGE (newer than the headers the shim builds
// against) and of any later type must reach the caller, as the port events'
// do; an SRQ or WQ event's element is a pointer, never a port.
func TestAsyncEventPortDecodedAsLibibverbsFillsIt(t *testing.T) {
	for _, typ := range []verbs.AsyncEventType{verbs.EventPortActive, verbs.EventPortErr, verbs.EventGIDChange,
		verbs.EventDeviceSpeedChange, verbs.EventDeviceSpeedChange + 1} {
		ev := decodePortEvent(typ, 2)
		assert.Equal(t, typ, ev.Type)
		assert.Equal(t, 2, ev.Port, "%v carries its port in the event's element", typ)
	}
	for _, typ := range []verbs.AsyncEventType{verbs.EventSRQErr, verbs.EventSRQLimitReached, verbs.EventWQFatal} {
		assert.Equal(t, 0, decodePortEvent(typ, 2).Port, "%v: the element is not a port", typ)
	}
}
