package socket

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

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
	props nccl.Properties
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
	}
	return devs, how
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
