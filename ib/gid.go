package ib

import (
	"fmt"
	"net/netip"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/sysfs"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

func gidFamily(g verbs.GID) int {
	if netip.AddrFrom16(g).Is4In6() {
		return 4
	}
	return 6
}

// gidValid rejects empty entries and link-local (fe80::/10) GIDs, which are
// not routable for RoCE v2.
func gidValid(g verbs.GID) bool {
	return !g.IsZero() && !(g[0] == 0xfe && g[1]&0xc0 == 0x80)
}

func (c gidConfig) inRange(g verbs.GID) bool {
	return !c.hasRange || c.addrRange.Contains(g.Addr())
}

// selectGID picks the GID index of a port. IB ports use index 0; RoCE ports
// take NCCL_IB_GID_INDEX when set, else the first GID of the wanted family
// (IPv4 by default) inside NCCL_IB_ADDR_RANGE whose RoCE version is
// NCCL_IB_ROCE_VERSION_NUM: in practice the first IPv4 RoCE v2 GID. GIDs whose
// type sysfs refuses to report (EINVAL, not mapped into this namespace) are
// skipped.
func selectGID(ctx verbs.Context, fs sysfs.FS, port int, attr verbs.PortAttr, c gidConfig) (int, verbs.GID, error) {
	dev := ctx.Name()
	if attr.LinkLayer != verbs.LinkEthernet {
		g, err := ctx.QueryGID(port, 0)
		return 0, g, err
	}
	if c.index >= 0 {
		if c.index >= attr.GIDTblLen {
			return 0, verbs.GID{}, nccl.Errorf(nccl.InvalidArgument, "NCCL_IB_GID_INDEX=%d but %s port %d has %d GIDs; unset it (NCCL >= 2.21 picks the IPv4 RoCE v2 GID itself)", c.index, dev, port, attr.GIDTblLen)
		}
		g, err := ctx.QueryGID(port, c.index)
		return c.index, g, err
	}
	cur, err := ctx.QueryGID(port, 0)
	if err != nil {
		return 0, verbs.GID{}, err
	}
	curIdx := 0
	curVer, _ := fs.RoCEVersion(dev, port, 0)
	for i := 1; i < attr.GIDTblLen; i++ {
		g, err := ctx.QueryGID(port, i)
		if err != nil {
			continue
		}
		ver, err := fs.RoCEVersion(dev, port, i)
		if err != nil {
			continue // EINVAL: not mapped into this namespace; anything else: unknown type
		}
		famSwitch := gidFamily(g) == c.family && gidFamily(cur) != c.family && gidValid(g) && c.inRange(g)
		verSwitch := gidFamily(g) == gidFamily(cur) && gidValid(g) && c.inRange(g) && ver == c.roceVersion &&
			(curVer != c.roceVersion || !gidValid(cur))
		if famSwitch || verSwitch {
			cur, curIdx, curVer = g, i, ver
		}
	}
	if !gidValid(cur) {
		return curIdx, cur, fmt.Errorf("no routable GID on %s port %d (best was index %d, %v); give the netdev an IP address or set NCCL_IB_GID_INDEX", dev, port, curIdx, cur)
	}
	return curIdx, cur, nil
}
