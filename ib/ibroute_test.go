package ib

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// ibGID is an InfiniBand port GID: subnet prefix fe80:0:0:<subnet> with a
// FLID in bytes 4-5 (0: none), and an interface id.
func ibGID(flid, subnet uint16, iid byte) verbs.GID {
	return verbs.GID{0xfe, 0x80, 0, 0, byte(flid >> 8), byte(flid), byte(subnet >> 8), byte(subnet), 0, 0, 0, 0, 0, 0, 0, iid}
}

func ibHosts(t *testing.T, a, b softnic.DeviceConfig) (*softnic.Fabric, *host, *host) {
	f := softnic.NewFabric()
	a.Name, b.Name = "simA_0", "simB_0"
	f.AddDevice(a)
	f.AddDevice(b)
	return f, newHost(t, f, verbs.Features{}, "simA_0"), newHost(t, f, verbs.Features{}, "simB_0")
}

// A port flagged IBV_QPF_GRH_REQUIRED takes only address vectors with a GRH:
// the kernel refuses RTR without one. NCCL adds it there; until 2026-11-28 ib
// routed by LID alone and every connection (and the flush QP) failed at RTR.
func TestIBPortThatRequiresAGRH(t *testing.T) {
	setEnv(t, "NCCL_GO_IB_FORCE_FLUSH", "1")
	_, a, b := twoHosts(t, softnic.DeviceConfig{GRHRequired: true})
	sc, rc := connectPair(t, a, 0, b, 0)
	require.True(t, rc.flush.enabled)
	got, sizes := transfer(t, sc, rc, []int{5000}, []int{8192})
	assert.Equal(t, []int{5000}, sizes)
	assert.Equal(t, pattern(5000, 0), got[0][:5000])
	rb := newBuf(t, rc, 64, 0)
	r, err := rc.Iflush([]nccl.RecvBuffer{{Data: rb.ptr(), Size: 1, MH: rb.mh}})
	require.NoError(t, err)
	within(t, "flush", func() (bool, error) { return rc.Test(r, nil) })
}

// Ports in different subnets: a LID only reaches its own subnet, so NCCL
// routes with a GRH and the peer's FLID, which the routable-FLID GID index
// (NCCL_IB_ROUTABLE_FLID_GID_INDEX, 1) carries. Until 2026-11-28 ib used GID
// index 0 and LID routing only, and the two could not talk.
func TestIBAcrossSubnets(t *testing.T) {
	setEnv(t)
	gids := func(subnet uint16, iid byte) []softnic.GIDEntry {
		return []softnic.GIDEntry{{GID: ibGID(0, subnet, iid), Type: "IB/RoCE v1"}, {GID: ibGID(0x4000+subnet, subnet, iid), Type: "IB/RoCE v1"}}
	}
	_, a, b := ibHosts(t, softnic.DeviceConfig{GIDs: gids(1, 0xa)}, softnic.DeviceConfig{GIDs: gids(2, 0xb)})
	require.Equal(t, 1, a.t.devs[0].gidIndex, "the GID whose FLID is set")
	sc, rc := connectPair(t, a, 0, b, 0)
	got, sizes := transfer(t, sc, rc, []int{70000}, []int{70000})
	assert.Equal(t, []int{70000}, sizes)
	assert.Equal(t, pattern(70000, 0), got[0][:70000])

	// Without a FLID the GID index stays 0, as in NCCL.
	_, c, _ := ibHosts(t, softnic.DeviceConfig{}, softnic.DeviceConfig{})
	assert.Equal(t, 0, c.t.devs[0].gidIndex)
}

// A dual-port NIC exposed as two PCI functions, each with ibv port 1 and one
// sys_image_guid: NCCL reports port + the count of ports found before with
// the same merged PCI path (realPort), 1 and 2, so that its topology search
// sees two ports. Until 2026-11-28 both reported port 1, one port to NCCL.
func TestPortCountsEarlierPortsOfOneNIC(t *testing.T) {
	setEnv(t, "NCCL_IB_MERGE_NICS", "0")
	f := softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "mlx5_0", GUID: 0xabc, PCIPath: "/sys/devices/pci0000:17/0000:17:00.0"})
	f.AddDevice(softnic.DeviceConfig{Name: "mlx5_1", GUID: 0xabc, PCIPath: "/sys/devices/pci0000:17/0000:17:00.1"})
	f.AddDevice(softnic.DeviceConfig{Name: "mlx5_2", PCIPath: "/sys/devices/pci0000:31/0000:31:00.0"})
	h := newHost(t, f, verbs.Features{})
	var ports []int
	for d := 0; d < h.t.Devices(); d++ {
		p, err := h.t.Properties(d)
		require.NoError(t, err)
		ports = append(ports, p.Port)
	}
	assert.Equal(t, []int{1, 2, 1}, ports)
}

// A device without a PCI path (a virtual NIC) is numbered after the others,
// as NCCL's ncclIbCompareDevs orders it; it came first until 2026-11-28.
func TestDeviceWithoutPCIPathComesLast(t *testing.T) {
	setEnv(t)
	f := softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "mlx5_0"})
	f.AddDevice(softnic.DeviceConfig{Name: "mlx5_1"})
	f.AddDevice(softnic.DeviceConfig{Name: "virt0"})
	root := t.TempDir()
	require.NoError(t, f.WriteSysfs(root))
	require.NoError(t, os.Remove(filepath.Join(root, "class", "infiniband", "virt0", "device")))
	tr := NewWithOptions(Options{Provider: f.Provider(verbs.Features{}), SysfsRoot: root})
	require.NoError(t, tr.Init(nccl.InitContext{Log: &captureLog{}}))
	defer tr.Finalize()
	var names []string
	for d := 0; d < tr.Devices(); d++ {
		p, err := tr.Properties(d)
		require.NoError(t, err)
		names = append(names, p.Name)
	}
	assert.Equal(t, []string{"mlx5_0", "mlx5_1", "virt0"}, names)
}
