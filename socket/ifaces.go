package socket

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// maxIfs is NCCL's MAX_IFS: at most 16 devices, and 16 entries in a list.
const maxIfs = 16

// Iface is one network interface as the enumeration reports it.
type Iface struct {
	Name    string
	Index   int
	Up      bool
	Running bool // IFF_RUNNING: the link is operational
	Addrs   []netip.Addr
}

// IfaceSource lists the host's interfaces. Tests inject fake lists; the real
// one reads the kernel's.
type IfaceSource interface {
	Interfaces() ([]Iface, error)
}

type hostIfaces struct{}

func (hostIfaces) Interfaces() ([]Iface, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	out := make([]Iface, 0, len(ifs))
	for _, i := range ifs {
		addrs, err := i.Addrs()
		if err != nil {
			continue
		}
		fi := Iface{Name: i.Name, Index: i.Index, Up: i.Flags&net.FlagUp != 0, Running: i.Flags&net.FlagRunning != 0}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					fi.Addrs = append(fi.Addrs, ip.Unmap())
				}
			}
		}
		out = append(out, fi)
	}
	return out, nil
}

// device is one usable interface: the address we listen on.
type device struct {
	name  string
	index int
	addr  netip.Addr // link-local IPv6 carries the interface as zone
	props nccl.Properties
}

// ifPattern is one entry of an NCCL interface list.
type ifPattern struct {
	prefix string
	port   int // -1 when absent; parsed and ignored for matching, as NCCL does
}

// ifList is a parsed NCCL_SOCKET_IFNAME-style list: "^" excludes, "=" makes
// entries exact names, entries are comma-separated and may carry ":port".
type ifList struct {
	not, exact bool
	entries    []ifPattern
}

// parseIfList follows NCCL's parseStringList: empty entries are dropped, a
// ":port" suffix ends an entry, and at most 16 entries are kept.
func parseIfList(s string) ifList {
	var l ifList
	if strings.HasPrefix(s, "^") {
		l.not = true
		s = s[1:]
	}
	if strings.HasPrefix(s, "=") {
		l.exact = true
		s = s[1:]
	}
	for _, e := range strings.Split(s, ",") {
		if len(l.entries) == maxIfs {
			break
		}
		port := -1
		if i := strings.IndexByte(e, ':'); i >= 0 {
			if p, err := strconv.Atoi(e[i+1:]); err == nil {
				port = p
			} else {
				port = 0 // atoi of garbage is 0 in NCCL
			}
			e = e[:i]
		}
		if e == "" {
			continue
		}
		l.entries = append(l.entries, ifPattern{prefix: e, port: port})
	}
	return l
}

// match is NCCL's matchIfList XOR the "^": an empty list matches everything
// (so "^" alone matches nothing).
func (l ifList) match(name string) bool {
	m := len(l.entries) == 0
	for _, e := range l.entries {
		if (l.exact && name == e.prefix) || (!l.exact && strings.HasPrefix(name, e.prefix)) {
			m = true
			break
		}
	}
	return m != l.not
}

// family is NCCL_SOCKET_FAMILY: 0 (any), 4 or 6.
func family(log nccl.Logger) int {
	v := nccl.EnvString(envFamily, "")
	switch v {
	case "":
		return 0
	case "AF_INET":
		return 4
	case "AF_INET6":
		return 6
	}
	log.Warnf("NET/GoSocket : ignoring %s=%s: use AF_INET or AF_INET6", envFamily, v)
	return 0
}

// findIfaces returns up to max interfaces matching list, in NCCL's order:
// getifaddrs lists every IPv4 address before any IPv6 one, and an interface
// is taken once, with the first address found.
func findIfaces(ifs []Iface, list string, fam int, max int) []device {
	l := parseIfList(list)
	var out []device
	seen := map[string]bool{}
	for _, want := range []int{4, 6} {
		if fam != 0 && fam != want {
			continue
		}
		for _, i := range ifs {
			if len(out) == max {
				return out
			}
			if seen[i.Name] || !i.Up || !i.Running || !l.match(i.Name) {
				continue
			}
			for _, a := range i.Addrs {
				if !a.IsValid() || (a.Is4() != (want == 4)) {
					continue
				}
				if want == 6 && a.IsLoopback() {
					continue // NCCL skips IPv6 loopback
				}
				if want == 6 && (a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast()) {
					// A link-local address means nothing without its interface.
					a = a.WithZone(i.Name)
				}
				seen[i.Name] = true
				out = append(out, device{name: i.Name, index: i.Index, addr: a})
				break
			}
		}
	}
	return out
}

// findDevices applies NCCL_SOCKET_IFNAME when it is longer than one character,
// else NCCL's default search: ib, then anything but docker/lo/virbr, then
// docker, lo, virbr; the first step that finds anything wins.
func findDevices(ifs []Iface, log nccl.Logger) ([]device, string) {
	fam := family(log)
	if v, ok := nccl.LookupEnv(envIfname); ok && len(v) > 1 {
		return findIfaces(ifs, v, fam, maxIfs), envIfname + "=" + v
	}
	for _, list := range []string{"ib", "^docker,lo,virbr", "docker", "lo", "virbr"} {
		if d := findIfaces(ifs, list, fam, maxIfs); len(d) > 0 {
			return d, "default search (" + list + ")"
		}
	}
	return nil, "default search"
}

// sysfs reads interface attributes under root (normally /sys).
type sysfs struct{ root string }

// speed is <root>/class/net/<if>/speed in Mbps; missing, unreadable, or
// unknown (-1, as virtual NICs report) gives NCCL's 10000.
func (s sysfs) speed(ifname string) int {
	b, err := os.ReadFile(filepath.Join(s.root, "class", "net", ifname, "speed"))
	if err != nil {
		return 10000
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n <= 0 {
		return 10000
	}
	return n
}

// pciPath is the realpath of <root>/class/net/<if>/device, "" for a virtual
// interface (no device link).
func (s sysfs) pciPath(ifname string) string {
	p, err := filepath.EvalSymlinks(filepath.Join(s.root, "class", "net", ifname, "device"))
	if err != nil {
		return ""
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return abs
}

func (d *device) String() string { return fmt.Sprintf("%s<%s>", d.name, d.addr) }
