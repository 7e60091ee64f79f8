package ib

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

func TestChunkSizeIs128Aligned(t *testing.T) {
	for _, c := range []struct{ size, nq, want int }{{1, 1, 128}, {1000, 4, 256}, {1 << 20, 3, 349568}, {128, 2, 128}, {0, 2, 0}} {
		got := chunkSize(c.size, c.nq)
		assert.Equal(t, c.want, got, "%+v", c)
		assert.Zero(t, got%chunkAlign)
		assert.GreaterOrEqual(t, got*c.nq, c.size)
	}
}

func TestDiscoveryFiltersAndProperties(t *testing.T) {
	f := softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "mlx5_1", Ports: 2, MaxQP: 1000, GUID: 0xabc})
	f.AddDevice(softnic.DeviceConfig{Name: "mlx5_0"})
	down := f.AddDevice(softnic.DeviceConfig{Name: "mlx5_2"})
	down.SetPortState(1, verbs.PortDown)
	setEnv(t)
	h := newHost(t, f, verbs.Features{})
	require.Equal(t, 3, h.t.Devices(), "mlx5_1 ports 1 and 2, mlx5_0; the DOWN port is skipped")
	assert.True(t, h.log.has("mlx5_2:1 is DOWN, not ACTIVE"), h.log.String())
	p, err := h.t.Properties(2)
	require.NoError(t, err)
	// Devices are ordered by PCI path: mlx5_1 was added first (bus 01).
	assert.Equal(t, "mlx5_0", p.Name)
	p, err = h.t.Properties(0)
	require.NoError(t, err)
	assert.Equal(t, nccl.Properties{Name: "mlx5_1", PCIPath: "/sys/devices/pci0000:01/0000:01:00.0", GUID: 0xabc,
		PtrSupport: nccl.PtrHost, RegIsGlobal: true, Speed: 100000, Port: 1, MaxComms: 1000, MaxRecvs: 8, VDevs: []int{0},
		MaxP2PBytes: nccl.MaxNetSizeBytes, MaxCollBytes: nccl.MaxCollSize}, p)
	p, _ = h.t.Properties(1)
	// NCCL reports ibv port + realPort, the ports found before on the same
	// PCI function: 2 + 1 for the second port of a one-function card.
	assert.Equal(t, 3, p.Port)

	setEnv(t, "NCCL_IB_HCA", "mlx5_1:2")
	h = newHost(t, f, verbs.Features{})
	require.Equal(t, 1, h.t.Devices())
	p, _ = h.t.Properties(0)
	assert.Equal(t, []any{"mlx5_1", 2}, []any{p.Name, p.Port})

	setEnv(t, "NCCL_IB_HCA", "^mlx5_1")
	h = newHost(t, f, verbs.Features{})
	require.Equal(t, 1, h.t.Devices())

	setEnv(t, "NCCL_IB_HCA", "mlx5_7")
	tr := NewWithOptions(Options{Provider: f.Provider(verbs.Features{}), SysfsRoot: t.TempDir()})
	err = tr.Init(nccl.InitContext{Log: &captureLog{}})
	assert.True(t, errors.Is(err, nccl.ErrNoDevice), "%v", err)
	assert.ErrorContains(t, err, "NCCL_IB_HCA=mlx5_7")
}

func TestInitFallsBackWithErrNoDevice(t *testing.T) {
	setEnv(t, "NCCL_IB_DISABLE", "1")
	err := New().Init(nccl.InitContext{Log: &captureLog{}})
	assert.True(t, errors.Is(err, nccl.ErrNoDevice))
	assert.ErrorContains(t, err, "NCCL_IB_DISABLE=1")

	setEnv(t)
	err = NewWithOptions(Options{Provider: softnic.NewFabric().Provider(verbs.Features{})}).Init(nccl.InitContext{})
	assert.True(t, errors.Is(err, nccl.ErrNoDevice), "%v", err)

	// On this build host libibverbs may be present but there is no device, or
	// it is absent: either way the real transport must say ErrNoDevice. The
	// set library that does not load gets a WARN, and NCCL's defaults are
	// tried after it, as NCCL does.
	setEnv(t, "NCCL_IBVERBS_LIB", "/nonexistent/libibverbs.so.1")
	log := &captureLog{}
	err = New().Init(nccl.InitContext{Log: log})
	assert.True(t, errors.Is(err, nccl.ErrNoDevice), "%v", err)
	assert.True(t, log.has("NCCL_IBVERBS_LIB=/nonexistent/libibverbs.so.1: "), log.String())
	assert.True(t, log.has("trying libibverbs.so and libibverbs.so.1, as NCCL does"), log.String())
	if !libibverbsInstalled() {
		assert.ErrorContains(t, err, "NCCL_IBVERBS_LIB=/nonexistent/libibverbs.so.1")
		assert.ErrorContains(t, err, "dlopen(libibverbs.so.1)", "the defaults were tried after the set library")
	}
}

// libibverbsInstalled is whether the loader finds rdma-core's soname.
func libibverbsInstalled() bool {
	for _, dir := range []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
		"/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu"} {
		if _, err := os.Stat(dir + "/libibverbs.so.1"); err == nil {
			return true
		}
	}
	return false
}

func TestPtrSupportAndFeatureLogs(t *testing.T) {
	f := softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "sim0"})
	setEnv(t)
	h := newHost(t, f, verbs.Features{})
	p, _ := h.t.Properties(0)
	assert.Equal(t, nccl.PtrHost, p.PtrSupport)
	assert.True(t, h.log.has("no ibv_reg_dmabuf_mr"), "missing optional verbs are INFO lines")
	assert.True(t, h.log.has("ECE negotiation disabled"))

	h = newHost(t, f, verbs.Features{DMABuf: true, ECE: true, RegIova2: true})
	p, _ = h.t.Properties(0)
	assert.Equal(t, nccl.PtrHost|nccl.PtrDMABuf, p.PtrSupport, "the fd=-1 probe said EBADF")

	setEnv(t, "NCCL_DMABUF_ENABLE", "0")
	h = newHost(t, f, verbs.Features{DMABuf: true})
	p, _ = h.t.Properties(0)
	assert.Equal(t, nccl.PtrHost, p.PtrSupport)

	// A peer-memory module makes CUDA registrations possible.
	setEnv(t)
	root := t.TempDir()
	require.NoError(t, f.WriteSysfs(root))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "module/nvidia_peermem"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "module/nvidia_peermem/version"), []byte("1\n"), 0o644))
	tr := NewWithOptions(Options{Provider: f.Provider(verbs.Features{}), SysfsRoot: root})
	require.NoError(t, tr.Init(nccl.InitContext{}))
	defer tr.Finalize()
	p, _ = tr.Properties(0)
	assert.Equal(t, nccl.PtrHost|nccl.PtrCUDA, p.PtrSupport)
}

func TestRoCEGIDSelection(t *testing.T) {
	f := softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "rxe0", LinkLayer: verbs.LinkEthernet})
	v6 := verbs.GID(netip.MustParseAddr("2001:db8::5").As16())
	v4 := verbs.GID(netip.AddrFrom16(netip.MustParseAddr("10.1.2.3").As16()).As16())
	v4b := verbs.GID(netip.AddrFrom16(netip.MustParseAddr("192.168.7.7").As16()).As16())
	ll := verbs.GID(netip.MustParseAddr("fe80::1").As16())
	f.AddDevice(softnic.DeviceConfig{Name: "roce1", LinkLayer: verbs.LinkEthernet, GIDs: []softnic.GIDEntry{
		{GID: ll, Type: "IB/RoCE v1"}, {GID: ll, Type: "RoCE v2"}, {GID: v6, Type: "RoCE v2"},
		{GID: v4, Type: "IB/RoCE v1"}, {GID: v4, Type: "RoCE v2"}, {GID: v4b, Type: "RoCE v2"}}})
	gidOf := func(dev string) int {
		h := newHost(t, f, verbs.Features{}, dev)
		return h.t.devs[0].gidIndex
	}
	setEnv(t)
	assert.Equal(t, 3, gidOf("rxe0"), "rxe layout: the IPv4 RoCE v2 GID is index 3")
	assert.Equal(t, 4, gidOf("roce1"), "first IPv4 RoCE v2")
	setEnv(t, "NCCL_IB_ADDR_RANGE", "192.168.0.0/16")
	assert.Equal(t, 5, gidOf("roce1"))
	setEnv(t, "NCCL_IB_ROCE_VERSION_NUM", "1")
	assert.Equal(t, 3, gidOf("roce1"))
	setEnv(t, "NCCL_IB_ADDR_FAMILY", "AF_INET6")
	assert.Equal(t, 2, gidOf("roce1"))
	setEnv(t, "NCCL_IB_GID_INDEX", "5")
	assert.Equal(t, 5, gidOf("roce1"))
	setEnv(t, "NCCL_IB_GID_INDEX", "9")
	tr := NewWithOptions(Options{Provider: f.Provider(verbs.Features{}, "roce1"), SysfsRoot: t.TempDir()})
	cl := &captureLog{}
	assert.Error(t, tr.Init(nccl.InitContext{Log: cl}))
	assert.True(t, cl.has("NCCL_IB_GID_INDEX=9"), cl.String())

	// As in NCCL, a GID whose type sysfs cannot report (EINVAL: not mapped
	// into this network namespace) can still win on family, but never on
	// RoCE version: without any types file the first IPv4 GID is chosen
	// (index 3, RoCE v1), not the v2 one after it.
	setEnv(t)
	tr = NewWithOptions(Options{Provider: f.Provider(verbs.Features{}, "roce1"), SysfsRoot: t.TempDir()})
	require.NoError(t, tr.Init(nccl.InitContext{Log: &captureLog{}}))
	defer tr.Finalize()
	assert.Equal(t, 3, tr.devs[0].gidIndex)
}

// NCCL's ncclIbGetGidIndex starts at index 0 and keeps it when no candidate
// qualifies; it does not check the result. A RoCE port whose netdev has no
// IP address so keeps its link-local GID at index 0, which works within one
// L2 segment: the port is used, with a WARN, not skipped (which moved the
// job to sockets).
func TestRoCELinkLocalGIDFallback(t *testing.T) {
	f := softnic.NewFabric()
	ll := verbs.GID(netip.MustParseAddr("fe80::1").As16())
	f.AddDevice(softnic.DeviceConfig{Name: "noip0", LinkLayer: verbs.LinkEthernet, GIDs: []softnic.GIDEntry{
		{GID: ll, Type: "IB/RoCE v1"}, {GID: ll, Type: "RoCE v2"}}})
	setEnv(t)
	h := newHost(t, f, verbs.Features{}, "noip0")
	require.Len(t, h.t.devs, 1, h.log.String())
	assert.Equal(t, 0, h.t.devs[0].gidIndex)
	assert.Equal(t, ll, h.t.devs[0].gid)
	assert.True(t, h.log.has("NET/GoIB : noip0:1 has no routable IPv4 GID: using GID index 0 (fe80::1), a link-local GID, as NCCL does; it only reaches peers within one L2 segment. Give the port's netdev an IP address, or set NCCL_IB_GID_INDEX (or NCCL_IB_ADDR_FAMILY)"), h.log.String())
}

// A RoCE port whose GID table holds nothing usable, not even a link-local
// GID, is skipped: NCCL would use the empty entry and fail every connection.
func TestRoCEEmptyGIDTableSkipsThePort(t *testing.T) {
	f := softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "nogid0", LinkLayer: verbs.LinkEthernet, GIDs: []softnic.GIDEntry{
		{GID: verbs.GID{}, Type: "IB/RoCE v1"}}})
	f.AddDevice(softnic.DeviceConfig{Name: "good0", LinkLayer: verbs.LinkEthernet})
	setEnv(t)
	h := newHost(t, f, verbs.Features{}, "nogid0", "good0")
	require.Len(t, h.t.devs, 1, h.log.String())
	assert.Equal(t, "good0", h.t.devs[0].name)
	assert.True(t, h.log.has("NET/GoIB : nogid0:1 skipped: its GID table has no entry to use (index 0 is empty)"), h.log.String())
}

// NCCL's linkLocalGid is fe80::/64, not all of fe80::/10: fe80:0:0:1::5 is
// a valid GID to NCCL, so its RoCE v2 entry wins over the link-local one.
func TestRoCELinkLocalIsFe80Slash64(t *testing.T) {
	f := softnic.NewFabric()
	ll := verbs.GID(netip.MustParseAddr("fe80::1").As16())
	site := verbs.GID(netip.MustParseAddr("fe80:0:0:1::5").As16())
	f.AddDevice(softnic.DeviceConfig{Name: "fe80x0", LinkLayer: verbs.LinkEthernet, GIDs: []softnic.GIDEntry{
		{GID: ll, Type: "IB/RoCE v1"}, {GID: site, Type: "IB/RoCE v1"}, {GID: site, Type: "RoCE v2"}}})
	setEnv(t, "NCCL_IB_ADDR_FAMILY", "AF_INET6")
	h := newHost(t, f, verbs.Features{}, "fe80x0")
	require.Len(t, h.t.devs, 1, h.log.String())
	assert.Equal(t, 2, h.t.devs[0].gidIndex, "fe80:0:0:1::5 is routable to NCCL: the RoCE v2 one wins")
	assert.Zero(t, h.log.count("WARN"), h.log.String())
}

func TestRoCEEndToEnd(t *testing.T) {
	setEnv(t, "NCCL_GO_IB_FORCE_FLUSH", "1", "NCCL_IB_TC", "106")
	_, a, b := twoHosts(t, softnic.DeviceConfig{LinkLayer: verbs.LinkEthernet})
	sc, rc := connectPair(t, a, 0, b, 0)
	got, sizes := transfer(t, sc, rc, []int{5000}, []int{8192})
	assert.Equal(t, []int{5000}, sizes)
	assert.Equal(t, pattern(5000, 0), got[0][:5000])
	assert.Equal(t, "simB_0_eth", b.t.devs[0].netdev)
}

// NCCL resolves the GID per connection (ncclIbGetGidIndex in connect and
// accept), so a RoCE address that changes during a long job is picked up by
// the next connection instead of leaving a stale GID fixed at init.
func TestGIDResolvedPerConnection(t *testing.T) {
	setEnv(t)
	f, a, b := roceHosts(t)
	sc, rc := connectPair(t, a, 0, b, 0)
	assert.Equal(t, 3, sc.devs[0].gidIndex, "rxe layout: IPv4 RoCE v2 at index 3")
	// Both hosts' netdevs get new addresses: index 3 goes away, the new
	// IPv4 address appears as RoCE v2 at index 2.
	for i, name := range []string{"simA_0", "simB_0"} {
		d := f.Device(name)
		d.SetGID(1, 3, softnic.GIDEntry{Type: "RoCE v2"})
		d.SetGID(1, 2, softnic.GIDEntry{GID: verbs.GID(netip.AddrFrom16(netip.AddrFrom4([4]byte{198, 51, 100, byte(1 + i)}).As16()).As16()), Type: "RoCE v2"})
	}
	require.NoError(t, f.WriteSysfs(a.root))
	require.NoError(t, f.WriteSysfs(b.root))
	sc2, rc2 := connectPair(t, a, 0, b, 0)
	assert.Equal(t, 2, sc2.devs[0].gidIndex)
	assert.Equal(t, 2, rc2.devs[0].gidIndex)
	assert.True(t, a.log.has("GID index 2 (::ffff:198.51.100.1) now, 3 ("), a.log.String())
	got, _ := transfer(t, sc2, rc2, []int{777}, []int{777})
	assert.Equal(t, pattern(777, 0), got[0][:777])
	_, _ = sc, rc

	// A better GID that appears while the chosen one stays valid is picked
	// up through the kernel's IBV_EVENT_GID_CHANGE (index 1 becomes an IPv4
	// RoCE v2 address: the first one wins, as in NCCL's scan).
	for i, name := range []string{"simA_0", "simB_0"} {
		f.Device(name).SetGID(1, 1, softnic.GIDEntry{GID: verbs.GID(netip.AddrFrom16(netip.AddrFrom4([4]byte{198, 51, 100, byte(11 + i)}).As16()).As16()), Type: "RoCE v2"})
	}
	require.NoError(t, f.WriteSysfs(a.root))
	require.NoError(t, f.WriteSysfs(b.root))
	for _, h := range []*host{a, b} {
		// Three events per host so far: two SetGID calls above, one here.
		within(t, "GID_CHANGE seen", func() (bool, error) { return h.log.count("IBV_EVENT_GID_CHANGE") == 3, nil })
	}
	sc3, rc3 := connectPair(t, a, 0, b, 0)
	assert.Equal(t, 1, sc3.devs[0].gidIndex)
	assert.Equal(t, 1, rc3.devs[0].gidIndex)
	assert.Equal(t, 2, sc2.devs[0].gidIndex, "connections keep the GID they were made with")
}

func TestMergePCIPath(t *testing.T) {
	for _, c := range []struct {
		in       string
		mergeVFs bool
		want     string
	}{
		{"/sys/devices/pci0000:16/0000:17:00.1", true, "/sys/devices/pci0000:16/0000:17:00.0"},
		{"/sys/devices/pci0000:16/0000:17:02.3", true, "/sys/devices/pci0000:16/0000:17:00.0"},
		{"/sys/devices/pci0000:16/0000:17:02.3", false, "/sys/devices/pci0000:16/0000:17:02.0"},
		{"", true, ""},
	} {
		assert.Equal(t, c.want, mergePCIPath(c.in, c.mergeVFs), "%+v", c)
	}
	// Two VFs of one NIC are one topology node unless NCCL_IB_MERGE_VFS=0.
	f := softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "mlx5_2", PCIPath: "/sys/devices/pci0000:16/0000:17:00.2"})
	f.AddDevice(softnic.DeviceConfig{Name: "mlx5_3", PCIPath: "/sys/devices/pci0000:16/0000:17:01.3"})
	paths := func() []string {
		h := newHost(t, f, verbs.Features{})
		var out []string
		for d := 0; d < h.t.Devices(); d++ {
			p, err := h.t.Properties(d)
			require.NoError(t, err)
			out = append(out, p.PCIPath)
		}
		return out
	}
	setEnv(t)
	assert.Equal(t, []string{"/sys/devices/pci0000:16/0000:17:00.0", "/sys/devices/pci0000:16/0000:17:00.0"}, paths())
	setEnv(t, "NCCL_IB_MERGE_VFS", "0")
	assert.Equal(t, []string{"/sys/devices/pci0000:16/0000:17:00.0", "/sys/devices/pci0000:16/0000:17:01.0"}, paths())
}

// probeProvider answers the dma-buf probe (a 0-byte registration of fd -1)
// with a chosen errno, as a real kernel does: ib_umem_dmabuf_get rejects the
// 0-byte range with EINVAL before it looks at the fd, so a device that
// supports dma-buf does not say EBADF to the probe.
type probeProvider struct {
	verbs.Provider
	probe verbs.Errno
}
type probeContext struct {
	verbs.Context
	probe verbs.Errno
}
type probePD struct {
	verbs.PD
	probe verbs.Errno
}

func (p probeProvider) Open(name string) (verbs.Context, error) {
	c, err := p.Provider.Open(name)
	if err != nil {
		return nil, err
	}
	return probeContext{c, p.probe}, nil
}

func (c probeContext) AllocPD() (verbs.PD, error) {
	pd, err := c.Context.AllocPD()
	if err != nil {
		return nil, err
	}
	return probePD{pd, c.probe}, nil
}

func (p probePD) RegDMABufMR(offset uint64, length int, iova uint64, fd int, access verbs.Access) (verbs.MR, error) {
	if length == 0 && fd < 0 {
		return nil, p.probe
	}
	return p.PD.RegDMABufMR(offset, length, iova, fd, access)
}

// NCCL counts dma-buf as supported unless the fd=-1 probe fails with
// EOPNOTSUPP or EPROTONOSUPPORT; requiring exactly EBADF turned dma-buf off
// on real devices, whose kernel answers the 0-byte probe with EINVAL.
func TestDMABufProbeAcceptsWhatNCCLAccepts(t *testing.T) {
	setEnv(t)
	f := softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "sim0"})
	for _, c := range []struct {
		probe verbs.Errno
		want  nccl.PtrType
	}{
		{verbs.EINVAL, nccl.PtrHost | nccl.PtrDMABuf},
		{verbs.EBADF, nccl.PtrHost | nccl.PtrDMABuf},
		{verbs.EOPNOTSUPP, nccl.PtrHost},
		{verbs.EPROTONOSUPPORT, nccl.PtrHost},
	} {
		tr := NewWithOptions(Options{Provider: probeProvider{f.Provider(verbs.Features{DMABuf: true}), c.probe}, SysfsRoot: t.TempDir()})
		require.NoError(t, tr.Init(nccl.InitContext{}))
		p, err := tr.Properties(0)
		require.NoError(t, err)
		assert.Equal(t, c.want, p.PtrSupport, "probe failing with %v", c.probe)
		require.NoError(t, tr.Finalize())
	}
}

// TestPortSpeedFromQueryPortSpeed: with ibv_query_port_speed, a port reports
// the provider's effective bandwidth (NCCL 2.30's NCCL_IB_QUERY_PORT_SPEED=1
// default), here a function over a LAG of two 4x EDR links whose lane rate ×
// width says one; without the verb, with the variable at 0, when the kernel
// refuses the call or when it answers 0, lane rate × width, and a refusal is
// an INFO, not a WARN.
func TestPortSpeedFromQueryPortSpeed(t *testing.T) {
	const lanes, lag = 100000, 200000 // 4x EDR; two of them
	for _, c := range []struct {
		name string
		env  []string
		feat verbs.Features
		dev  softnic.DeviceConfig
		want int
		info string
	}{
		{"LAG", nil, verbs.Features{PortSpeed: true}, softnic.DeviceConfig{EffectiveSpeed: lag}, lag, "effective speed 200000 Mbps (ibv_query_port_speed), lane rate × width 100000 Mbps"},
		{"off", []string{"NCCL_IB_QUERY_PORT_SPEED", "0"}, verbs.Features{PortSpeed: true}, softnic.DeviceConfig{EffectiveSpeed: lag}, lanes, ""},
		{"no verb", nil, verbs.Features{}, softnic.DeviceConfig{EffectiveSpeed: lag}, lanes, "has no ibv_query_port_speed"},
		{"kernel without it", nil, verbs.Features{PortSpeed: true}, softnic.DeviceConfig{PortSpeedErr: verbs.EPROTONOSUPPORT}, lanes, "ibv_query_port_speed: errno 93 (EPROTONOSUPPORT); reporting lane rate × width (100000 Mbps)"},
		{"zero", nil, verbs.Features{PortSpeed: true}, softnic.DeviceConfig{}, lanes, "ibv_query_port_speed answered 0 Mbps"},
		{"too large", nil, verbs.Features{PortSpeed: true}, softnic.DeviceConfig{EffectiveSpeed: 1 << 40}, lanes, "ibv_query_port_speed answered 1099511627776 Mbps"},
		{"same as the lanes", nil, verbs.Features{PortSpeed: true}, softnic.DeviceConfig{EffectiveSpeed: lanes}, lanes, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			setEnv(t, c.env...)
			f := softnic.NewFabric()
			c.dev.Name = "mlx5_0"
			f.AddDevice(c.dev)
			h := newHost(t, f, c.feat)
			p, err := h.t.Properties(0)
			require.NoError(t, err)
			assert.Equal(t, c.want, p.Speed)
			if c.info != "" {
				assert.True(t, h.log.has(c.info), "no INFO %q in:\n%s", c.info, h.log.String())
			}
			assert.Equal(t, c.want != lanes, h.log.has("effective speed"), "an INFO about the effective speed only when it differs:\n%s", h.log.String())
			assert.False(t, h.log.has("WARN"), h.log.String())
		})
	}
}

// TestPortSpeedXDRFromActiveSpeedEx: an XDR port (ConnectX-8, 200 Gb/s per
// lane) reports its lane rate in active_speed_ex; the kernel caps the 8-bit
// active_speed at NDR. NCCL 2.30 (init.cc, ncclIbInitDevices) uses
// active_speed_ex when it is not 0, so a 4x XDR port is 800 Gb/s; without
// ibv_query_port_speed (or with the kernel refusing it) lane rate × width
// must do the same, not report half.
func TestPortSpeedXDRFromActiveSpeedEx(t *testing.T) {
	for _, c := range []struct {
		name string
		feat verbs.Features
		dev  softnic.DeviceConfig
	}{
		{"no verb", verbs.Features{}, softnic.DeviceConfig{}},
		{"kernel without it", verbs.Features{PortSpeed: true}, softnic.DeviceConfig{PortSpeedErr: verbs.EOPNOTSUPP}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := softnic.NewFabric()
			c.dev.Name, c.dev.Speed, c.dev.SpeedEx, c.dev.Width = "mlx5_0", 128, 256, 2
			f.AddDevice(c.dev)
			h := newHost(t, f, c.feat)
			p, err := h.t.Properties(0)
			require.NoError(t, err)
			assert.Equal(t, 800000, p.Speed, "4x XDR")
		})
	}
}

// An NCCL_IB_HCA that selects none of the host's usable ports (a typo, a
// port the card lacks, an exclusion of everything) used to leave the ib
// transport without a device and the job on the socket fallback with INFO
// lines only: at NCCL_DEBUG=WARN the job silently ran over TCP.
func TestHCAFilterSelectingNothingWarns(t *testing.T) {
	f := softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "mlx5_0"})
	f.AddDevice(softnic.DeviceConfig{Name: "mlx5_1", Ports: 2})
	down := f.AddDevice(softnic.DeviceConfig{Name: "mlx5_2"})
	down.SetPortState(1, verbs.PortDown)
	init := func(spec string) (*captureLog, error) {
		setEnv(t, "NCCL_IB_HCA", spec)
		log := &captureLog{}
		err := NewWithOptions(Options{Provider: f.Provider(verbs.Features{}), SysfsRoot: t.TempDir()}).Init(nccl.InitContext{Log: log})
		return log, err
	}
	for _, spec := range []string{"mlx5_O", "=mlx5_0:3", "^mlx5", "^=mlx5_0,mlx5_1"} {
		log, err := init(spec)
		assert.True(t, errors.Is(err, nccl.ErrNoDevice), "%s: %v", spec, err)
		assert.Equal(t, 1, log.count("WARN NET/GoIB : NCCL_IB_HCA="+spec+" selects none of this host's ACTIVE RDMA ports (mlx5_0:1, mlx5_1:1, mlx5_1:2;"), "%s:\n%s", spec, log)
		assert.True(t, log.has("falls back to the socket transport (TCP) unless NCCL_GO_TRANSPORT=ib"), log.String())
	}
	log, _ := init("=mlx5_0:3")
	assert.True(t, log.has("WARN NET/GoIB : NCCL_IB_HCA==mlx5_0:3: entry mlx5_0:3 names a port that mlx5_0 (ports 1-1) does not have"), log.String())

	// A port the card lacks is worth a WARN even when other entries select
	// something; a port that one of the prefix's HCAs has is not.
	log, err := init("mlx5_0:3,mlx5_1")
	require.NoError(t, err)
	assert.True(t, log.has("entry mlx5_0:3 names a port that mlx5_0 (ports 1-1) does not have"), log.String())
	assert.False(t, log.has("selects none"), log.String())
	for _, spec := range []string{"mlx5_0", "mlx5:2", "^mlx5_1", "mlx5_9:1,mlx5_0"} {
		log, err = init(spec)
		require.NoError(t, err, spec)
		assert.Zero(t, log.count("WARN"), "%s:\n%s", spec, log)
	}
	// Selecting only the DOWN port while others are ACTIVE is the same mistake.
	log, err = init("mlx5_2")
	assert.True(t, errors.Is(err, nccl.ErrNoDevice), "%v", err)
	assert.True(t, log.has("NCCL_IB_HCA=mlx5_2 selects none of this host's ACTIVE RDMA ports (mlx5_0:1, mlx5_1:1, mlx5_1:2;"), log.String())

	// Only DOWN ports left out: the filter is not why there is no device.
	f = softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "mlx5_0"}).SetPortState(1, verbs.PortDown)
	f.AddDevice(softnic.DeviceConfig{Name: "mlx5_1"}).SetPortState(1, verbs.PortDown)
	log, err = init("mlx5_1")
	assert.True(t, errors.Is(err, nccl.ErrNoDevice), "%v", err)
	assert.Zero(t, log.count("WARN"), log.String())
}
