package ncclsock

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/internal/testhook"
)

type capture = testhook.Warnings

func withEnv(t *testing.T, env map[string]string) {
	t.Helper()
	ncclenv.SetLookup(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	t.Cleanup(func() { ncclenv.SetLookup(nil) })
}

// up is a running interface; addresses are "ip" (host route) or "ip/bits".
func up(name string, idx int, addrs ...string) Interface {
	i := Interface{Name: name, Index: idx, Up: true, Running: true}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a); err == nil {
			i.Addrs = append(i.Addrs, p)
			continue
		}
		ip := netip.MustParseAddr(a)
		i.Addrs = append(i.Addrs, netip.PrefixFrom(ip, ip.BitLen()))
	}
	return i
}

func names(ds []Device) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Name)
	}
	return out
}

func socketOpts(log ncclenv.Logger) Options {
	return Options{Max: ncclenv.MaxIfs, Log: log, Prefix: "NET/GoSocket"}
}

func TestDefaultSearchOrder(t *testing.T) {
	withEnv(t, nil)
	log := &capture{}
	lo := up("lo", 1, "127.0.0.1/8", "::1/128")
	docker := up("docker0", 2, "172.17.0.1/16")
	virbr := up("virbr0", 3, "192.168.122.1/24")
	eth := up("eth0", 4, "10.0.0.2/24")
	ens := up("ens5", 5, "10.0.1.2/24")
	ib := up("ib0", 6, "10.1.0.2/16")
	lo1 := up("lo1", 7, "127.0.1.1/8")
	for _, c := range []struct {
		ifs  []Interface
		want []string
		how  string
	}{
		{[]Interface{lo, docker, virbr, eth, ens, ib}, []string{"ib0"}, "default search (ib)"},
		{[]Interface{lo, docker, virbr, eth, ens}, []string{"eth0", "ens5"}, "default search (^docker,lo,virbr)"},
		{[]Interface{lo, lo1, virbr, docker}, []string{"docker0"}, "default search (docker)"},
		{[]Interface{virbr, lo1, lo}, []string{"lo1", "lo"}, "default search (lo)"}, // lo is a prefix, as in NCCL
		{[]Interface{virbr}, []string{"virbr0"}, "default search (virbr)"},
		{nil, nil, "default search"},
	} {
		got, how := Find(c.ifs, socketOpts(log))
		assert.Equal(t, c.want, names(got))
		assert.Equal(t, c.how, how)
	}
	assert.Empty(t, log.String())
}

func TestIfNameRules(t *testing.T) {
	log := &capture{}
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
	ifs := []Interface{down, notRunning, v6only, dual, ll, lo, lo6, noAddr}

	withEnv(t, map[string]string{"NCCL_SOCKET_IFNAME": "eth,lo"})
	got, how := Find(ifs, socketOpts(log))
	// Every IPv4 address before any IPv6 one (getifaddrs order), one address
	// per interface, down / not-running interfaces skipped.
	assert.Equal(t, []string{"eth0", "lo", "eth1", "eth2"}, names(got))
	assert.Equal(t, "10.0.0.2", got[0].Addr.String())
	assert.Equal(t, "127.0.0.1", got[1].Addr.String())
	assert.Equal(t, "fe80::1%eth2", got[3].Addr.String(), "a link-local address carries its interface")
	assert.Equal(t, "NCCL_SOCKET_IFNAME=eth,lo", how)

	withEnv(t, map[string]string{"NCCL_SOCKET_IFNAME": "lo6"})
	got, _ = Find(ifs, socketOpts(log))
	assert.Empty(t, got, "IPv6 loopback is skipped")

	withEnv(t, map[string]string{"NCCL_SOCKET_IFNAME": "eth", "NCCL_SOCKET_FAMILY": "AF_INET6"})
	got, _ = Find(ifs, socketOpts(log))
	assert.Equal(t, []string{"eth1", "eth0", "eth2"}, names(got))
	assert.Equal(t, "fd00::2", got[1].Addr.String())

	withEnv(t, map[string]string{"NCCL_SOCKET_IFNAME": "eth", "NCCL_SOCKET_FAMILY": "AF_INET"})
	got, _ = Find(ifs, socketOpts(log))
	assert.Equal(t, []string{"eth0"}, names(got))

	withEnv(t, map[string]string{"NCCL_SOCKET_IFNAME": "^=eth0"})
	got, _ = Find(ifs, socketOpts(log))
	assert.Equal(t, []string{"lo", "eth1", "eth2"}, names(got))

	withEnv(t, map[string]string{"NCCL_SOCKET_IFNAME": "=eth"})
	got, _ = Find(ifs, socketOpts(log))
	assert.Empty(t, got, "set and matching nothing: nothing, no fallback to the default search")

	assert.Empty(t, log.String())

	// A one-character value is ignored, as by NCCL, with a WARN.
	withEnv(t, map[string]string{"NCCL_SOCKET_IFNAME": "l"})
	got, how = Find(ifs, socketOpts(log))
	assert.Equal(t, []string{"eth0", "eth1", "eth2"}, names(got))
	assert.Equal(t, "default search (^docker,lo,virbr)", how)
	assert.Contains(t, log.String(), "NET/GoSocket : ignoring NCCL_SOCKET_IFNAME=l: NCCL ignores a value of one character")

	withEnv(t, map[string]string{"NCCL_SOCKET_FAMILY": "AF_UNIX"})
	Find(ifs, socketOpts(log))
	assert.Contains(t, log.String(), "NET/GoSocket : ignoring NCCL_SOCKET_FAMILY=AF_UNIX")

	// A port that is not a number: NCCL reads it as 0, and interface lists
	// ignore ports anyway; the WARN says so.
	withEnv(t, map[string]string{"NCCL_SOCKET_IFNAME": "eth0:x"})
	got, _ = Find(ifs, socketOpts(log))
	assert.Equal(t, []string{"eth0"}, names(got))
	assert.Contains(t, log.String(), `NET/GoSocket : NCCL_SOCKET_IFNAME=eth0:x: port "x" in entry "eth0:x" is not a decimal number; NCCL reads it as 0`)
}

func TestAtMostMaxDevicesAndListEntries(t *testing.T) {
	withEnv(t, map[string]string{"NCCL_SOCKET_IFNAME": "eth"})
	var ifs []Interface
	for i := 0; i < 20; i++ {
		ifs = append(ifs, up(fmt.Sprintf("eth%c", 'a'+i), i+1, netip.AddrFrom4([4]byte{10, 0, byte(i), 1}).String()))
	}
	got, _ := Find(ifs, socketOpts(nil))
	assert.Len(t, got, ncclenv.MaxIfs)
	got, _ = Find(ifs, Options{Max: 1})
	assert.Equal(t, []string{"etha"}, names(got))
	got, _ = Find(ifs, Options{}) // 0 means NCCL's MAX_IFS
	assert.Len(t, got, ncclenv.MaxIfs)
}

// ib's out-of-band interface: one, and no link-local address (the peer could
// not know our zone). Before ncclsock, ib kept each interface's address order
// (2001:db8::2 before 10.0.0.2) and matched "lo" exactly.
func TestOneInterfaceForTheHandshake(t *testing.T) {
	log := &capture{}
	ifs := []Interface{
		up("lo", 1, "127.0.0.1/8", "::1/128"),
		up("docker0", 2, "172.17.0.1/16"),
		// The kernel lists an interface's global IPv6 addresses before its link-local one.
		up("eth0", 3, "2001:db8::2/64", "fe80::1/64", "10.0.0.2/24"),
		up("ib0", 4, "192.168.1.2/24"),
		up("eth1", 5, "fe80::5/64"),
	}
	oob := Options{Max: 1, Log: log, Prefix: "NET/GoIB"}
	pick := func() string {
		d, _ := Find(ifs, oob)
		if len(d) == 0 {
			return "none"
		}
		return d[0].String()
	}
	withEnv(t, nil)
	assert.Equal(t, "ib0<192.168.1.2>", pick(), "ib* first")
	withEnv(t, map[string]string{"NCCL_SOCKET_IFNAME": "^ib,lo"})
	assert.Equal(t, "docker0<172.17.0.1>", pick())
	withEnv(t, map[string]string{"NCCL_SOCKET_IFNAME": "eth"})
	assert.Equal(t, "eth0<10.0.0.2>", pick(), "IPv4 first, as getifaddrs lists it")
	withEnv(t, map[string]string{"NCCL_SOCKET_IFNAME": "eth", "NCCL_SOCKET_FAMILY": "AF_INET6"})
	assert.Equal(t, "eth0<2001:db8::2>", pick(), "the first IPv6 address, as NCCL")
	withEnv(t, map[string]string{"NCCL_SOCKET_IFNAME": "=eth1"})
	assert.Equal(t, "eth1<fe80::5%eth1>", pick(), "a link-local address is used, with its interface as zone (ib dials it through its own)")
	withEnv(t, map[string]string{"NCCL_SOCKET_IFNAME": "e"})
	assert.Equal(t, "ib0<192.168.1.2>", pick(), "one character: ignored")
	assert.Contains(t, log.String(), "NET/GoIB : ignoring NCCL_SOCKET_IFNAME=e")
}

func TestCommIDSubnetHint(t *testing.T) {
	log := &capture{}
	ifs := []Interface{
		up("lo", 1, "127.0.0.1/8"),
		up("eth0", 2, "10.0.0.2/24"),
		up("eth1", 3, "10.5.0.7/16", "2001:db8:1::7/64"),
		up("eth2", 4, "fe80::2/64"),
		up("eth3", 5, "fe80::3/64"),
	}
	resolved := map[string][]netip.Addr{"head-node": {netip.MustParseAddr("10.5.200.1")}}
	o := socketOpts(log)
	o.Resolve = func(_ context.Context, h string) ([]netip.Addr, error) {
		if a, ok := resolved[h]; ok {
			return a, nil
		}
		return nil, errors.New("no such host")
	}
	for _, c := range []struct {
		commID, want, how string
	}{
		{"10.5.3.4:29500", "eth1<10.5.0.7>", "default search (subnet of NCCL_COMM_ID=10.5.3.4:29500)"},
		{"head-node:29500", "eth1<10.5.0.7>", "default search (subnet of NCCL_COMM_ID=head-node:29500)"},
		{"[2001:db8:1::99]:29500", "eth1<2001:db8:1::7>", ""},
		{"[fe80::9%eth3]:29500", "eth3<fe80::3%eth3>", ""},
		// No match in any subnet: the next rule, all of them.
		{"192.168.9.9:1", "eth0<10.0.0.2> eth1<10.5.0.7> eth2<fe80::2%eth2> eth3<fe80::3%eth3>", "default search (^docker,lo,virbr)"},
		{"x", "eth0<10.0.0.2> eth1<10.5.0.7> eth2<fe80::2%eth2> eth3<fe80::3%eth3>", ""}, // one character: ignored
	} {
		withEnv(t, map[string]string{"NCCL_COMM_ID": c.commID})
		got, how := Find(ifs, o)
		var s []string
		for _, d := range got {
			s = append(s, d.String())
		}
		assert.Equal(t, c.want, strings.Join(s, " "), c.commID)
		if c.how != "" {
			assert.Equal(t, c.how, how, c.commID)
		}
	}
	assert.Empty(t, log.String())
	withEnv(t, map[string]string{"NCCL_COMM_ID": "unknown-host:1"})
	Find(ifs, o)
	assert.Contains(t, log.String(), `cannot resolve "unknown-host"`)
	withEnv(t, map[string]string{"NCCL_COMM_ID": "[fe80::1:1"})
	Find(ifs, o)
	assert.Contains(t, log.String(), "no ']'")
	// NCCL_SOCKET_IFNAME wins over the hint.
	withEnv(t, map[string]string{"NCCL_COMM_ID": "10.5.3.4:29500", "NCCL_SOCKET_IFNAME": "eth0"})
	got, _ := Find(ifs, o)
	assert.Equal(t, []string{"eth0"}, names(got))
}

func TestSharedSettings(t *testing.T) {
	log := &capture{}
	withEnv(t, nil)
	assert.Equal(t, uint64(DefaultMagic), ReadMagic(log, "NET/GoIB"))
	assert.Equal(t, Retry{Count: 34, Sleep: 100 * time.Millisecond}, ReadRetry(log, "NET/GoIB"))
	assert.Equal(t, ncclenv.AnyFamily, ReadFamily(log, "NET/GoIB"))
	withEnv(t, map[string]string{
		"NCCL_SOCKET_MAGIC": "0xfedcba9876543210", "NCCL_SOCKET_RETRY_CNT": "-3",
		"NCCL_SOCKET_RETRY_SLEEP_MSEC": "2.5", "NCCL_SOCKET_FAMILY": "AF_INET",
	})
	// Above 2^63: the ib reader used to take it as signed and fall back.
	assert.Equal(t, uint64(0xfedcba9876543210), ReadMagic(log, "NET/GoIB"))
	assert.Equal(t, Retry{Count: 0, Sleep: 2500 * time.Microsecond}, ReadRetry(log, "NET/GoIB"))
	assert.Equal(t, ncclenv.IPv4, ReadFamily(log, "NET/GoIB"))
	assert.Contains(t, log.String(), "NET/GoIB : ignoring NCCL_SOCKET_RETRY_CNT=-3: must be in [0, 2147483647]; using 0")
	withEnv(t, map[string]string{"NCCL_SOCKET_MAGIC": "magic"})
	assert.Equal(t, uint64(DefaultMagic), ReadMagic(log, "NET/GoSocket"))
	assert.Contains(t, log.String(), "NET/GoSocket : ignoring NCCL_SOCKET_MAGIC=magic")
	// strtoull reads "0x" as 0, and so do we, saying so.
	withEnv(t, map[string]string{"NCCL_SOCKET_MAGIC": "0x"})
	assert.Equal(t, uint64(0), ReadMagic(log, "NET/GoSocket"))
	assert.Contains(t, log.String(), "NET/GoSocket : reading NCCL_SOCKET_MAGIC=0x as 0x0")
}

func TestSplitHostPort(t *testing.T) {
	for in, want := range map[string][2]string{
		"10.0.0.1:5000":         {"10.0.0.1", ""},
		"node1:5000":            {"node1", ""},
		"node1":                 {"node1", ""},
		"[2001:db8::1]:5000":    {"2001:db8::1", ""},
		"[fe80::1%eth0]:5000":   {"fe80::1", "eth0"},
		"[fe80::1%ib0.8001]:50": {"fe80::1", "ib0.8001"},
	} {
		h, z, err := splitHostPort(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, [2]string{h, z}, in)
	}
	for _, bad := range []string{":5000", "[::1"} {
		_, _, err := splitHostPort(bad)
		assert.Error(t, err, bad)
	}
	// An IPv6 address without brackets used to be read as host "2001",
	// which then failed to resolve ("cannot resolve \"2001\""): the WARN now
	// says what to write.
	for _, bad := range []string{"2001:db8::1:5000", "fe80::1%eth0:5000", "::ffff:10.0.0.1:5000"} {
		_, _, err := splitHostPort(bad)
		if assert.Error(t, err, bad) {
			assert.Contains(t, err.Error(), "an IPv6 address needs brackets: [<ipv6>]:<port>", bad)
		}
	}
}

func TestHostInterfacesIncludeLoopback(t *testing.T) {
	ifs, err := Host{}.Interfaces()
	require.NoError(t, err)
	for _, i := range ifs {
		if i.Name != "lo" {
			continue
		}
		require.NotEmpty(t, i.Addrs)
		assert.Contains(t, i.Addrs, netip.MustParsePrefix("127.0.0.1/8"))
		return
	}
	t.Skip("this host has no interface called lo")
}
