package ib

import (
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Real-verbs tests: the same protocol over libibverbs. They run wherever an
// RDMA device exists (the Soft-RoCE lane runs them against rxe0 with
// NCCL_IB_HCA=rxe0 NCCL_GO_IB_FORCE_FLUSH=1) and skip, saying why, only when
// libibverbs is absent or reports no device. Two transport instances in one
// process share the device (rxe's loopback path).

// overlayEnv sets kv on top of the process environment.
func overlayEnv(t *testing.T, kv ...string) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	ncclenv.SetLookup(func(k string) (string, bool) {
		if v, ok := m[k]; ok {
			return v, true
		}
		return os.LookupEnv(k)
	})
	t.Cleanup(func() { ncclenv.SetLookup(nil) })
}

// requireRealDevice skips, saying why, where libibverbs or an RDMA device is
// truly absent; in the Soft-RoCE lane (RDMA_LANE=1) their absence fails.
func requireRealDevice(t *testing.T) {
	t.Helper()
	skip := t.Skipf
	if os.Getenv("RDMA_LANE") == "1" {
		skip = t.Fatalf
	}
	p, err := loadVerbs(nccl.DiscardLogger{}, envLib.Get())
	if err != nil {
		skip("no RDMA stack: libibverbs cannot be loaded (%v)", err)
		return
	}
	names, err := p.Devices()
	require.NoError(t, err)
	if len(names) == 0 {
		skip("no RDMA device: ibv_get_device_list returned 0 devices")
		return
	}
	hca, _ := ncclenv.Value(envHCA.Name())
	t.Logf("RDMA devices: %v (NCCL_IB_HCA=%q)", names, hca)
}

func realHosts(t *testing.T) (*host, *host) {
	t.Helper()
	requireRealDevice(t)
	mk := func() *host {
		h := &host{t: New().(*Transport), log: &captureLog{}}
		require.NoError(t, h.t.Init(nccl.InitContext{Log: h.log}), "devices exist, so Init must find a usable port")
		// ibv_fork_init ran before the device was opened, and answered.
		assert.True(t, h.log.has("NET/GoIB : fork support "), "%s", h.log)
		assert.False(t, h.log.has("ibv_fork_init failed"), "%s", h.log)
		t.Cleanup(func() { assert.NoError(t, h.t.Finalize()) })
		return h
	}
	a, b := mk(), mk()
	t.Logf("device 0: %s:%d %v GID index %d %v; OOB %s %v", a.t.devs[0].name, a.t.devs[0].port, a.t.devs[0].attr.LinkLayer,
		a.t.devs[0].gidIndex, a.t.devs[0].gid, a.t.oobName, a.t.oobAddr)
	return a, b
}

func TestRealVerbsTransfer(t *testing.T) {
	for _, c := range []struct{ name, qps, split string }{{"qps=1", "1", "0"}, {"qps=2,split", "2", "1"}} {
		t.Run(c.name, func(t *testing.T) {
			overlayEnv(t, "NCCL_IB_QPS_PER_CONNECTION", c.qps, "NCCL_IB_SPLIT_DATA_ON_QPS", c.split)
			a, b := realHosts(t)
			sc, rc := connectPair(t, a, 0, b, 0)
			for _, size := range []int{0, 1, 4097, 1 << 20} {
				got, sizes := transfer(t, sc, rc, []int{size}, []int{size + 128})
				assert.Equal(t, []int{size}, sizes)
				assert.Equal(t, pattern(size, 0), got[0][:size], "size %d", size)
				assert.Equal(t, byte(0xee), got[0][size], "nothing past the message")
			}
			send := []int{100, 0, 65536, 7}
			got, sizes := transfer(t, sc, rc, send, []int{128, 8, 65536, 4096})
			assert.Equal(t, send, sizes, "grouped receive")
			for i, n := range send {
				assert.Equal(t, pattern(n, byte(i)), got[i][:n])
			}
		})
	}
}

func TestRealVerbsFlushAndTruncation(t *testing.T) {
	overlayEnv(t, "NCCL_GO_IB_FORCE_FLUSH", "1")
	a, b := realHosts(t)
	sc, rc := connectPair(t, a, 0, b, 0)
	require.True(t, rc.flush.enabled)
	got, sizes := transfer(t, sc, rc, []int{300}, []int{4096})
	rb := newBuf(t, rc, 4096, 0)
	copy(rb.b, got[0])
	r, err := rc.Iflush([]nccl.RecvBuffer{{Data: rb.ptr(), Size: sizes[0], MH: rb.mh}})
	require.NoError(t, err)
	require.NotEqual(t, nccl.NoRequest, r)
	within(t, "flush READ over the loopback QP", func() (bool, error) { return rc.Test(r, nil) })
	assert.Equal(t, rb.b[0], rc.flush.mem.b[0])

	// A send larger than the posted receive fails on both sides, nothing written.
	small := newBuf(t, rc, 256, 0xee)
	rr, err := rc.Irecv([]nccl.RecvBuffer{{Data: small.ptr(), Size: 64, MH: small.mh}})
	require.NoError(t, err)
	big := newBuf(t, sc, 4096, 1)
	var sr nccl.Request = nccl.NoRequest
	within(t, "isend", func() (bool, error) {
		var err error
		sr, err = sc.Isend(big.ptr(), 65, 0, big.mh)
		return sr != nccl.NoRequest, err
	})
	var rerr, serr error
	deadline := time.Now().Add(30 * time.Second)
	for rerr == nil || serr == nil {
		if rerr == nil {
			var done bool
			done, rerr = rc.Test(rr, make([]int, 1))
			require.False(t, done && rerr == nil, "truncated receive reported success")
		}
		if serr == nil {
			var done bool
			done, _, serr = sc.Test(sr)
			require.False(t, done && serr == nil, "truncated send reported success")
		}
		require.True(t, time.Now().Before(deadline))
	}
	assert.Equal(t, nccl.InvalidUsage, nccl.ResultOf(rerr))
	assert.Equal(t, nccl.InvalidUsage, nccl.ResultOf(serr))
	assert.Equal(t, byte(0xee), small.b[0])

	st, ok := a.t.MRStats(0)
	require.True(t, ok)
	assert.NotZero(t, st.Misses)
	assert.NotZero(t, st.RegisteredBytes)
}

// rdmaResources counts the kernel's verbs objects per type (qp, cq, mr, pd)
// on every RDMA device, with iproute2's rdma tool.
func rdmaResources(t *testing.T) map[string]int {
	t.Helper()
	out, err := exec.Command("rdma", "resource", "show").CombinedOutput()
	if err != nil {
		if os.Getenv("RDMA_LANE") == "1" {
			t.Fatalf("rdma resource show: %v: %s", err, out)
		}
		t.Skipf("cannot count verbs objects without iproute2's rdma tool: %v", err)
	}
	// "0: rxe0: pd 3 cq 4 qp 3 cm_id 0 mr 2 ctx 1 srq 0"
	counts := map[string]int{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		for i := 2; i+1 < len(f); i += 2 {
			if n, err := strconv.Atoi(f[i+1]); err == nil {
				counts[f[i]] += n
			}
		}
	}
	return counts
}

// TestRealVerbsAbortAtAnyMoment is TestAbortAtAnyMoment on libibverbs: 100
// rounds of finalize/close during set-up and with requests in flight, then
// the kernel's QP, CQ, MR and PD counts, the goroutines and the fds must be
// back where they started (a use-after-free would crash the process).
func TestRealVerbsAbortAtAnyMoment(t *testing.T) {
	requireRealDevice(t)
	overlayEnv(t, "NCCL_SOCKET_RETRY_CNT", "1", "NCCL_SOCKET_RETRY_SLEEP_MSEC", "1")
	before := rdmaResources(t)
	baseG, baseFD := runtime.NumGoroutine(), fdCount(t)
	mk := func() *Transport {
		tr := New().(*Transport)
		require.NoError(t, tr.Init(nccl.InitContext{Log: &captureLog{}}))
		return tr
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for r := 0; r < 100; r++ {
		abortRound(t, mk(), mk(), r%6, rng)
		if t.Failed() {
			t.Fatalf("round %d (variant %d) failed", r, r%6)
		}
	}
	settle(t, baseG, baseFD)
	after := rdmaResources(t)
	for _, k := range []string{"pd", "cq", "qp", "mr", "ctx"} {
		assert.Equal(t, before[k], after[k], "%s objects in the kernel before and after 100 aborted rounds", k)
	}
	t.Logf("verbs objects before %v, after %v", before, after)
}
