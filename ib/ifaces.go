package ib

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// iface is a candidate interface for the out-of-band handshake.
type iface struct {
	name  string
	addrs []netip.Addr
}

// listInterfaces is replaced in tests.
var listInterfaces = func() ([]iface, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []iface
	for _, it := range ifs {
		if it.Flags&net.FlagUp == 0 || it.Flags&net.FlagRunning == 0 {
			continue
		}
		addrs, err := it.Addrs()
		if err != nil {
			continue
		}
		c := iface{name: it.Name}
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil {
				c.addrs = append(c.addrs, p.Addr())
			}
		}
		out = append(out, c)
	}
	return out, nil
}

// findOOBInterface chooses the one interface the TCP handshake listens on,
// with NCCL's rules: NCCL_SOCKET_IFNAME (longer than one character; prefixes,
// '^' excludes, '=' exact) if set, otherwise the first of ib*, anything but
// docker*/lo/virbr*, docker*, lo, virbr*. NCCL_SOCKET_FAMILY=AF_INET/AF_INET6
// restricts the address family. IPv6 loopback and link-local addresses are
// skipped (they need a zone the peer cannot know).
func findOOBInterface(log nccl.Logger) (string, netip.Addr, error) {
	ifs, err := listInterfaces()
	if err != nil {
		return "", netip.Addr{}, err
	}
	fam := 0
	switch f := strings.ToUpper(nccl.EnvString("NCCL_SOCKET_FAMILY", "")); f {
	case "":
	case "AF_INET":
		fam = 4
	case "AF_INET6":
		fam = 6
	default:
		log.Warnf("NET/GoIB : ignoring NCCL_SOCKET_FAMILY=%s: expected AF_INET or AF_INET6", f)
	}
	addrOf := func(it iface) (netip.Addr, bool) {
		for _, a := range it.addrs {
			if a.Is6() && (a.IsLoopback() || a.IsLinkLocalUnicast()) || fam == 4 && !a.Is4() || fam == 6 && !a.Is6() {
				continue
			}
			return a, true
		}
		return netip.Addr{}, false
	}
	pick := func(match func(string) bool) (string, netip.Addr, bool) {
		for _, it := range ifs {
			if !match(it.name) {
				continue
			}
			if a, ok := addrOf(it); ok {
				return it.name, a, true
			}
		}
		return "", netip.Addr{}, false
	}
	if want := nccl.EnvString("NCCL_SOCKET_IFNAME", ""); len(want) > 1 {
		f, err := parseHCAFilter(want)
		if err != nil {
			return "", netip.Addr{}, nccl.Errorf(nccl.InvalidArgument, "NCCL_SOCKET_IFNAME=%s: %v", want, err)
		}
		if n, a, ok := pick(func(s string) bool { return f.match(s, -1) }); ok {
			return n, a, nil
		}
		return "", netip.Addr{}, fmt.Errorf("no up interface with an address matches NCCL_SOCKET_IFNAME=%s", want)
	}
	has := func(p string) func(string) bool { return func(s string) bool { return strings.HasPrefix(s, p) } }
	other := func(s string) bool {
		return !strings.HasPrefix(s, "docker") && s != "lo" && !strings.HasPrefix(s, "virbr")
	}
	for _, m := range []func(string) bool{has("ib"), other, has("docker"), func(s string) bool { return s == "lo" }, has("virbr")} {
		if n, a, ok := pick(m); ok {
			return n, a, nil
		}
	}
	return "", netip.Addr{}, fmt.Errorf("no up interface with an IP address; set NCCL_SOCKET_IFNAME")
}
