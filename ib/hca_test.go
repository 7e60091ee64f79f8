package ib

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
)

func TestHCAFilter(t *testing.T) {
	for _, c := range []struct {
		spec string
		dev  string
		port int
		want bool
	}{
		{"", "mlx5_0", 1, true},
		{"mlx5", "mlx5_10", 1, true},
		{"mlx5_0:1,mlx5_1", "mlx5_0", 2, false},
		{"mlx5_0:1,mlx5_1", "mlx5_0", 1, true},
		{"mlx5_0:1,mlx5_1", "mlx5_1", 2, true},
		{"=mlx5_1", "mlx5_10", 1, false},
		{"=mlx5_1", "mlx5_1", 1, true},
		{"^mlx5_0", "mlx5_0", 1, false},
		{"^mlx5_0", "mlx5_1", 1, true},
		{"^=mlx5_1", "mlx5_10", 1, true},
		{"^=mlx5_1", "mlx5_1", 1, false},
		{"mlx5_0:1:0:1", "mlx5_0", 1, true}, // rail and plane do not select
		{"mlx5_0:x", "mlx5_0", 1, false},    // NCCL's atoi: port 0, no such port
	} {
		setEnv(t, "NCCL_IB_HCA", c.spec)
		f, spec := readHCAFilter(&captureLog{})
		assert.Equal(t, c.spec, spec)
		assert.Equal(t, c.want, f.match(c.dev, c.port), "NCCL_IB_HCA=%s %s:%d", c.spec, c.dev, c.port)
	}
}

// A malformed entry no longer makes ib unusable: the entry means what it
// means to NCCL (a port that is not a number selects no port), a WARN says
// so, and the other entries still work. Before, Init failed with
// ncclInvalidArgument and the job fell back to the socket transport.
func TestMalformedHCAEntryWarnsAndKeepsTheRest(t *testing.T) {
	h := hostWithHCAs(t, "mlx5_0:x,mlx5_1:1")
	require.Equal(t, 1, h.t.Devices())
	p, err := h.t.Properties(0)
	require.NoError(t, err)
	assert.Equal(t, "mlx5_1", p.Name)
	assert.True(t, h.log.has(`WARN NET/GoIB : NCCL_IB_HCA=mlx5_0:x,mlx5_1:1: port "x" in entry "mlx5_0:x" is not a decimal number; NCCL reads it as 0`), h.log.String())
}

// More than NCCL's 32 entries: NCCL uses the first 32; so do we, with a WARN.
func TestHCAListOverTheLimitKeepsTheFirst32(t *testing.T) {
	spec := "mlx5_0"
	for i := 1; i <= 32; i++ {
		spec += ",x" + string(rune('a'+i%26))
	}
	setEnv(t, "NCCL_IB_HCA", spec)
	log := &captureLog{}
	fl, _ := readHCAFilter(log)
	assert.Len(t, fl.list.Entries, 32)
	assert.True(t, fl.match("mlx5_0", 1))
	assert.True(t, log.has("more than 32 entries"), log.String())
}

// "mlx5_0:" (nothing after the colon) is any port in NCCL 2.30 but port 0,
// which matches nothing, in older NCCL: it is read the 2.30 way, and a WARN
// says how to write what was meant so the setting means the same everywhere.
func TestHCAEmptyPortWarns(t *testing.T) {
	h := hostWithHCAs(t, "mlx5_0:,mlx5_1::2")
	require.Equal(t, 2, h.t.Devices(), "the empty port is any port; so is the one before a rail")
	assert.True(t, h.log.has(`WARN NET/GoIB : NCCL_IB_HCA=mlx5_0:,mlx5_1::2: entry "mlx5_0:" has an empty port: read as any port of mlx5_0, as NCCL 2.30 does (older NCCL reads it as port 0 and uses no port of mlx5_0); write "mlx5_0" for every port or "mlx5_0:<port>" for one`), h.log.String())
	assert.Equal(t, 1, h.log.count("has an empty port"), "mlx5_1::2 gives a rail, not an empty port:\n%s", h.log.String())

	for _, spec := range []string{"mlx5_0", "mlx5_0:1", "^mlx5_0,mlx5_1:1", "mlx5_0::2"} {
		assert.Empty(t, emptyPortWarnings(spec), spec)
	}
	assert.Len(t, emptyPortWarnings("^=mlx5_0:,mlx5_1:"), 2)
}

// hostWithHCAs is a host with HCAs mlx5_0 and mlx5_1 and NCCL_IB_HCA=spec.
func hostWithHCAs(t *testing.T, spec string) *host {
	f := softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "mlx5_0"})
	f.AddDevice(softnic.DeviceConfig{Name: "mlx5_1"})
	setEnv(t, "NCCL_IB_HCA", spec)
	return newHost(t, f, verbs.Features{})
}
