// Package sysfs reads the RDMA facts NCCL's IB transport takes from sysfs:
// the PCI path of an HCA, port state and link layer, the netdev and RoCE
// version behind each GID index, and whether a GPU peer-memory module is
// loaded. The root is injectable (procfs style) so tests run against fixture
// trees in testdata.
package sysfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// DefaultRoot is where sysfs is mounted.
const DefaultRoot = "/sys"

// FS is a sysfs tree rooted at Root.
type FS struct{ Root string }

// New returns an FS at root ("" means /sys).
func New(root string) FS {
	if root == "" {
		root = DefaultRoot
	}
	return FS{Root: root}
}

func (fs FS) path(elem ...string) string {
	return filepath.Join(append([]string{fs.Root}, elem...)...)
}

func (fs FS) read(elem ...string) (string, error) {
	b, err := os.ReadFile(fs.path(elem...))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

func (fs FS) port(dev string, port int, elem ...string) []string {
	return append([]string{"class", "infiniband", dev, "ports", strconv.Itoa(port)}, elem...)
}

// PCIPath is the real path of the HCA's device directory, reported as it
// would be under /sys (NCCL's topology code reads it back from /sys).
func (fs FS) PCIPath(dev string) (string, error) {
	p, err := filepath.EvalSymlinks(fs.path("class", "infiniband", dev, "device"))
	if err != nil {
		return "", err
	}
	root, err := filepath.EvalSymlinks(fs.Root)
	if err != nil {
		return "", err
	}
	rel, err := filepath.Rel(root, p)
	if err != nil || strings.HasPrefix(rel, "..") {
		return p, nil
	}
	return filepath.Join(DefaultRoot, rel), nil
}

// PortState returns the port's state number and name ("4: ACTIVE").
func (fs FS) PortState(dev string, port int) (int, string, error) {
	s, err := fs.read(fs.port(dev, port, "state")...)
	if err != nil {
		return 0, "", err
	}
	num, name, ok := strings.Cut(s, ":")
	n, perr := strconv.Atoi(strings.TrimSpace(num))
	if !ok || perr != nil {
		return 0, "", fmt.Errorf("sysfs: %s port %d: malformed state %q", dev, port, s)
	}
	return n, strings.TrimSpace(name), nil
}

// LinkLayer returns "InfiniBand" or "Ethernet".
func (fs FS) LinkLayer(dev string, port int) (string, error) {
	return fs.read(fs.port(dev, port, "link_layer")...)
}

// NetDev returns the network interface behind GID index idx of a port (RoCE);
// it fails for IB ports, which have none.
func (fs FS) NetDev(dev string, port, idx int) (string, error) {
	return fs.read(fs.port(dev, port, "gid_attrs", "ndevs", strconv.Itoa(idx))...)
}

// ErrGIDUnmapped is returned (wrapping EINVAL) when the kernel refuses to
// report a GID's type, as it does for GIDs not mapped into a container's
// network namespace. Callers skip such GIDs.
var ErrGIDUnmapped = errors.New("sysfs: GID type not readable (EINVAL: not mapped into this namespace)")

// RoCEVersion returns 1 or 2 for GID index idx, from gid_attrs/types/<idx>
// ("IB/RoCE v1", "RoCE v2").
func (fs FS) RoCEVersion(dev string, port, idx int) (int, error) {
	s, err := fs.read(fs.port(dev, port, "gid_attrs", "types", strconv.Itoa(idx))...)
	if errors.Is(err, syscall.EINVAL) {
		return 0, fmt.Errorf("%w: %w", ErrGIDUnmapped, err)
	}
	if err != nil {
		return 0, err
	}
	switch {
	case strings.HasSuffix(s, "v2"):
		return 2, nil
	case strings.HasSuffix(s, "v1"):
		return 1, nil
	}
	return 0, fmt.Errorf("sysfs: %s port %d GID %d: unknown type %q", dev, port, idx, s)
}

// PeerMemoryPaths are the files whose presence means the NIC can register
// CUDA memory (nv_peer_mem / nvidia-peermem loaded).
var PeerMemoryPaths = []string{
	"kernel/mm/memory_peers/nv_mem/version",
	"kernel/mm/memory_peers/nv_mem_nc/version",
	"module/nvidia_peermem/version",
}

// PeerMemory reports whether a GPU peer-memory module is loaded, and which
// file said so.
func (fs FS) PeerMemory() (bool, string) {
	for _, p := range PeerMemoryPaths {
		if _, err := os.Stat(fs.path(p)); err == nil {
			return true, filepath.Join(DefaultRoot, p)
		}
	}
	return false, ""
}
