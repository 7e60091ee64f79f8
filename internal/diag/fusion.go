package diag

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/libnccl-net-go/libnccl-net-go/internal/abi"
	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// pathType is NCCL's PCI distance between two NICs (graph/topo.h), in NCCL's
// order: a merge level admits every distance up to itself.
type pathType int

const (
	pathLOC pathType = iota
	pathPORT
	pathPIX
	pathPXB
	pathP2C
	pathPXN
	pathPHB
	pathSYS
	pathDIS
)

// NCCL's nicPathKvList, in its order (the order matters: NCCL takes the first
// name that is a prefix of the value).
var pathNames = []struct {
	name string
	p    pathType
}{{"LOC", pathLOC}, {"PORT", pathPORT}, {"PIX", pathPIX}, {"PXB", pathPXB}, {"P2C", pathP2C}, {"PXN", pathPXN}, {"PHB", pathPHB}, {"SYS", pathSYS}}

func (p pathType) String() string {
	if p == pathDIS {
		return "DIS"
	}
	for _, n := range pathNames {
		if n.p == p {
			return n.name
		}
	}
	return fmt.Sprintf("path(%d)", int(p))
}

// mergeLevel reads NCCL_NET_MERGE_LEVEL as NCCL's kvConvertToInt does: the
// first level whose name is a prefix of the value (case-sensitive), and LOC
// (no fusion) for anything else, set-but-empty included.
func mergeLevel() (pathType, string) {
	v, ok := ncclenv.Lookup("NCCL_NET_MERGE_LEVEL")
	if !ok {
		return pathPORT, ""
	}
	for _, n := range pathNames {
		if strings.HasPrefix(v, n.name) {
			return n.p, ""
		}
	}
	return pathLOC, fmt.Sprintf("NCCL_NET_MERGE_LEVEL=%q is none of LOC, PORT, PIX, PXB, PHB, SYS: NCCL silently uses LOC (no fusion)", v)
}

// pciNode splits a sysfs PCI path into the bus ids below the host bridge
// ("/sys/devices/pci0000:00/0000:00:03.0/0000:03:00.0" -> [0000:00:03.0
// 0000:03:00.0]), the nodes NCCL's topology XML gets for it. A NIC without
// one (virtual, rxe) is attached to the first CPU.
func pciNodes(p string) []string {
	if p == "" {
		return nil
	}
	parts := strings.Split(strings.Trim(p, "/"), "/")
	var out []string
	for _, c := range parts {
		if isBusID(c) {
			out = append(out, c)
		}
	}
	return out
}

func isBusID(s string) bool {
	// dddd:bb:dd.f
	if len(s) != 12 || s[4] != ':' || s[7] != ':' || s[10] != '.' {
		return false
	}
	for i, c := range s {
		if i == 4 || i == 7 || i == 10 {
			continue
		}
		if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
			return false
		}
	}
	return true
}

// distance is ncclTopoGetPath for two NICs, from their PCI paths. numa gives
// the NUMA node of a PCI path (-1 unknown).
func distance(a, b string, numa func(string) int) pathType {
	na, nb := pciNodes(a), pciNodes(b)
	if len(na) == 0 || len(nb) == 0 {
		// Attached to the first CPU: PHB from anything on that CPU.
		other := a + b
		if other == "" || numa(other) <= 0 {
			return pathPHB
		}
		return pathSYS
	}
	k := 0
	for k < len(na) && k < len(nb) && na[k] == nb[k] {
		k++
	}
	if k == len(na) && k == len(nb) {
		return pathPORT // the same NIC (its ports share the PCI function)
	}
	if k < len(na) && k < len(nb) && na[k][:11] == nb[k][:11] {
		return pathPORT // NCCL's multi-port rule: bus ids equal but for the function digit
	}
	if k == 0 {
		ma, mb := numa(a), numa(b)
		if ma == mb || ma < 0 || mb < 0 {
			return pathPHB
		}
		return pathSYS
	}
	if len(na) == k+1 && len(nb) == k+1 {
		return pathPIX // both NIC functions hang directly off the common switch
	}
	return pathPXB
}

// numaReader reads the numa_node of a /sys/devices path under root, from the
// nearest directory up the path that has one.
func numaReader(root string) func(string) int {
	return func(p string) int {
		for rel := strings.TrimPrefix(p, "/sys"); rel != "/" && rel != "." && rel != ""; rel = filepath.Dir(rel) {
			b, err := os.ReadFile(filepath.Join(root, rel, "numa_node"))
			if err != nil {
				continue
			}
			if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				return n
			}
			return -1
		}
		return -1
	}
}

// PredictVNICs replays NCCL's ncclTopoMakeVNics for the physical devices of
// t (described by devs): NCCL_NET_FORCE_MERGE groups first, then automatic
// fusion of devices at most NCCL_NET_MERGE_LEVEL apart, calling the
// transport's own MakeVDevice; a refused group is split up the way NCCL does
// (its members are marked disconnected and the search restarts). Virtual
// devices created are appended to devs' owner through the returned Fusion
// and added devices.
func PredictVNICs(t nccl.Transport, devs []Device, sysfsRoot string) (*Fusion, []Device) {
	f := &Fusion{Policy: "ALL", MaxPerNIC: abi.MaxDevsPerNICV12}
	lvl, note := mergeLevel()
	f.Level = lvl.String()
	if note != "" {
		f.Notes = append(f.Notes, note)
	}
	if v, ok := ncclenv.Lookup("NCCL_NET_MERGE_POLICY"); ok {
		if strings.EqualFold(v, "RAIL") {
			f.Policy = "RAIL"
		} else if !strings.EqualFold(v, "ALL") {
			f.Notes = append(f.Notes, fmt.Sprintf("NCCL_NET_MERGE_POLICY=%q is neither ALL nor RAIL: NCCL WARNs and uses ALL", v))
		}
	}
	f.Force, _ = ncclenv.Lookup("NCCL_NET_FORCE_MERGE")
	vm, ok := t.(nccl.VDeviceMaker)
	f.Supported = ok
	if !ok {
		return f, nil // the glue hands NCCL a NULL makeVDevice: physical devices only
	}
	n := len(devs)
	if n == 0 {
		return f, nil
	}
	numa := numaReader(sysfsRoot)
	var added []Device
	placed := make([]bool, n)
	make1 := func(members []int, forced bool) error {
		idx, err := vm.MakeVDevice(members)
		if err != nil {
			return err
		}
		v := VNIC{Index: idx, Members: append([]int(nil), members...), Forced: forced, Path: pathLOC.String()}
		far := pathLOC
		for _, m := range members {
			v.Names = append(v.Names, devs[m].Name)
			if d := distance(devs[members[0]].PCIPath, devs[m].PCIPath, numa); m != members[0] && d > far {
				far = d
			}
		}
		v.Path = far.String()
		f.VNICs = append(f.VNICs, v)
		if p, err := t.Properties(idx); err == nil {
			d := FromProperties(idx, p.WithDefaults(t.Name(), idx))
			d.Virtual = true
			added = append(added, d)
		}
		return nil
	}
	if f.Force != "" {
		for _, group := range strings.Split(f.Force, ";") {
			if group == "" {
				continue // strtok_r skips empty tokens
			}
			// NCCL parses a group with parseStringList, which knows no '^'
			// or '=' (they would be part of a name), and matches names exactly.
			want, _ := ncclenv.ParseList(group, f.MaxPerNIC)
			if group[0] == '^' || group[0] == '=' {
				want = ncclenv.List{}
			}
			want.Exact, want.Exclude = true, false
			if len(want.Entries) == 0 {
				f.Error = fmt.Sprintf("NCCL_NET_FORCE_MERGE group %q names no device NCCL can parse: it matches nothing", group)
				return f, added
			}
			var members []int
			for d := 0; d < n; d++ {
				if want.Match(devs[d].Name, devs[d].Port) {
					members = append(members, d)
				}
			}
			if len(members) != len(want.Entries) {
				f.Error = fmt.Sprintf("NCCL_NET_FORCE_MERGE group %q matches %d device(s), %d requested: NCCL fails with ncclInvalidUsage", group, len(members), len(want.Entries))
				return f, added
			}
			if len(members) == 1 {
				// NCCL makes no vNIC of size 1, but the device is placed
				// all the same: automatic merging leaves it alone.
				placed[members[0]] = true
				continue
			}
			if err := make1(members, true); err != nil {
				f.Error = fmt.Sprintf("NCCL_NET_FORCE_MERGE group %q: makeVDevice refused: %v; NCCL fails with ncclInvalidUsage", group, err)
				return f, added
			}
			for _, m := range members {
				placed[m] = true
			}
		}
	}
	paths := make([][]pathType, n)
	for i := range paths {
		paths[i] = make([]pathType, n)
		for j := range paths[i] {
			paths[i][j] = distance(devs[i].PCIPath, devs[j].PCIPath, numa)
		}
	}
	for i := 0; i < n; i++ {
		if placed[i] {
			continue
		}
		members := []int{i}
		placed[i] = true
		for j := 0; j < n && len(members) < f.MaxPerNIC; j++ {
			if j == i || placed[j] || paths[i][j] > lvl || f.Policy == "RAIL" && !sameRail(devs[i], devs[j]) {
				continue
			}
			members = append(members, j)
			placed[j] = true
		}
		if len(members) == 1 {
			continue
		}
		if err := make1(members, false); err != nil {
			f.Notes = append(f.Notes, fmt.Sprintf("NCCL would ask to fuse %v and the transport refuses (%v): NCCL keeps them separate", names(devs, members), err))
			for _, m := range members[1:] {
				placed[m] = false
				paths[i][m], paths[m][i] = pathDIS, pathDIS
			}
			placed[i] = false
			i = 0 // NCCL restarts here (and its i++ then skips device 0, as NCCL does)
		}
	}
	return f, added
}

// sameRail is NCCL's RAIL policy test: both rail ids defined and equal.
func sameRail(a, b Device) bool {
	return a.RailID != nil && b.RailID != nil && *a.RailID == *b.RailID
}

func names(devs []Device, idx []int) []string {
	out := make([]string, len(idx))
	for i, d := range idx {
		out[i] = devs[d].Name
		if devs[d].Port != 0 {
			out[i] += ":" + strconv.Itoa(devs[d].Port)
		}
	}
	return out
}
