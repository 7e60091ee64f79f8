package ib

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclsock"
)

type fixedIfaces []ncclsock.Interface

func (f fixedIfaces) Interfaces() ([]ncclsock.Interface, error) { return f, nil }

func TestOOBInterfaceSelection(t *testing.T) {
	p := func(s string) netip.Prefix { return netip.MustParsePrefix(s) }
	hostInterfaces.Set(t, fixedIfaces{
		{Name: "lo", Up: true, Running: true, Addrs: []netip.Prefix{p("127.0.0.1/8"), p("::1/128")}},
		{Name: "lo1", Up: true, Running: true, Addrs: []netip.Prefix{p("127.0.1.1/8")}},
		{Name: "docker0", Up: true, Running: true, Addrs: []netip.Prefix{p("172.17.0.1/16")}},
		// The kernel lists an interface's global IPv6 addresses before its link-local one.
		{Name: "eth0", Up: true, Running: true, Addrs: []netip.Prefix{p("2001:db8::2/64"), p("fe80::1/64"), p("10.0.0.2/24")}},
		{Name: "ib0", Up: true, Running: true, Addrs: []netip.Prefix{p("192.168.1.2/24")}},
	})
	log := &captureLog{}
	pick := func() (string, string) {
		n, ad, err := findOOBInterface(log)
		if err != nil {
			return "", err.Error()
		}
		return n, ad.String()
	}
	setEnv(t, "NCCL_SOCKET_IFNAME", "")
	n, ad := pick()
	assert.Equal(t, []string{"ib0", "192.168.1.2"}, []string{n, ad}, "ib* first")
	setEnv(t, "NCCL_SOCKET_IFNAME", "^ib,lo")
	n, ad = pick()
	assert.Equal(t, []string{"docker0", "172.17.0.1"}, []string{n, ad}, "exclusion list; lo is a prefix (lo1 too)")
	setEnv(t, "NCCL_SOCKET_IFNAME", "eth")
	n, ad = pick()
	assert.Equal(t, []string{"eth0", "10.0.0.2"}, []string{n, ad}, "IPv4 before IPv6, as NCCL's getifaddrs walk (was 2001:db8::2)")
	setEnv(t, "NCCL_SOCKET_IFNAME", "eth", "NCCL_SOCKET_FAMILY", "AF_INET6")
	_, ad = pick()
	assert.Equal(t, "2001:db8::2", ad, "the first IPv6 address, as NCCL")
	setEnv(t, "NCCL_SOCKET_IFNAME", "=eth")
	_, ad = pick()
	assert.Contains(t, ad, "NCCL_SOCKET_IFNAME==eth")
	setEnv(t, "NCCL_SOCKET_IFNAME", "e") // one character: ignored, like NCCL
	n, _ = pick()
	assert.Equal(t, "ib0", n)
	// A port that is not a number no longer makes ib unavailable: NCCL
	// ignores ports in interface lists; a WARN says what it read.
	setEnv(t, "NCCL_SOCKET_IFNAME", "eth0:x")
	n, _ = pick()
	assert.Equal(t, "eth0", n)
	assert.True(t, log.has(`WARN NET/GoIB : NCCL_SOCKET_IFNAME=eth0:x: port "x"`), log.String())
	// Default search: lo* after docker, by prefix as NCCL (ib matched only "lo").
	hostInterfaces.Set(t, fixedIfaces{{Name: "lo1", Up: true, Running: true, Addrs: []netip.Prefix{p("127.0.1.1/8")}}})
	setEnv(t, "NCCL_SOCKET_IFNAME", "")
	n, _ = pick()
	assert.Equal(t, "lo1", n)
}

// An interface with only an IPv6 link-local address is one NCCL's IB
// transport uses for its handshake (its handle carries the scope id). It
// used to be skipped, so the default search fell through to lo and
// advertised 127.0.0.1 to peers on other hosts; with NCCL_SOCKET_IFNAME set
// to it, init failed.
func TestOOBInterfaceLinkLocalOnly(t *testing.T) {
	p := func(s string) netip.Prefix { return netip.MustParsePrefix(s) }
	hostInterfaces.Set(t, fixedIfaces{
		{Name: "lo", Index: 1, Up: true, Running: true, Addrs: []netip.Prefix{p("127.0.0.1/8"), p("::1/128")}},
		{Name: "eth0", Index: 2, Up: true, Running: true, Addrs: []netip.Prefix{p("fe80::1/64")}},
	})
	for _, ifname := range []string{"", "eth0"} {
		setEnv(t, "NCCL_SOCKET_IFNAME", ifname)
		n, ad, err := findOOBInterface(&captureLog{})
		if assert.NoError(t, err, "NCCL_SOCKET_IFNAME=%q", ifname) {
			assert.Equal(t, []string{"eth0", "fe80::1%eth0"}, []string{n, ad.String()}, "NCCL_SOCKET_IFNAME=%q", ifname)
		}
	}
	// The connector dials a link-local listener through its own handshake
	// interface; other addresses are dialled as they are.
	tr := &Transport{oobName: "eth3"}
	assert.Equal(t, "[fe80::9%eth3]:7", tr.dialAddr(netip.MustParseAddrPort("[fe80::9]:7")).String())
	assert.Equal(t, "[2001:db8::9]:7", tr.dialAddr(netip.MustParseAddrPort("[2001:db8::9]:7")).String())
	assert.Equal(t, "10.0.0.9:7", tr.dialAddr(netip.MustParseAddrPort("10.0.0.9:7")).String())
}
