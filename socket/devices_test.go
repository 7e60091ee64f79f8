package socket

import (
	"errors"
	"net/netip"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

func TestParseIfList(t *testing.T) {
	cases := []struct {
		in      string
		not     bool
		exact   bool
		entries []ifPattern
	}{
		{"eth", false, false, []ifPattern{{"eth", -1}}},
		{"eth0,ib", false, false, []ifPattern{{"eth0", -1}, {"ib", -1}}},
		{"^docker,lo,virbr", true, false, []ifPattern{{"docker", -1}, {"lo", -1}, {"virbr", -1}}},
		{"=eth0", false, true, []ifPattern{{"eth0", -1}}},
		{"^=docker0", true, true, []ifPattern{{"docker0", -1}}},
		{"eth0:1234,ib0:x", false, false, []ifPattern{{"eth0", 1234}, {"ib0", 0}}},
		{",,eth0,,", false, false, []ifPattern{{"eth0", -1}}},
		{"^", true, false, nil},
	}
	for _, c := range cases {
		l := parseIfList(c.in)
		assert.Equal(t, c.not, l.not, c.in)
		assert.Equal(t, c.exact, l.exact, c.in)
		assert.Equal(t, c.entries, l.entries, c.in)
	}
	// At most 16 entries, as NCCL's MAX_IFS.
	long := "a0,a1,a2,a3,a4,a5,a6,a7,a8,a9,a10,a11,a12,a13,a14,a15,a16,a17"
	assert.Len(t, parseIfList(long).entries, 16)
}

func TestIfListMatch(t *testing.T) {
	cases := []struct {
		list, name string
		want       bool
	}{
		{"eth", "eth0", true},
		{"eth", "eth10", true},
		{"eth", "ens3", false},
		{"=eth0", "eth0", true},
		{"=eth0", "eth01", false},
		{"^eth", "eth0", false},
		{"^eth", "ib0", true},
		{"^=eth0", "eth0", false},
		{"^=eth0", "eth01", true},
		{"eth0:5555", "eth0", true}, // the port is ignored for matching
		{"^docker,lo,virbr", "lo", false},
		{"^docker,lo,virbr", "lowpan0", false}, // prefix semantics, as NCCL
		{"^docker,lo,virbr", "docker0", false},
		{"^docker,lo,virbr", "enp1s0", true},
		{"^", "eth0", false}, // an empty exclusion list matches nothing
		{"ib,eth", "eth2", true},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, parseIfList(c.list).match(c.name), "%q matching %q", c.list, c.name)
	}
}

func TestParseMagic(t *testing.T) {
	for in, want := range map[string]uint64{
		"":                     defaultMagic,
		"12345":                12345,
		"0x1f":                 0x1f,
		"0XABCDEF0123456789":   0xabcdef0123456789,
		" 42 ":                 42,
		"18446744073709551615": ^uint64(0),
	} {
		got, err := parseMagic(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"0x", "0xZZ", "-1", "12a", "18446744073709551616", "magic"} {
		_, err := parseMagic(bad)
		require.Error(t, err, bad)
		assert.Equal(t, nccl.InvalidArgument, nccl.ResultOf(err))
		assert.Contains(t, err.Error(), envMagic)
	}
}

func TestMagicFromEnv(t *testing.T) {
	log := &captureLog{}
	withEnv(t, map[string]string{envMagic: "0x1234"})
	assert.Equal(t, uint64(0x1234), magic(log))
	withEnv(t, map[string]string{envMagic: "bogus"})
	assert.Equal(t, uint64(defaultMagic), magic(log))
	assert.Contains(t, log.String(), "NCCL_SOCKET_MAGIC")
}

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func up(name string, idx int, addrs ...string) Iface {
	i := Iface{Name: name, Index: idx, Up: true, Running: true}
	for _, a := range addrs {
		i.Addrs = append(i.Addrs, ip(a))
	}
	return i
}

func names(ds []device) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.name)
	}
	return out
}

func TestDefaultDeviceOrder(t *testing.T) {
	withEnv(t, nil)
	log := &captureLog{}
	lo := up("lo", 1, "127.0.0.1", "::1")
	docker := up("docker0", 2, "172.17.0.1")
	virbr := up("virbr0", 3, "192.168.122.1")
	eth := up("eth0", 4, "10.0.0.2")
	ens := up("ens5", 5, "10.0.1.2")
	ib := up("ib0", 6, "10.1.0.2")
	cases := []struct {
		ifs  []Iface
		want []string
	}{
		{[]Iface{lo, docker, virbr, eth, ens, ib}, []string{"ib0"}},
		{[]Iface{lo, docker, virbr, eth, ens}, []string{"eth0", "ens5"}},
		{[]Iface{lo, virbr, docker}, []string{"docker0"}},
		{[]Iface{virbr, lo}, []string{"lo"}},
		{[]Iface{virbr}, []string{"virbr0"}},
		{nil, nil},
	}
	for _, c := range cases {
		got, _ := findDevices(c.ifs, log)
		assert.Equal(t, c.want, names(got))
	}
}

func TestDeviceRules(t *testing.T) {
	log := &captureLog{}
	down := up("eth9", 9, "10.9.0.1")
	down.Up = false
	notRunning := up("eth8", 8, "10.8.0.1")
	notRunning.Running = false
	v6only := up("eth1", 2, "fd00::1")
	dual := up("eth0", 1, "fd00::2", "10.0.0.2")
	ll := up("eth2", 3, "fe80::1")
	lo := up("lo", 4, "::1", "127.0.0.1")
	lo6 := up("lo6", 5, "::1")
	noAddr := up("eth3", 6)
	ifs := []Iface{down, notRunning, v6only, dual, ll, lo, lo6, noAddr}

	withEnv(t, map[string]string{envIfname: "eth,lo"})
	got, how := findDevices(ifs, log)
	// Every IPv4 address comes before any IPv6 one (getifaddrs order), one
	// address per interface, and down / not-running interfaces are skipped.
	assert.Equal(t, []string{"eth0", "lo", "eth1", "eth2"}, names(got))
	assert.Equal(t, ip("10.0.0.2"), got[0].addr)
	assert.Equal(t, ip("127.0.0.1"), got[1].addr)
	assert.Equal(t, "fe80::1%eth2", got[3].addr.String(), "a link-local address carries its interface")
	assert.Contains(t, how, "NCCL_SOCKET_IFNAME=eth,lo")

	withEnv(t, map[string]string{envIfname: "lo6"})
	got, _ = findDevices(ifs, log)
	assert.Empty(t, got, "IPv6 loopback is skipped")

	withEnv(t, map[string]string{envIfname: "eth", envFamily: "AF_INET6"})
	got, _ = findDevices(ifs, log)
	assert.Equal(t, []string{"eth1", "eth0", "eth2"}, names(got))
	assert.Equal(t, ip("fd00::2"), got[1].addr)

	withEnv(t, map[string]string{envIfname: "eth", envFamily: "AF_INET"})
	got, _ = findDevices(ifs, log)
	assert.Equal(t, []string{"eth0"}, names(got))

	withEnv(t, map[string]string{envIfname: "^=eth0"})
	got, _ = findDevices(ifs, log)
	assert.Equal(t, []string{"lo", "eth1", "eth2"}, names(got))

	withEnv(t, map[string]string{envIfname: "=eth"})
	got, _ = findDevices(ifs, log)
	assert.Empty(t, got)

	// A one-character value is ignored: NCCL's default search runs.
	withEnv(t, map[string]string{envIfname: "l"})
	got, how = findDevices(ifs, log)
	assert.Equal(t, []string{"eth0", "eth1", "eth2"}, names(got))
	assert.Contains(t, how, "default")

	withEnv(t, map[string]string{envFamily: "AF_UNIX"})
	findDevices(ifs, log)
	assert.Contains(t, log.String(), "NCCL_SOCKET_FAMILY")
}

func TestAtMost16Devices(t *testing.T) {
	withEnv(t, map[string]string{envIfname: "eth"})
	var ifs []Iface
	for i := 0; i < 20; i++ {
		ifs = append(ifs, up("eth"+string(rune('a'+i)), i+1, netip.AddrFrom4([4]byte{10, 0, byte(i), 1}).String()))
	}
	got, _ := findDevices(ifs, &captureLog{})
	assert.Len(t, got, 16)
}

func TestSysfsFixtures(t *testing.T) {
	s := sysfs{root: "testdata/sys"}
	assert.Equal(t, 25000, s.speed("eth0"))
	assert.Equal(t, 10000, s.speed("eth1"), "-1 (unknown) falls back to 10000")
	assert.Equal(t, 10000, s.speed("eth2"), "garbage falls back to 10000")
	assert.Equal(t, 10000, s.speed("lo"), "missing falls back to 10000")
	assert.Equal(t, 10000, s.speed("nope"))
	want, err := filepath.Abs("testdata/sys/devices/pci0000:00/0000:00:03.0")
	require.NoError(t, err)
	assert.Equal(t, want, s.pciPath("eth0"))
	assert.Equal(t, "", s.pciPath("lo"), "no device link: virtual NIC")
	assert.Equal(t, "", s.pciPath("nope"))
}

func TestInitProperties(t *testing.T) {
	withEnv(t, map[string]string{envIfname: "eth0,lo"})
	tr := &Transport{sysRoot: "testdata/sys", ifaces: fakeIfaces{up("lo", 1, "127.0.0.1"), up("eth0", 2, "10.0.0.2")}}
	require.NoError(t, tr.Init(nccl.InitContext{Log: &captureLog{}}))
	defer tr.Finalize()
	require.Equal(t, 2, tr.Devices())
	p, err := tr.Properties(1)
	require.NoError(t, err)
	pci, _ := filepath.Abs("testdata/sys/devices/pci0000:00/0000:00:03.0")
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

func TestStreamCount(t *testing.T) {
	log := &captureLog{}
	auto := int(autoThreads(runtime.NumCPU())) * defaultNSocks
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
	} {
		withEnv(t, c.env)
		assert.Equal(t, c.want, streamCount(log), "%v", c.env)
	}
	assert.Equal(t, int64(0), autoThreads(2), "small hosts: no stream goroutines")
	assert.Equal(t, int64(0), autoThreads(minCPUsForStreams-1))
	assert.Equal(t, int64(defaultNThreads), autoThreads(minCPUsForStreams))
	assert.Equal(t, int64(defaultNThreads), autoThreads(128))
}
