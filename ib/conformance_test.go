package ib

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
	"github.com/libnccl-net-go/libnccl-net-go/nccl/nccltest"
)

// conformanceModes are the configurations the whole nccltest suite runs in,
// on the software NIC here and on real verbs in the Soft-RoCE lane
// (TestRealVerbsConformance): each changes the work requests on the wire.
var conformanceModes = []struct{ name, env string }{
	{"default", ""},
	{"adaptive-routing", "NCCL_IB_ADAPTIVE_ROUTING=1 NCCL_IB_AR_THRESHOLD=0"},
	{"inline-cts", "NCCL_IB_USE_INLINE=1"},
	{"4-qps", "NCCL_IB_QPS_PER_CONNECTION=4"},
	{"4-qps-split", "NCCL_IB_QPS_PER_CONNECTION=4 NCCL_IB_SPLIT_DATA_ON_QPS=1"},
	{"relaxed-ordering", "NCCL_IB_PCI_RELAXED_ORDERING=1"},
}

func modeEnv(env string) []string {
	var kv []string
	for _, f := range strings.Fields(env) {
		k, v, _ := strings.Cut(f, "=")
		kv = append(kv, k, v)
	}
	return kv
}

// TestConformance runs the project's generic transport suite against ib on
// the software NIC in every mode, with flush forced so the loopback READ
// path runs too. The suite hands off-heap buffers and registers each (as
// NCCL's proxy does), so it runs under -race as well.
func TestConformance(t *testing.T) {
	for _, m := range conformanceModes {
		t.Run(m.name, func(t *testing.T) {
			setEnv(t, append([]string{"NCCL_GO_IB_FORCE_FLUSH", "1"}, modeEnv(m.env)...)...)
			f := softnic.NewFabric()
			f.AddDevice(softnic.DeviceConfig{Name: "sim0", LinkLayer: verbs.LinkEthernet})
			root := t.TempDir()
			if err := f.WriteSysfs(root); err != nil {
				t.Fatal(err)
			}
			nccltest.Run(t, func() nccl.Transport {
				return NewWithOptions(Options{Provider: f.Provider(verbs.Features{RegIova2: true, DMABuf: true, ECE: true}), SysfsRoot: root})
			}, modeOptions(8<<20))
			if v := f.Violations(); len(v) > 0 {
				t.Errorf("the software NIC saw a use-after-free or leak: %q", v)
			}
		})
	}
}

// TestRealVerbsConformance is the same suite on libibverbs, once per mode:
// the Soft-RoCE lane runs it over rxe0 (one guest boot for every mode). It
// skips, saying why, only where there is no RDMA device; inside the lane
// (RDMA_LANE=1) that is a failure. RDMA_LANE_CONFORMANCE_MODES restricts
// the modes (space-separated names); RDMA_LANE_CONFORMANCE_MAX the largest
// message (bytes, default 4 MiB: rxe under emulation moves tens of MB/s).
func TestRealVerbsConformance(t *testing.T) {
	requireRealDevice(t)
	want := strings.Fields(os.Getenv("RDMA_LANE_CONFORMANCE_MODES"))
	maxSize := 4 << 20
	if v, err := strconv.Atoi(os.Getenv("RDMA_LANE_CONFORMANCE_MAX")); err == nil && v > 0 {
		maxSize = v
	}
	for _, m := range conformanceModes {
		if len(want) > 0 && !contains(want, m.name) {
			continue
		}
		t.Run(m.name, func(t *testing.T) {
			overlayEnv(t, append([]string{"NCCL_GO_IB_FORCE_FLUSH", "1"}, modeEnv(m.env)...)...)
			opts := modeOptions(maxSize)
			// rxe builds and checksums every packet inside ibv_post_send.
			opts.PostsDoTheNICsWork = true
			nccltest.Run(t, New, opts)
		})
	}
}

// modeOptions: every mode runs every subtest. The concurrent set-up,
// registration and many-comms cases are the ones where a mode's extra QPs
// (4-qps: four per connection) or its registration flags (relaxed ordering)
// meet the device's limits, so no mode skips them.
func modeOptions(maxSize int) nccltest.Options {
	return nccltest.Options{MaxSize: maxSize, RequireDevice: true, Register: true}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
