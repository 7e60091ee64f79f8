package ncclsock

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
)

// Interface is one network interface as the enumeration reports it.
type Interface struct {
	Name    string
	Index   int
	Up      bool
	Running bool           // IFF_RUNNING: the link is operational
	Addrs   []netip.Prefix // in the kernel's order, with their subnet
}

// Source lists the host's interfaces; tests inject fixed lists.
type Source interface {
	Interfaces() ([]Interface, error)
}

// Host is the kernel's interface list.
type Host struct{}

// Interfaces implements Source.
func (Host) Interfaces() ([]Interface, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	out := make([]Interface, 0, len(ifs))
	for _, i := range ifs {
		addrs, err := i.Addrs()
		if err != nil {
			continue
		}
		fi := Interface{Name: i.Name, Index: i.Index, Up: i.Flags&net.FlagUp != 0, Running: i.Flags&net.FlagRunning != 0}
		for _, a := range addrs {
			n, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(n.IP)
			if !ok {
				continue
			}
			ip = ip.Unmap()
			ones, bits := n.Mask.Size()
			if ip.Is4() && bits == 128 {
				ones -= 96
			}
			fi.Addrs = append(fi.Addrs, netip.PrefixFrom(ip, ones))
		}
		out = append(out, fi)
	}
	return out, nil
}

// Device is an interface NCCL's rules selected, with the one address used.
type Device struct {
	Name  string
	Index int
	Addr  netip.Addr // an IPv6 link-local address carries the interface as zone
	// Bits is the length of Addr's subnet prefix on the interface.
	Bits int
}

func (d Device) String() string { return fmt.Sprintf("%s<%s>", d.Name, d.Addr) }

// Options tune Find for its caller.
type Options struct {
	// Max is how many devices the caller wants: ncclenv.MaxIfs for the socket
	// transport, 1 for ib's out-of-band handshake.
	Max int
	// Log and Prefix: where and as whom WARNs about the settings go.
	Log    ncclenv.Logger
	Prefix string
	// Resolve looks up NCCL_COMM_ID's host name; nil uses the system resolver
	// (bounded to 5 s).
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
}

// Find selects interfaces as NCCL's ncclFindInterfaces does. With
// NCCL_SOCKET_IFNAME set (longer than one character) its list decides, and
// nothing else. Otherwise the first of these that finds anything wins: ib*;
// the interface in NCCL_COMM_ID's subnet; anything but docker*, lo*,
// virbr*; docker*; lo*; virbr*. Only interfaces that are up and running
// count, NCCL_SOCKET_FAMILY restricts the address family, IPv6 loopback is
// skipped, and each interface is taken once, with its first address in
// getifaddrs order (every IPv4 address before any IPv6 one). how says which
// rule chose, for the caller's INFO and WARN lines.
func Find(ifs []Interface, o Options) (devs []Device, how string) {
	if o.Max <= 0 {
		o.Max = ncclenv.MaxIfs
	}
	fam := ReadFamily(o.Log, o.Prefix)
	if v, ok := ncclenv.Lookup(IfName.Name()); ok {
		if v = strings.TrimSpace(v); len(v) > 1 {
			l := IfName.Parse(o.Log, o.Prefix, v)
			return match(ifs, l, fam, o), IfName.Name() + "=" + v
		} else if v != "" {
			warn(o, "ignoring %s=%s: NCCL ignores a value of one character; using the default search", IfName.Name(), v)
		}
	}
	if d := match(ifs, mustList("ib"), fam, o); len(d) > 0 {
		return d, "default search (ib)"
	}
	if d, ok := subnetOfCommID(ifs, o); ok {
		return []Device{d}, fmt.Sprintf("default search (subnet of %s=%s)", CommID.Name(), CommID.Get())
	}
	for _, list := range []string{"^docker,lo,virbr", "docker", "lo", "virbr"} {
		if d := match(ifs, mustList(list), fam, o); len(d) > 0 {
			return d, "default search (" + list + ")"
		}
	}
	return nil, "default search"
}

func mustList(s string) ncclenv.List {
	l, _ := ncclenv.ParseList(s, ncclenv.MaxIfs)
	return l
}

func warn(o Options, format string, args ...any) {
	if o.Log == nil {
		return
	}
	if o.Prefix != "" {
		format = o.Prefix + " : " + format
	}
	o.Log.Warnf(format, args...)
}

// match is NCCL's findInterfaces: up to o.Max interfaces the list selects,
// in getifaddrs order.
func match(ifs []Interface, l ncclenv.List, fam ncclenv.Family, o Options) []Device {
	var out []Device
	taken := make(map[string]bool)
	for _, pass := range []ncclenv.Family{ncclenv.IPv4, ncclenv.IPv6} {
		if fam != ncclenv.AnyFamily && fam != pass {
			continue
		}
		for _, i := range ifs {
			if len(out) == o.Max {
				return out
			}
			if taken[i.Name] || !i.Up || !i.Running || !l.Match(i.Name, -1) {
				continue
			}
			if a, bits, ok := firstAddr(i, pass); ok {
				taken[i.Name] = true
				out = append(out, Device{Name: i.Name, Index: i.Index, Addr: a, Bits: bits})
			}
		}
	}
	return out
}

func firstAddr(i Interface, fam ncclenv.Family) (netip.Addr, int, bool) {
	for _, p := range i.Addrs {
		a := p.Addr().Unmap()
		if !a.IsValid() || a.Is4() != (fam == ncclenv.IPv4) {
			continue
		}
		if fam == ncclenv.IPv6 {
			if a.IsLoopback() {
				continue // NCCL skips IPv6 loopback
			}
			if a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() {
				a = a.WithZone(i.Name) // meaningless without its interface
			}
		}
		return a, p.Bits(), true
	}
	return netip.Addr{}, 0, false
}

// subnetOfCommID is NCCL's ncclFindInterfaceMatchSubnet: the first running
// interface with an address in the same subnet as NCCL_COMM_ID's host (one
// interface, as in NCCL). A malformed NCCL_COMM_ID is a WARN and the step is
// skipped (NCCL would fail init).
func subnetOfCommID(ifs []Interface, o Options) (Device, bool) {
	v := CommID.Get()
	if len(v) <= 1 {
		return Device{}, false
	}
	host, zone, err := splitHostPort(v)
	if err != nil {
		warn(o, "ignoring %s=%s for interface selection: %v", CommID.Name(), v, err)
		return Device{}, false
	}
	target, err := netip.ParseAddr(host)
	if err != nil {
		resolve := o.Resolve
		if resolve == nil {
			resolve = func(ctx context.Context, h string) ([]netip.Addr, error) {
				return net.DefaultResolver.LookupNetIP(ctx, "ip", h)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		addrs, rerr := resolve(ctx, host)
		cancel()
		if rerr != nil || len(addrs) == 0 {
			warn(o, "ignoring %s=%s for interface selection: cannot resolve %q: %v", CommID.Name(), v, host, rerr)
			return Device{}, false
		}
		target = addrs[0]
	}
	target = target.Unmap()
	for _, pass := range []bool{true, false} {
		if target.Is4() != pass {
			continue
		}
		for _, i := range ifs {
			if !i.Up || !i.Running {
				continue
			}
			for _, p := range i.Addrs {
				a := p.Addr().Unmap()
				if a.Is4() != target.Is4() || !p.Masked().Contains(target.WithZone("")) {
					continue
				}
				linkLocal := a.Is6() && a.IsLinkLocalUnicast()
				if linkLocal && zone != i.Name {
					continue // a link-local subnet only matches on its own link
				}
				if linkLocal {
					a = a.WithZone(i.Name)
				}
				return Device{Name: i.Name, Index: i.Index, Addr: a, Bits: p.Bits()}, true
			}
		}
	}
	return Device{}, false
}

// splitHostPort reads NCCL's "<host>:<port>" or "[<ipv6>[%<if>]]:<port>".
func splitHostPort(s string) (host, zone string, err error) {
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "", "", fmt.Errorf("no ']' closing the IPv6 address; expected [<ipv6>]:<port>")
		}
		host = s[1:end]
		if i := strings.IndexByte(host, '%'); i >= 0 {
			host, zone = host[:i], host[i+1:]
		}
		return host, zone, nil
	}
	if strings.Count(s, ":") > 1 {
		// NCCL would read "2001" of "2001:db8::1:5000" as a host name
		// (glibc then takes it for 0.0.7.209); no host name has a colon.
		return "", "", fmt.Errorf("an IPv6 address needs brackets: [<ipv6>]:<port> (or [<ipv6>%%<if>]:<port> for a link-local one)")
	}
	host, _, _ = strings.Cut(s, ":")
	if host == "" {
		return "", "", fmt.Errorf("no host; expected <host>:<port>")
	}
	return host, "", nil
}

// Unusable explains an empty Find under NCCL_SOCKET_IFNAME: the interfaces
// its list selects that Find could not use, each with why ("dn0 is down",
// "eth1 is up but not running (no carrier)", "eth2 has no AF_INET6
// address"), in getifaddrs order. nil when NCCL_SOCKET_IFNAME is unset or
// ignored, or when it selects no interface at all (a typo: the name is the
// problem). WARNs about the settings are left to Find.
func Unusable(ifs []Interface) []string {
	v, ok := ncclenv.Lookup(IfName.Name())
	if v = strings.TrimSpace(v); !ok || len(v) <= 1 {
		return nil
	}
	l := IfName.Parse(nil, "", v)
	fam := ReadFamily(nil, "")
	var out []string
	for _, i := range ifs {
		if !l.Match(i.Name, -1) {
			continue
		}
		switch {
		case !i.Up:
			out = append(out, i.Name+" is down")
		case !i.Running:
			out = append(out, i.Name+" is up but not running (no carrier)")
		default:
			_, _, ok4 := firstAddr(i, ncclenv.IPv4)
			_, _, ok6 := firstAddr(i, ncclenv.IPv6)
			switch {
			case fam == ncclenv.IPv4 && !ok4:
				out = append(out, i.Name+" has no AF_INET address")
			case fam == ncclenv.IPv6 && !ok6 && hasLoopback6(i):
				out = append(out, i.Name+" has no AF_INET6 address but loopback, which NCCL skips")
			case fam == ncclenv.IPv6 && !ok6:
				out = append(out, i.Name+" has no AF_INET6 address")
			case !ok4 && !ok6:
				out = append(out, i.Name+" has no usable address")
			}
		}
	}
	return out
}

func hasLoopback6(i Interface) bool {
	for _, p := range i.Addrs {
		if a := p.Addr().Unmap(); a.Is6() && a.IsLoopback() {
			return true
		}
	}
	return false
}
