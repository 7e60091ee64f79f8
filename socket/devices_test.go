package socket

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclsock"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

func TestMagicFromEnv(t *testing.T) {
	log := &captureLog{}
	withEnv(t, map[string]string{envMagic: "0x1234"})
	assert.Equal(t, uint64(0x1234), magic(log))
	withEnv(t, map[string]string{envMagic: "0xffffffffffffffff"})
	assert.Equal(t, ^uint64(0), magic(log), "unsigned 64-bit, as NCCL's strtoull")
	withEnv(t, map[string]string{envMagic: "010"})
	assert.Equal(t, uint64(8), magic(log), "a leading 0 is octal, as NCCL's strtoull")
	assert.Empty(t, log.String())
	withEnv(t, map[string]string{envMagic: "bogus"})
	assert.Equal(t, uint64(ncclsock.DefaultMagic), magic(log))
	assert.Contains(t, log.String(), "NET/GoSocket : ignoring NCCL_SOCKET_MAGIC=bogus")
}

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func up(name string, idx int, addrs ...string) Iface {
	i := Iface{Name: name, Index: idx, Up: true, Running: true}
	for _, a := range addrs {
		i.Addrs = append(i.Addrs, netip.PrefixFrom(ip(a), ip(a).BitLen()))
	}
	return i
}

// The selection rules themselves are internal/ncclsock's (tested there); the
// socket transport takes up to 16 devices and WARNs as NET/GoSocket.
func TestFindDevicesUsesNCCLRules(t *testing.T) {
	log := &captureLog{}
	var ifs []Iface
	for i := 0; i < 20; i++ {
		ifs = append(ifs, up(fmt.Sprintf("eth%02d", i), i+1, netip.AddrFrom4([4]byte{10, 0, byte(i), 1}).String()))
	}
	ifs = append(ifs, up("ens1", 30, "fe80::1"))
	withEnv(t, map[string]string{envIfname: "ens"})
	got, how := findDevices(ifs, log)
	require.Len(t, got, 1)
	assert.Equal(t, "fe80::1%ens1", got[0].addr.String(), "a link-local address carries its interface")
	assert.Equal(t, 30, got[0].index)
	assert.Equal(t, "NCCL_SOCKET_IFNAME=ens", how)
	withEnv(t, map[string]string{envIfname: "eth", envFamily: "AF_UNIX"})
	got, _ = findDevices(ifs, log)
	assert.Len(t, got, 16, "NCCL's MAX_IFS")
	assert.Equal(t, "eth00", got[0].name)
	assert.Contains(t, log.String(), "NET/GoSocket : ignoring NCCL_SOCKET_FAMILY=AF_UNIX")
	assert.Equal(t, 0, family(log))
}

// sysFixture is testdata/sys copied to a temporary directory with what a Go
// module zip cannot carry added: eth0's PCI device directory (its name
// contains ':') and the class/net/eth0/device link to it (links are left out
// of module zips). It returns the root and eth0's PCI path as pciPath reports it.
func sysFixture(t *testing.T) (root, pci string) {
	t.Helper()
	root = t.TempDir()
	require.NoError(t, os.CopyFS(root, os.DirFS("testdata/sys")))
	const dev = "pci0000:00/0000:00:03.0"
	require.NoError(t, os.MkdirAll(filepath.Join(root, "devices", dev), 0o755))
	require.NoError(t, os.Symlink("../../../devices/"+dev, filepath.Join(root, "class", "net", "eth0", "device")))
	pci, err := filepath.EvalSymlinks(filepath.Join(root, "devices", dev))
	require.NoError(t, err)
	return root, pci
}

func TestSysfsFixtures(t *testing.T) {
	root, want := sysFixture(t)
	s := sysfs{root: root}
	assert.Equal(t, 25000, s.speed("eth0"))
	assert.Equal(t, 10000, s.speed("eth1"), "-1 (unknown) falls back to 10000")
	assert.Equal(t, 10000, s.speed("eth2"), "garbage falls back to 10000")
	assert.Equal(t, 10000, s.speed("lo"), "missing falls back to 10000")
	assert.Equal(t, 10000, s.speed("nope"))
	assert.Equal(t, want, s.pciPath("eth0"))
	assert.Equal(t, "", s.pciPath("lo"), "no device link: virtual NIC")
	assert.Equal(t, "", s.pciPath("nope"))
}

func TestInitProperties(t *testing.T) {
	withEnv(t, map[string]string{envIfname: "eth0,lo"})
	root, pci := sysFixture(t)
	tr := &Transport{sysRoot: root, ifaces: fakeIfaces{up("lo", 1, "127.0.0.1"), up("eth0", 2, "10.0.0.2")}}
	require.NoError(t, tr.Init(nccl.InitContext{Log: &captureLog{}}))
	defer tr.Finalize()
	require.Equal(t, 2, tr.Devices())
	p, err := tr.Properties(1)
	require.NoError(t, err)
	assert.Equal(t, nccl.Properties{Name: "eth0", PCIPath: pci, GUID: 1, PtrSupport: nccl.PtrHost, Speed: 25000,
		MaxComms: 65536, MaxRecvs: 8, MaxP2PBytes: 1 << 40, MaxCollBytes: 512 << 20}, p)
	p, err = tr.Properties(0)
	require.NoError(t, err)
	assert.Equal(t, "lo", p.Name)
	assert.Equal(t, "", p.PCIPath)
	assert.Equal(t, 10000, p.Speed)
	assert.Equal(t, uint64(0), p.GUID)
	_, err = tr.Properties(2)
	assert.Equal(t, nccl.InvalidArgument, nccl.ResultOf(err))
}

func TestInitNoDevice(t *testing.T) {
	withEnv(t, map[string]string{envIfname: "ib"})
	log := &captureLog{}
	tr := &Transport{sysRoot: "testdata/sys", ifaces: fakeIfaces{up("eth0", 2, "10.0.0.2")}}
	err := tr.Init(nccl.InitContext{Log: log})
	require.Error(t, err)
	assert.True(t, errors.Is(err, nccl.ErrNoDevice), "Init must wrap nccl.ErrNoDevice so the glue falls back: %v", err)
	assert.Contains(t, log.String(), "WARN")
	assert.Contains(t, log.String(), "NCCL_SOCKET_IFNAME=ib")
	assert.Equal(t, 0, tr.Devices())
}

// NCCL_SOCKET_IFNAME naming an interface that exists but cannot be used
// (down, no carrier, no address of NCCL_SOCKET_FAMILY) used to get the same
// WARN as a typo, "no interface matches ... (or none is up and running with
// an address)", leaving the operator to guess which; it now says, per
// selected interface, why it was not taken.
func TestInitNoDeviceSaysWhySelectedInterfacesAreUnusable(t *testing.T) {
	down := up("dn0", 3, "10.9.0.1")
	down.Up, down.Running = false, false
	nocarrier := up("nc0", 4, "10.7.0.1")
	nocarrier.Running = false
	v4only := up("v4a", 5, "10.8.0.1")
	ll := up("ll0", 6, "fe80::1")
	lo6 := up("lo", 1, "127.0.0.1", "::1")
	host := fakeIfaces{lo6, up("eth0", 2, "10.0.0.2"), down, nocarrier, v4only, ll}
	for _, c := range []struct {
		env  map[string]string
		want string // after "(or none is up and running with an address"
	}{
		{map[string]string{envIfname: "dn0"}, ": dn0 is down)"},
		{map[string]string{envIfname: "=nc0,dn0"}, ": dn0 is down, nc0 is up but not running (no carrier))"},
		{map[string]string{envIfname: "v4a", envFamily: "AF_INET6"}, " of family AF_INET6 (NCCL_SOCKET_FAMILY): v4a has no AF_INET6 address)"},
		{map[string]string{envIfname: "lo", envFamily: "AF_INET6"}, " of family AF_INET6 (NCCL_SOCKET_FAMILY): lo has no AF_INET6 address but loopback, which NCCL skips)"},
		{map[string]string{envIfname: "ll0", envFamily: "AF_INET"}, " of family AF_INET (NCCL_SOCKET_FAMILY): ll0 has no AF_INET address)"},
		{map[string]string{envIfname: "nosuch"}, "); set NCCL_SOCKET_IFNAME"}, // a typo: nothing to explain
	} {
		withEnv(t, c.env)
		log := &captureLog{}
		tr := &Transport{sysRoot: "testdata/sys", ifaces: host}
		err := tr.Init(nccl.InitContext{Log: log})
		require.True(t, errors.Is(err, nccl.ErrNoDevice), "%v: %v", c.env, err)
		assert.Contains(t, log.String(), "WARN NET/GoSocket : no interface matches NCCL_SOCKET_IFNAME="+c.env[envIfname]+
			" (or none is up and running with an address"+c.want, "%v", c.env)
	}
}

func TestStreamCount(t *testing.T) {
	log := &captureLog{}
	auto := int(autoThreads(usableCPUs())) * defaultNSocks
	for _, c := range []struct {
		env  map[string]string
		want int
	}{
		{nil, auto},
		{map[string]string{envNThreads: "0"}, 0},
		{map[string]string{envNThreads: "3", envNSocks: "2"}, 6},
		{map[string]string{envNThreads: "16", envNSocks: "16"}, 64},
		{map[string]string{envNThreads: "-2", envNSocks: "-2"}, auto},
		{map[string]string{envNThreads: "-5"}, auto},
		{map[string]string{envNThreads: "3", envNSocks: "-1"}, 3},
		{map[string]string{envNThreads: "0x7fffffffffffffff", envNSocks: "0x7fffffffffffffff"}, 64},
		// NCCL's caps: at most 16 threads, then 64 / threads per thread.
		{map[string]string{envNThreads: "20", envNSocks: "1"}, 16},
		{map[string]string{envNThreads: "12", envNSocks: "6"}, 60},
		{map[string]string{envNThreads: "0", envNSocks: "100"}, 0},
	} {
		withEnv(t, c.env)
		assert.Equal(t, c.want, streamCount(log), "%v", c.env)
	}
	assert.Contains(t, log.String(), "WARN NET/GoSocket : ignoring NCCL_SOCKET_NTHREADS=-5: must be >= 0, or -2 for auto")
	assert.Contains(t, log.String(), "WARN NET/GoSocket : ignoring NCCL_NSOCKS_PERTHREAD=-1: must be >= 0, or -2 for auto; using auto (1)")
	assert.NotContains(t, log.String(), "=-2", "-2 is auto, not a mistake")
	assert.Contains(t, log.String(), "WARN NET/GoSocket : NCCL_SOCKET_NTHREADS=20 is greater than the maximum allowed, using 16")
	assert.Contains(t, log.String(), "WARN NET/GoSocket : NCCL_SOCKET_NTHREADS × NCCL_NSOCKS_PERTHREAD = 12×6 is more than 64 streams; using NCCL_NSOCKS_PERTHREAD=5")
	withEnv(t, map[string]string{envHelpers: "-1"})
	assert.Equal(t, min(int(autoHelpers(usableCPUs())), 2), helperCount(log, 2))
	assert.Contains(t, log.String(), "WARN NET/GoSocket : ignoring NCCL_GO_SOCKET_HELPERS=-1")
	withEnv(t, map[string]string{envHelpers: "9"})
	assert.Equal(t, 2, helperCount(log, 2), "at most one helper per stream")
	assert.Equal(t, int64(0), autoThreads(2), "small hosts: no stream goroutines")
	assert.Equal(t, int64(0), autoThreads(minCPUsForStreams-1))
	assert.Equal(t, int64(defaultNThreads), autoThreads(minCPUsForStreams))
	assert.Equal(t, int64(defaultNThreads), autoThreads(128))
}

// A container's CPU quota: the runtime sets GOMAXPROCS to it (Go 1.25+) while
// runtime.NumCPU counts the whole node. The autos follow the quota: a pod with
// two CPUs on a 64-core node gets no data streams and no helpers (they went by
// NumCPU alone and gave it 4 of each per connection end).
func TestAutosFollowGOMAXPROCSUnderACPUQuota(t *testing.T) {
	old := numCPU
	t.Cleanup(func() { numCPU = old })
	numCPU = func() int { return 64 }
	prev := runtime.GOMAXPROCS(2)
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	withEnv(t, nil)
	log := &captureLog{}
	assert.Equal(t, 0, streamCount(log), "2 usable CPUs: no data streams")
	assert.Equal(t, 0, helperCount(log, 4), "2 usable CPUs: no helpers")
	runtime.GOMAXPROCS(16)
	assert.Equal(t, int(defaultNThreads)*defaultNSocks, streamCount(log), "16 usable CPUs: the big-host layout")
	assert.Equal(t, min(int(defaultHelpers), 4), helperCount(log, 4))
	numCPU = func() int { return 4 }
	assert.Equal(t, 0, streamCount(log), "GOMAXPROCS above the CPUs the runtime may use adds none")
}

// TestListenOnVanishedAddressSaysSo: an address chosen at init that is gone
// from its interface when NCCL listens (removed or renumbered since, or an
// IPv6 address still in duplicate address detection) fails listen with a
// WARN that says so, instead of "check NCCL_SOCKET_IFNAME", which was set
// right.
func TestListenOnVanishedAddressSaysSo(t *testing.T) {
	for _, a := range []string{"2001:db8::7/64", "198.51.100.7/24", "fe80::77/64"} {
		t.Run(a, func(t *testing.T) {
			// lo is real, but none of these addresses is on it: as if it
			// had been removed between init and listen.
			tr := &Transport{ifaces: fakeIfaces{{Name: "lo", Index: 1, Up: true, Running: true,
				Addrs: []netip.Prefix{netip.MustParsePrefix(a)}}}, sysRoot: "testdata/sys-none"}
			log := &captureLog{}
			require.NoError(t, tr.Init(nccl.InitContext{Log: log}))
			t.Cleanup(func() { tr.Finalize() })
			var h nccl.Handle
			_, err := tr.Listen(0, &h)
			require.Error(t, err)
			assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
			addr := netip.MustParsePrefix(a).Addr().String()
			assert.Contains(t, err.Error(), addr+" is no longer an address of lo")
			assert.Contains(t, log.String(), "WARN NET/GoSocket : listen on lo")
			assert.Contains(t, log.String(), "removed or changed since")
			assert.NotContains(t, log.String(), "check NCCL_SOCKET_IFNAME", "the interface setting is not what is wrong")
		})
	}
}

// TestDevicesSharingASubnetWarn: two selected NICs on one subnet (a common
// mistake on hosts with one NIC per GPU) get a WARN naming both; NICs on
// their own subnets, loopback and link-local addresses do not.
func TestDevicesSharingASubnetWarn(t *testing.T) {
	pfx := func(name string, idx int, addrs ...string) Iface {
		i := Iface{Name: name, Index: idx, Up: true, Running: true}
		for _, a := range addrs {
			i.Addrs = append(i.Addrs, netip.MustParsePrefix(a))
		}
		return i
	}
	// The host's own policy-routing rules must not decide the outcome.
	sourceRules.Set(t, func() ([]netip.Prefix, error) { return nil, nil })
	withEnv(t, map[string]string{envIfname: "lo,eth"})
	log := &captureLog{}
	tr := &Transport{sysRoot: "testdata/sys-none", ifaces: fakeIfaces{
		pfx("lo", 1, "127.0.0.1/8"),
		pfx("eth0", 2, "10.0.0.1/24", "fe80::1/64"),
		pfx("eth1", 3, "10.0.1.1/24", "fe80::2/64"),
		pfx("eth2", 4, "10.0.0.2/24"),
		pfx("eth3", 5, "fe80::3/64"),
	}}
	require.NoError(t, tr.Init(nccl.InitContext{Log: log}))
	defer tr.Finalize()
	require.Equal(t, 5, tr.Devices())
	assert.Contains(t, log.String(), "WARN NET/GoSocket : devices on the same subnet: eth0 (10.0.0.1/24) and eth2 (10.0.0.2/24);")
	assert.Equal(t, 1, strings.Count(log.String(), " and "), "only eth0 and eth2 share a subnet: %s", log)

	withEnv(t, map[string]string{envIfname: "eth0,eth1"})
	log = &captureLog{}
	tr = &Transport{sysRoot: "testdata/sys-none", ifaces: fakeIfaces{pfx("eth0", 2, "10.0.0.1/24"), pfx("eth1", 3, "10.0.1.1/24")}}
	require.NoError(t, tr.Init(nccl.InitContext{Log: log}))
	defer tr.Finalize()
	assert.NotContains(t, log.String(), "WARN")

	// A host that routes each address out of its own NIC (a cloud host
	// with several NICs in one subnet) is set up for it: no WARN, unless
	// one of the pair lacks its rule.
	withEnv(t, map[string]string{envIfname: "eth"})
	shared := fakeIfaces{pfx("eth0", 2, "10.0.0.1/24"), pfx("eth2", 4, "10.0.0.2/24")}
	for _, c := range []struct {
		rules []string
		warn  bool
	}{
		{[]string{"10.0.0.1/32", "10.0.0.2/32"}, false},
		{[]string{"10.0.0.1/32"}, true},
		{[]string{"10.9.0.0/16"}, true},
		{nil, true},
	} {
		var rules []netip.Prefix
		for _, r := range c.rules {
			rules = append(rules, netip.MustParsePrefix(r))
		}
		sourceRules.Set(t, func() ([]netip.Prefix, error) { return rules, nil })
		log = &captureLog{}
		tr = &Transport{sysRoot: "testdata/sys-none", ifaces: shared}
		require.NoError(t, tr.Init(nccl.InitContext{Log: log}))
		tr.Finalize()
		assert.Equal(t, c.warn, strings.Contains(log.String(), "devices on the same subnet"), "rules %v:\n%s", c.rules, log)
	}
}

// ruleSource reads the netlink rule messages `ip rule` lists: the source
// prefix of a rule that sends traffic to a table, nothing for the others.
func TestRuleSource(t *testing.T) {
	msg := func(fam, srcLen, action byte, attrs ...[]byte) []byte {
		b := []byte{fam, 0, srcLen, 0, 100, 0, 0, action, 0, 0, 0, 0}
		for _, a := range attrs {
			b = append(b, a...)
		}
		return b
	}
	attr := func(typ uint16, data ...byte) []byte {
		b := make([]byte, 4, 4+len(data)+3)
		binary.NativeEndian.PutUint16(b[0:2], uint16(4+len(data)))
		binary.NativeEndian.PutUint16(b[2:4], typ)
		b = append(b, data...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		return b
	}
	table := attr(unix.FRA_TABLE, 100, 0, 0, 0)
	p, ok := ruleSource(msg(unix.AF_INET, 32, unix.FR_ACT_TO_TBL, table, attr(unix.FRA_SRC, 10, 0, 0, 2)))
	assert.True(t, ok)
	assert.Equal(t, "10.0.0.2/32", p.String())
	v6 := netip.MustParseAddr("2001:db8::5").As16()
	p, ok = ruleSource(msg(unix.AF_INET6, 64, unix.FR_ACT_TO_TBL, attr(unix.FRA_SRC, v6[:]...)))
	assert.True(t, ok)
	assert.Equal(t, "2001:db8::/64", p.String())
	_, ok = ruleSource(msg(unix.AF_INET, 0, unix.FR_ACT_TO_TBL, table))
	assert.False(t, ok, "no source: the main and default rules")
	_, ok = ruleSource(msg(unix.AF_INET, 32, 2, attr(unix.FRA_SRC, 10, 0, 0, 2)))
	assert.False(t, ok, "not to a table (goto, blackhole...)")
	_, ok = ruleSource([]byte{2, 0, 32})
	assert.False(t, ok, "truncated")
	rules := []netip.Prefix{netip.MustParsePrefix("10.0.0.2/32")}
	assert.True(t, sourceRouted(rules, netip.MustParseAddr("::ffff:10.0.0.2")), "an IPv4-mapped address is its IPv4 address")
	assert.False(t, sourceRouted(rules, netip.MustParseAddr("10.0.0.1")))
}

// TestLocalAddrBindsOnlyOnTheDevicesSubnet: a connect binds its device's
// address only for a listener on that device's subnet; elsewhere (another
// rail, a routed peer, itself, loopback) the kernel chooses, as in NCCL.
func TestLocalAddrBindsOnlyOnTheDevicesSubnet(t *testing.T) {
	d := &device{name: "eth1", addr: ip("10.0.0.11"), subnet: netip.MustParsePrefix("10.0.0.0/24")}
	to := func(s string) handleInfo { return handleInfo{addr: netip.MustParseAddrPort(s)} }
	assert.Equal(t, &unix.SockaddrInet4{Addr: [4]byte{10, 0, 0, 11}}, localAddr(to("10.0.0.12:5000"), d))
	assert.Nil(t, localAddr(to("10.0.1.12:5000"), d), "another subnet")
	assert.Nil(t, localAddr(to("10.0.0.11:5000"), d), "ourselves")
	assert.Nil(t, localAddr(to("127.0.0.1:5000"), &device{name: "lo", addr: ip("127.0.0.1")}), "loopback has no subnet")
}
