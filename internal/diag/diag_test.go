package diag

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// fakeTransport is a transport with fixed devices; it fuses devices unless
// refuse says otherwise.
type fakeTransport struct {
	name      string
	initErr   error
	devs      []nccl.Properties
	vdevs     [][]int
	refuse    func(devs []int) error
	finalized *int
	explained *[]error
}

func (f *fakeTransport) Name() string { return f.name }
func (f *fakeTransport) Init(nccl.InitContext) error {
	if f.initErr != nil {
		return f.initErr
	}
	f.vdevs = nil
	for i := range f.devs {
		f.vdevs = append(f.vdevs, []int{i})
	}
	return nil
}
func (f *fakeTransport) Devices() int { return len(f.vdevs) }
func (f *fakeTransport) Properties(dev int) (nccl.Properties, error) {
	if dev < 0 || dev >= len(f.vdevs) {
		return nccl.Properties{}, fmt.Errorf("no device %d", dev)
	}
	m := f.vdevs[dev]
	p := f.devs[m[0]]
	p.VDevs = m
	if len(m) > 1 {
		var n []string
		for _, i := range m {
			n = append(n, f.devs[i].Name)
		}
		p.Name = strings.Join(n, "+")
	}
	return p, nil
}
func (f *fakeTransport) Listen(int, *nccl.Handle) (nccl.Listener, error) {
	return nil, errors.New("no")
}
func (f *fakeTransport) Connect(int, *nccl.Handle, nccl.ConnectOptions) (nccl.SendComm, error) {
	return nil, errors.New("no")
}
func (f *fakeTransport) Finalize() error {
	if f.finalized != nil {
		*f.finalized++
	}
	return nil
}
func (f *fakeTransport) Explain(d *Transport, err error) {
	if f.explained != nil {
		*f.explained = append(*f.explained, err)
	}
	d.Notes = append(d.Notes, "explained by "+f.name)
}

// fuser adds makeVDevice to a fakeTransport.
type fuser struct{ *fakeTransport }

func (f fuser) MakeVDevice(devs []int) (int, error) {
	if f.refuse != nil {
		if err := f.refuse(devs); err != nil {
			return -1, err
		}
	}
	var m []int
	for _, d := range devs {
		m = append(m, f.vdevs[d]...)
	}
	f.vdevs = append(f.vdevs, m)
	return len(f.vdevs) - 1, nil
}

func env(t *testing.T, kv ...string) {
	t.Helper()
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	ncclenv.SetLookup(func(k string) (string, bool) { v, ok := m[k]; return v, ok })
	t.Cleanup(func() { ncclenv.SetLookup(nil) })
}

func reg(name string, prio int, t nccl.Transport) nccl.Registration {
	return nccl.Registration{Name: name, Priority: prio, New: func() nccl.Transport { return t }}
}

func TestDecideFallsBackLikeTheGlue(t *testing.T) {
	env(t)
	fin := 0
	var explained []error
	ib := &fakeTransport{name: "ib", initErr: fmt.Errorf("%w: libibverbs.so.1 reports no RDMA devices", nccl.ErrNoDevice), explained: &explained}
	sock := &fakeTransport{name: "socket", devs: []nccl.Properties{{Name: "eth0", Speed: 25000}}, finalized: &fin, explained: &explained}
	r := Diagnose([]nccl.Registration{reg("ib", 10, ib), reg("socket", 100, sock)}, Options{SysfsRoot: t.TempDir()})
	require.Len(t, r.Transports, 2)
	assert.Equal(t, "socket", r.Transport)
	assert.Empty(t, r.InitError)
	assert.Contains(t, r.Why, "ib is tried first and not usable")
	assert.False(t, r.Transports[0].Usable)
	assert.True(t, r.Transports[0].Tried)
	assert.False(t, r.Transports[0].ConfigError, "ErrNoDevice is an INFO-level fallback, not a configuration error")
	assert.Contains(t, r.Transports[0].Reason, "reports no RDMA devices")
	assert.True(t, r.Transports[1].Selected)
	require.Len(t, r.Transports[1].Devices, 1)
	d := r.Transports[1].Devices[0]
	// As NCCL sees it: the transport left MaxComms and MaxRecvs 0, which the
	// glue reports as 1.
	assert.Equal(t, Device{Index: 0, Name: "eth0", SpeedMbps: 25000, GUID: "0x0000000000000000", Memory: []string{"host"}, MaxComms: 1, MaxRecvs: 1}, d)
	assert.Equal(t, 1, fin, "a usable transport is finalized after the survey")
	assert.Len(t, explained, 2, "both transports explain themselves, usable or not")
	assert.Error(t, explained[0])
	assert.NoError(t, explained[1])
	require.NotNil(t, r.Transports[1].Fusion)
	assert.False(t, r.Transports[1].Fusion.Supported, "a transport without makeVDevice is not fused")
}

func TestDecideFirstUsableWinsAndLaterOnesAreStillSurveyed(t *testing.T) {
	env(t)
	ib := &fakeTransport{name: "ib", devs: []nccl.Properties{{Name: "mlx5_0", Port: 1}}}
	sock := &fakeTransport{name: "socket", devs: []nccl.Properties{{Name: "eth0"}}}
	r := Diagnose([]nccl.Registration{reg("ib", 10, fuser{ib}), reg("socket", 100, sock)}, Options{})
	assert.Equal(t, "ib", r.Transport)
	assert.Contains(t, r.Why, "first transport in priority order")
	assert.False(t, r.Transports[1].Tried)
	assert.True(t, r.Transports[1].Usable, "socket is surveyed even though the plugin would not reach it")
	assert.Contains(t, r.Transports[1].Reason, "not tried: the plugin uses ib")
}

func TestDecideForcedTransport(t *testing.T) {
	ib := &fakeTransport{name: "ib", initErr: fmt.Errorf("%w: NCCL_IB_DISABLE=1", nccl.ErrNoDevice)}
	sock := &fakeTransport{name: "socket", devs: []nccl.Properties{{Name: "eth0"}}}
	regs := []nccl.Registration{reg("ib", 10, ib), reg("socket", 100, sock)}

	env(t, "NCCL_GO_TRANSPORT", "ib")
	r := Diagnose(regs, Options{})
	assert.Empty(t, r.Transport, "a forced transport that is unusable fails init: no fallback")
	assert.Contains(t, r.InitError, "NCCL_IB_DISABLE=1")
	assert.False(t, r.Transports[1].Tried)

	env(t, "NCCL_GO_TRANSPORT", "socket")
	r = Diagnose(regs, Options{})
	assert.Equal(t, "socket", r.Transport)
	assert.Equal(t, "NCCL_GO_TRANSPORT=socket", r.Why)
	assert.False(t, r.Transports[0].Tried)

	env(t, "NCCL_GO_TRANSPORT", "SOCKET") // the glue's nccl.Lookup ignores case
	r = Diagnose(regs, Options{})
	assert.Equal(t, "socket", r.Transport)
	assert.Empty(t, r.InitError)

	env(t, "NCCL_GO_TRANSPORT", "shm")
	r = Diagnose(regs, Options{})
	assert.Empty(t, r.Transport)
	assert.Equal(t, "NCCL_GO_TRANSPORT=shm names no transport of this plugin; use one of ib, socket or unset it", r.InitError)
}

// A transport that leaves Name empty is shown, and matched by
// NCCL_NET_FORCE_MERGE, under the name the glue gives it.
func TestDevicesShowTheGlueDefaults(t *testing.T) {
	anon := &fakeTransport{name: "vendor", devs: []nccl.Properties{{}, {MaxRecvs: 200}}}
	r := Diagnose([]nccl.Registration{reg("vendor", 10, anon)}, Options{})
	require.Equal(t, "vendor", r.Transport)
	devs := r.Transports[0].Devices
	require.Len(t, devs, 2)
	assert.Equal(t, "vendor0", devs[0].Name)
	assert.Equal(t, 1, devs[0].MaxRecvs)
	assert.Equal(t, nccl.MaxGroupedRecvs, devs[1].MaxRecvs, "capped as the glue caps it")
}

func TestDecideNothingUsable(t *testing.T) {
	env(t)
	ib := &fakeTransport{name: "ib", initErr: nccl.Errorf(nccl.InvalidArgument, "NCCL_IB_HCA=mlx5_0:x: bad port")}
	sock := &fakeTransport{name: "socket"} // Init succeeds with 0 devices
	fin := 0
	sock.finalized = &fin
	r := Diagnose([]nccl.Registration{reg("ib", 10, ib), reg("socket", 100, sock)}, Options{})
	assert.Empty(t, r.Transport)
	assert.True(t, r.Transports[0].ConfigError, "a malformed setting is a WARN in the plugin")
	assert.Contains(t, r.InitError, "ib: NCCL_IB_HCA=mlx5_0:x")
	assert.Contains(t, r.InitError, "socket: no usable device: transport reported 0 devices")
	assert.Equal(t, 1, fin, "0 devices: finalized, as the glue does")
}

func TestDiscoveryPanicIsReported(t *testing.T) {
	env(t)
	bad := nccl.Registration{Name: "bad", Priority: 1, New: func() nccl.Transport { panic("boom") }}
	r := Diagnose([]nccl.Registration{bad}, Options{})
	assert.Contains(t, r.Transports[0].Reason, "discovery panicked: boom")
	assert.Empty(t, r.Transport)
}

func TestDistance(t *testing.T) {
	root := t.TempDir()
	for p, n := range map[string]string{"devices/pci0000:00/0000:00:01.0": "0", "devices/pci0000:80/0000:80:01.0": "1", "devices/pci0000:40/0000:40:01.0": "0"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, p), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, p, "numa_node"), []byte(n+"\n"), 0o644))
	}
	numa := numaReader(root)
	const (
		sw   = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"
		nicA = sw + "/0000:02:00.0/0000:03:00.0"
		nicB = sw + "/0000:02:01.0/0000:04:00.0"
	)
	for _, c := range []struct {
		a, b string
		want pathType
	}{
		{nicA, nicA, pathPORT},                              // two ports of one NIC (ib zeroes the function digit)
		{nicA, sw + "/0000:02:00.0/0000:03:00.1", pathPORT}, // NCCL's multi-port rule
		{sw + "/0000:02:00.0", sw + "/0000:02:01.0", pathPIX},
		{nicA, nicB, pathPXB},
		{nicA, "/sys/devices/pci0000:40/0000:40:01.0/0000:41:00.0", pathPHB}, // other root complex, same NUMA node
		{nicA, "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0", pathSYS},
		{"", "", pathPHB}, // virtual NICs hang off the first CPU
		{"", "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0", pathSYS},
	} {
		assert.Equal(t, c.want, distance(c.a, c.b, numa), "%s <-> %s", c.a, c.b)
		assert.Equal(t, c.want, distance(c.b, c.a, numa), "symmetric: %s <-> %s", c.b, c.a)
	}
}

func TestMergeLevelReadsLikeNCCL(t *testing.T) {
	for v, want := range map[string]pathType{"PORT": pathPORT, "SYS": pathSYS, "PHBX": pathPHB, "pix": pathLOC, "": pathLOC, "2": pathLOC} {
		env(t, "NCCL_NET_MERGE_LEVEL", v)
		got, note := mergeLevel()
		assert.Equal(t, want, got, "%q", v)
		assert.Equal(t, want == pathLOC, note != "", "unknown values are called out: %q", v)
	}
	env(t)
	got, _ := mergeLevel()
	assert.Equal(t, pathPORT, got, "NCCL's default outside Vera Rubin")
}

// dualPort: mlx5_0 ports 1 and 2 share a PCI path; mlx5_1 sits on another
// function under the same switch; mlx5_2 is on the other socket.
func dualPort() *fakeTransport {
	const sw = "/sys/devices/pci0000:00/0000:00:01.0"
	return &fakeTransport{name: "ib", devs: []nccl.Properties{
		{Name: "mlx5_0", Port: 1, PCIPath: sw + "/0000:01:00.0"},
		{Name: "mlx5_0", Port: 2, PCIPath: sw + "/0000:01:00.0"},
		{Name: "mlx5_1", Port: 1, PCIPath: sw + "/0000:02:00.0"},
		{Name: "mlx5_2", Port: 1, PCIPath: "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0"},
	}}
}

func fuse(t *testing.T, f *fakeTransport) (*Fusion, []Device) {
	t.Helper()
	require.NoError(t, f.Init(nccl.InitContext{}))
	var devs []Device
	for i := range f.devs {
		p, err := f.Properties(i)
		require.NoError(t, err)
		devs = append(devs, FromProperties(i, p))
	}
	return PredictVNICs(fuser{f}, devs, t.TempDir())
}

func TestPredictVNICsDefaultFusesPortsOfOneNIC(t *testing.T) {
	env(t)
	fu, added := fuse(t, dualPort())
	assert.True(t, fu.Supported)
	assert.Equal(t, "PORT", fu.Level)
	require.Len(t, fu.VNICs, 1)
	assert.Equal(t, VNIC{Index: 4, Members: []int{0, 1}, Names: []string{"mlx5_0", "mlx5_0"}, Path: "PORT"}, fu.VNICs[0])
	require.Len(t, added, 1)
	assert.Equal(t, "mlx5_0+mlx5_0", added[0].Name)
	assert.Equal(t, []int{0, 1}, added[0].Members)
	assert.True(t, added[0].Virtual)
}

func TestPredictVNICsLevels(t *testing.T) {
	env(t, "NCCL_NET_MERGE_LEVEL", "LOC")
	fu, _ := fuse(t, dualPort())
	assert.Empty(t, fu.VNICs)

	env(t, "NCCL_NET_MERGE_LEVEL", "PXB")
	fu, _ = fuse(t, dualPort())
	require.Len(t, fu.VNICs, 1)
	assert.Equal(t, []int{0, 1, 2}, fu.VNICs[0].Members)
	assert.Equal(t, "PIX", fu.VNICs[0].Path)

	env(t, "NCCL_NET_MERGE_LEVEL", "SYS")
	fu, _ = fuse(t, dualPort())
	require.Len(t, fu.VNICs, 1)
	assert.Equal(t, []int{0, 1, 2, 3}, fu.VNICs[0].Members)
	assert.Equal(t, "PHB", fu.VNICs[0].Path, "no NUMA information: both roots count as one CPU")

	env(t, "NCCL_NET_MERGE_LEVEL", "SYS", "NCCL_NET_MERGE_POLICY", "RAIL")
	fu, _ = fuse(t, dualPort())
	assert.Empty(t, fu.VNICs, "RAIL fuses only devices with equal, defined rail ids")
}

func TestPredictVNICsRefusedGroupStaysSeparate(t *testing.T) {
	env(t, "NCCL_NET_MERGE_LEVEL", "SYS")
	f := dualPort()
	f.refuse = func(devs []int) error {
		if len(devs) > 2 {
			return nccl.Errorf(nccl.InvalidUsage, "cannot fuse %d", len(devs))
		}
		return nil
	}
	fu, _ := fuse(t, f)
	// NCCL: {0,1,2,3} refused -> 0's paths to the others become DIS, restart
	// at device 1: {1,2,3} refused -> 1's paths become DIS; restart: 1 alone,
	// then {2,3} fused.
	require.Len(t, fu.VNICs, 1, "%+v", fu)
	assert.Equal(t, []int{2, 3}, fu.VNICs[0].Members)
	assert.Contains(t, strings.Join(fu.Notes, "\n"), "the transport refuses")
}

func TestPredictVNICsForceMerge(t *testing.T) {
	env(t, "NCCL_NET_FORCE_MERGE", "mlx5_1,mlx5_2", "NCCL_NET_MERGE_LEVEL", "LOC")
	fu, _ := fuse(t, dualPort())
	require.Len(t, fu.VNICs, 1)
	assert.Equal(t, VNIC{Index: 4, Members: []int{2, 3}, Names: []string{"mlx5_1", "mlx5_2"}, Path: "PHB", Forced: true}, fu.VNICs[0])

	env(t, "NCCL_NET_FORCE_MERGE", "mlx5_0:1,mlx5_0:2;mlx5_1,mlx5_2")
	fu, _ = fuse(t, dualPort())
	require.Len(t, fu.VNICs, 2)
	assert.Equal(t, []int{0, 1}, fu.VNICs[0].Members)
	assert.Equal(t, []int{2, 3}, fu.VNICs[1].Members)
	assert.Empty(t, fu.Error)

	env(t, "NCCL_NET_FORCE_MERGE", "mlx5_0:1,mlx5_9")
	fu, _ = fuse(t, dualPort())
	assert.Contains(t, fu.Error, "matches 1 device(s), 2 requested")
	assert.Empty(t, fu.VNICs)

	env(t, "NCCL_NET_FORCE_MERGE", "mlx5", "NCCL_NET_MERGE_LEVEL", "LOC")
	fu, _ = fuse(t, dualPort())
	assert.Contains(t, fu.Error, "matches 0 device(s)", "force-merge names are exact, not prefixes")

	// A group of one makes no vNIC but keeps its device out of automatic
	// merging (NCCL's ncclTopoForceMerge marks it placed): port 1 stays alone
	// even where its sibling port would fuse with it.
	env(t, "NCCL_NET_FORCE_MERGE", "mlx5_0:1")
	fu, _ = fuse(t, dualPort())
	assert.Empty(t, fu.Error)
	for _, v := range fu.VNICs {
		assert.NotContains(t, v.Members, 0, "device 0 was forced to stay alone: %+v", fu.VNICs)
	}
}
