package socket

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclsock"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Interface selection is NCCL's, shared with ib's handshake: internal/ncclsock
// owns NCCL_SOCKET_IFNAME, NCCL_SOCKET_FAMILY and the default search order.

// Iface is one network interface as the enumeration reports it.
type Iface = ncclsock.Interface

// IfaceSource lists the host's interfaces. Tests inject fake lists; the real
// one reads the kernel's.
type IfaceSource = ncclsock.Source

type hostIfaces = ncclsock.Host

const logPrefix = "NET/GoSocket"

// device is one usable interface: the address we listen on.
type device struct {
	name  string
	index int
	addr  netip.Addr // link-local IPv6 carries the interface as zone
	// subnet is addr's subnet on the interface (masked, unzoned); invalid
	// for a link-local or loopback address, whose subnet says nothing about
	// which NIC reaches a peer.
	subnet netip.Prefix
	props  nccl.Properties
}

// family is NCCL_SOCKET_FAMILY: 0 (any), 4 or 6.
func family(log nccl.Logger) int { return int(ncclsock.ReadFamily(log, logPrefix)) }

// findDevices returns the interfaces NCCL's rules select, at most NCCL's
// MAX_IFS (16), and how they were chosen.
func findDevices(ifs []Iface, log nccl.Logger) ([]device, string) {
	found, how := ncclsock.Find(ifs, ncclsock.Options{Max: ncclenv.MaxIfs, Log: log, Prefix: logPrefix})
	devs := make([]device, len(found))
	for i, f := range found {
		devs[i] = device{name: f.Name, index: f.Index, addr: f.Addr}
		if a := f.Addr; !a.IsLoopback() && !a.IsLinkLocalUnicast() && f.Bits > 0 {
			devs[i].subnet = netip.PrefixFrom(a.WithZone(""), f.Bits).Masked()
		}
	}
	return devs, how
}

// sharedSubnets names the devices whose subnets overlap ("rail0 (10.0.0.1/24)
// and rail1 (10.0.0.2/24)"), one entry per pair. The kernel routes a subnet
// through one interface, so NCCL's per-GPU choice of NIC means nothing for
// them unless source-based policy routing sends each address out of its own
// NIC (connections on such devices bind their source address for it,
// connect.go). A pair whose two addresses both have such a rule (rules) is
// set up for it and left out: cloud hosts with several NICs in one subnet
// are configured that way.
func sharedSubnets(devs []device, rules []netip.Prefix) []string {
	var out []string
	for i := range devs {
		for j := i + 1; j < len(devs); j++ {
			a, b := devs[i].subnet, devs[j].subnet
			if a.IsValid() && b.IsValid() && a.Overlaps(b) &&
				!(sourceRouted(rules, devs[i].addr) && sourceRouted(rules, devs[j].addr)) {
				out = append(out, fmt.Sprintf("%s (%s/%d) and %s (%s/%d)", devs[i].name, devs[i].addr, a.Bits(),
					devs[j].name, devs[j].addr, b.Bits()))
			}
		}
	}
	return out
}

// localAddr is the address a connection on device d binds before it
// connects, or nil to leave the choice to the kernel. When the listener is
// on d's own subnet (the same rail), d's address is bound, so that a host
// whose NICs share a subnet and route each source address out of its own
// NIC (ip rule from <addr> table ...) sends the connection through d, as
// NCCL chose; otherwise the kernel takes the first NIC of that subnet for
// every device's connections. With d alone on its subnet this is the
// address the kernel would pick. A listener elsewhere (another rail, a
// routed network) is left to the routing table, as NCCL does.
func localAddr(hi handleInfo, d *device) unix.Sockaddr {
	dst := hi.addr.Addr().Unmap().WithZone("")
	if !d.subnet.IsValid() || !d.subnet.Contains(dst) || dst == d.addr.Unmap() {
		return nil
	}
	return sockaddrOf(netip.AddrPortFrom(d.addr.Unmap(), 0), 0)
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
