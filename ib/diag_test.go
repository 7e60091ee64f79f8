package ib

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/sysfs/sysfstest"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/internal/diag"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

func diagnoseFabric(t *testing.T, f *softnic.Fabric) diag.Transport {
	t.Helper()
	return diagnoseFabricWith(t, f, verbs.Features{})
}

func diagnoseFabricWith(t *testing.T, f *softnic.Fabric, feat verbs.Features) diag.Transport {
	t.Helper()
	root := t.TempDir()
	require.NoError(t, f.WriteSysfs(root))
	r := diag.Diagnose([]nccl.Registration{{Name: "ib", Priority: 10, New: func() nccl.Transport {
		return NewWithOptions(Options{Provider: f.Provider(feat), SysfsRoot: root})
	}}}, diag.Options{SysfsRoot: root})
	require.Len(t, r.Transports, 1)
	return r.Transports[0]
}

func portByName(ps []diag.Port, dev string, port int) diag.Port {
	for _, p := range ps {
		if p.Device == dev && p.Port == port {
			return p
		}
	}
	return diag.Port{}
}

func TestExplainPortsUsedAndSkipped(t *testing.T) {
	f := softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "mlx5_0", Ports: 2})
	f.AddDevice(softnic.DeviceConfig{Name: "mlx5_1"}).SetPortState(1, verbs.PortDown)
	f.AddDevice(softnic.DeviceConfig{Name: "roce0", LinkLayer: verbs.LinkEthernet})
	setEnv(t, "NCCL_IB_HCA", "^mlx5_0:2")
	d := diagnoseFabric(t, f)
	require.True(t, d.Usable, d.Reason)

	p := portByName(d.Ports, "mlx5_0", 1)
	assert.True(t, p.Used)
	require.NotNil(t, p.DeviceIndex)
	assert.Equal(t, "IB", p.LinkLayer)
	assert.Equal(t, "ACTIVE", p.State)
	assert.Equal(t, 100000, p.SpeedMbps)
	assert.Equal(t, 0, *p.GIDIndex, "IB ports always use GID 0")

	assert.Equal(t, "excluded by NCCL_IB_HCA=^mlx5_0:2", portByName(d.Ports, "mlx5_0", 2).Why)
	assert.Equal(t, "port is DOWN, not ACTIVE", portByName(d.Ports, "mlx5_1", 1).Why)

	r := portByName(d.Ports, "roce0", 1)
	assert.True(t, r.Used)
	require.NotNil(t, r.GIDIndex)
	assert.Equal(t, 3, *r.GIDIndex, "the IPv4 RoCE v2 GID")
	assert.Equal(t, "::ffff:192.0.2.18", r.GID)
	assert.Equal(t, 2, r.RoCEVersion)
	assert.Equal(t, "roce0_eth", r.NetDev)

	// The devices NCCL sees carry the same facts.
	require.Len(t, d.Devices, 2)
	var roce diag.Device
	for _, x := range d.Devices {
		if x.Name == "roce0" {
			roce = x
		}
	}
	assert.Equal(t, "RoCE", roce.LinkLayer)
	require.NotNil(t, roce.GIDIndex)
	assert.Equal(t, 3, *roce.GIDIndex)
	assert.Equal(t, "::ffff:192.0.2.18", roce.GID)
	assert.Equal(t, "roce0_eth", roce.NetDev)
	assert.Equal(t, 4096, roce.MTU)

	require.NotNil(t, d.Handshake)
	assert.Equal(t, "lo", d.Handshake.Name)
	assert.True(t, d.Handshake.Used)
	require.NotNil(t, d.Fusion)
	assert.True(t, d.Fusion.Supported)
}

func TestExplainForcedGIDIndexOutOfRange(t *testing.T) {
	f := softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "roce0", LinkLayer: verbs.LinkEthernet})
	setEnv(t, "NCCL_IB_GID_INDEX", "9")
	d := diagnoseFabric(t, f)
	assert.False(t, d.Usable)
	assert.Contains(t, d.Reason, "no ACTIVE IB or RoCE port")
	assert.Contains(t, portByName(d.Ports, "roce0", 1).Why, "NCCL_IB_GID_INDEX=9 but roce0 port 1 has 4 GIDs")
	assert.True(t, strings.HasPrefix(d.Log[len(d.Log)-1], "WARN NET/GoIB : roce0:1 skipped"), "the plugin's own WARN is kept: %q", d.Log)
}

func TestExplainQualifyingPortOfUnusableTransport(t *testing.T) {
	f := softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "mlx5_0"})
	setEnv(t, "NCCL_SOCKET_IFNAME", "=nosuchif0")
	d := diagnoseFabric(t, f)
	assert.False(t, d.Usable)
	assert.Contains(t, d.Reason, "no interface for the IB out-of-band handshake")
	assert.Contains(t, portByName(d.Ports, "mlx5_0", 1).Why, "the port qualifies, but the transport is not usable: ")
	require.NotNil(t, d.Handshake)
	assert.Contains(t, d.Handshake.Why, "NCCL_SOCKET_IFNAME==nosuchif0")
}

func TestExplainDisabledListsSysfsPorts(t *testing.T) {
	setEnv(t, "NCCL_IB_DISABLE", "1")
	root := sysfstest.Tree(t)
	r := diag.Diagnose([]nccl.Registration{{Name: "ib", Priority: 10, New: func() nccl.Transport {
		return NewWithOptions(Options{SysfsRoot: root})
	}}}, diag.Options{SysfsRoot: root})
	d := r.Transports[0]
	assert.False(t, d.Usable)
	assert.Contains(t, d.Reason, "NCCL_IB_DISABLE=1")
	require.Len(t, d.Ports, 2)
	assert.Equal(t, diag.Port{Device: "mlx5_0", Port: 1, State: "ACTIVE", LinkLayer: "IB",
		PCIPath: "/sys/devices/pci0000:00/0000:00:03.0/0000:03:00.0",
		Why:     "no usable device: NCCL_IB_DISABLE=1 (port seen in sysfs only)"}, d.Ports[0])
	assert.Equal(t, "RoCE", d.Ports[1].LinkLayer)
}

// TestExplainShowsTheReportedSpeed: every port, used or not, shows the speed
// the transport reports to NCCL: on a LAG function, what
// ibv_query_port_speed answers, not one link's lane rate × width.
func TestExplainShowsTheReportedSpeed(t *testing.T) {
	f := softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "mlx5_bond_0", Ports: 2, EffectiveSpeed: 200000})
	setEnv(t, "NCCL_IB_HCA", "^mlx5_bond_0:2")
	d := diagnoseFabricWith(t, f, verbs.Features{PortSpeed: true})
	require.True(t, d.Usable, d.Reason)
	assert.True(t, portByName(d.Ports, "mlx5_bond_0", 1).Used)
	assert.Equal(t, 200000, portByName(d.Ports, "mlx5_bond_0", 1).SpeedMbps)
	assert.Equal(t, 200000, portByName(d.Ports, "mlx5_bond_0", 2).SpeedMbps, "an excluded port")

	setEnv(t, "NCCL_IB_HCA", "^mlx5_bond_0:2", "NCCL_IB_QUERY_PORT_SPEED", "0")
	d = diagnoseFabricWith(t, f, verbs.Features{PortSpeed: true})
	assert.Equal(t, 100000, portByName(d.Ports, "mlx5_bond_0", 1).SpeedMbps)
	assert.Equal(t, 100000, portByName(d.Ports, "mlx5_bond_0", 2).SpeedMbps)
}
