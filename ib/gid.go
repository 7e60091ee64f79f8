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

// gidValid rejects empty entries and link-local GIDs, which are not routable
// for RoCE v2. Link-local is NCCL's test (linkLocalGid): fe80::/64, the
// prefix the kernel gives the netdev's own GID, not all of fe80::/10.
func gidValid(g verbs.GID) bool {
	return !g.IsZero() && !gidLinkLocal(g)
}

func gidLinkLocal(g verbs.GID) bool {
	return g[0] == 0xfe && g[1] == 0x80 && g[2]|g[3]|g[4]|g[5]|g[6]|g[7] == 0
}

func (c gidConfig) inRange(g verbs.GID) bool {
	return !c.noMatch && (!c.hasRange || c.addrRange.Contains(g.Addr()))
}

// selectGID picks the GID index of a port. IB ports use index 0; RoCE ports
// take NCCL_IB_GID_INDEX when set, else the first GID of the wanted family
// (IPv4 by default) inside NCCL_IB_ADDR_RANGE whose RoCE version is
// NCCL_IB_ROCE_VERSION_NUM: in practice the first IPv4 RoCE v2 GID. GIDs whose
// type sysfs refuses to report (EINVAL, not mapped into this namespace) are
// skipped. As in NCCL, the choice starts at index 0 and is kept when nothing
// better qualifies, routable or not: a port whose netdev has no IP address
// uses its link-local GID, which reaches peers within one L2 segment. The
// callers WARN about that (unroutable).
func selectGID(ctx verbs.Context, fs sysfs.FS, port int, attr verbs.PortAttr, c gidConfig) (int, verbs.GID, error) {
	dev := ctx.Name()
	if attr.LinkLayer != verbs.LinkEthernet {
		// As NCCL's ncclIbGetGidIndex: the routable-FLID index when its GID
		// carries a FLID (the subnet manager's cross-subnet routing), else 0.
		if i := c.flidIndex; i >= 0 && i < attr.GIDTblLen {
			if g, err := ctx.QueryGID(port, i); err == nil && g.FLID() != 0 {
				return i, g, nil
			}
		}
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
	// The RoCE type lives in sysfs: read it only for candidates that could
	// win, as NCCL does. The table is mostly empty (rxe's has 1024 entries),
	// and this runs for every connection.
	version := func(i int) int {
		v, err := fs.RoCEVersion(dev, port, i)
		if err != nil {
			return -1 // EINVAL: not mapped into this namespace; else unknown
		}
		return v
	}
	curVer, curVerKnown := 0, false
	for i := 1; i < attr.GIDTblLen; i++ {
		g, err := ctx.QueryGID(port, i)
		if err != nil || !c.inRange(g) || gidFamily(g) != c.family {
			continue
		}
		if gidFamily(cur) != c.family {
			cur, curIdx, curVerKnown = g, i, false
			continue
		}
		if !gidValid(g) {
			continue
		}
		if !curVerKnown {
			curVer, curVerKnown = version(curIdx), true
		}
		if ver := version(i); ver == c.roceVersion && (curVer != ver || !gidValid(cur)) {
			cur, curIdx, curVer = g, i, ver
		}
	}
	return curIdx, cur, nil
}

// unroutable says whether g, the automatic choice for a port with link
// layer ll, is one NCCL keeps only because nothing better qualified: empty
// or link-local.
func (c gidConfig) unroutable(ll verbs.LinkLayer, g verbs.GID) bool {
	return ll == verbs.LinkEthernet && c.index < 0 && !gidValid(g)
}

// unroutableWarning is the WARN for a port that unroutable holds for.
func (c gidConfig) unroutableWarning(dev string, port, idx int, g verbs.GID) string {
	fam, knobs := "IPv4", "NCCL_IB_ADDR_FAMILY"
	if c.family == 6 {
		fam = "IPv6"
	}
	where := ""
	if c.hasRange || c.noMatch {
		where, knobs = " in NCCL_IB_ADDR_RANGE", "NCCL_IB_ADDR_FAMILY/NCCL_IB_ADDR_RANGE"
	}
	what := "a link-local GID, as NCCL does; it only reaches peers within one L2 segment"
	if g.IsZero() {
		what = "an empty GID, as NCCL does; connections through this port will fail"
	}
	return fmt.Sprintf("NET/GoIB : %s:%d has no routable %s GID%s: using GID index %d (%v), %s. Give the port's netdev an IP address, or set NCCL_IB_GID_INDEX (or %s)", dev, port, fam, where, idx, g, what, knobs)
}

// resolveGID is the GID a new connection uses. NCCL scans the whole GID
// table for every connection; a RoCE port's table is large (rxe: 1024
// entries, one ioctl each) and mostly empty, so the choice is kept and
// scanned again only when the kernel reports IBV_EVENT_GID_CHANGE on the
// port, or when the chosen entry no longer holds the same GID (one query
// per connection), which covers an address removed or replaced in place.
func (d *device) resolveGID(t *Transport) (int, verbs.GID, error) {
	if d.attr.LinkLayer != verbs.LinkEthernet {
		return d.gidIndex, d.gid, nil
	}
	d.gidMu.Lock()
	defer d.gidMu.Unlock()
	if !d.gidStale {
		if g, err := d.hca.ctx.QueryGID(d.port, d.gidIndex); err == nil && g == d.gid {
			return d.gidIndex, d.gid, nil
		}
	}
	idx, g, err := selectGID(d.hca.ctx, t.fs, d.port, d.attr, t.cfg.gid)
	if err != nil {
		return 0, verbs.GID{}, err
	}
	if idx != d.gidIndex || g != d.gid {
		t.log.Infof(nccl.SubsysNet, "NET/GoIB : %s: GID index %d (%v) now, %d (%v) before", d, idx, g, d.gidIndex, d.gid)
		if t.cfg.gid.unroutable(d.attr.LinkLayer, g) {
			t.log.Warnf("%s", t.cfg.gid.unroutableWarning(d.name, d.port, idx, g))
		}
	}
	d.gidIndex, d.gid, d.gidStale = idx, g, false
	return idx, g, nil
}

// gidChanged marks the port's GID choice stale (IBV_EVENT_GID_CHANGE).
func (d *device) gidChanged() {
	d.gidMu.Lock()
	d.gidStale = true
	d.gidMu.Unlock()
}
