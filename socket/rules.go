package socket

import (
	"encoding/binary"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/internal/testhook"
)

// sourceRules lists the source prefixes of the host's policy-routing rules
// (`ip rule add from <prefix> table <n>`), IPv4 and IPv6: a host whose NICs
// share a subnet and routes each NIC's address out of that NIC has one per
// address. Read once per init, for the WARN about shared subnets; tests
// replace it.
var sourceRules = testhook.New(func() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		b, err := syscall.NetlinkRIB(unix.RTM_GETRULE, fam)
		if err != nil {
			return nil, err
		}
		msgs, err := syscall.ParseNetlinkMessage(b)
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if m.Header.Type == unix.RTM_NEWRULE {
				if p, ok := ruleSource(m.Data); ok {
					out = append(out, p)
				}
			}
		}
	}
	return out, nil
})

// ruleSource reads a rule message (struct fib_rule_hdr, then attributes) and
// returns its source prefix, if it has one and sends matching traffic to a
// table (FR_ACT_TO_TBL).
func ruleSource(d []byte) (netip.Prefix, bool) {
	const hdrLen = 12 // family, dst_len, src_len, tos, table, res1, res2, action, flags (u32)
	if len(d) < hdrLen || d[2] == 0 || d[7] != unix.FR_ACT_TO_TBL {
		return netip.Prefix{}, false
	}
	srcLen := int(d[2])
	for a := d[hdrLen:]; len(a) >= 4; {
		n := int(binary.NativeEndian.Uint16(a[0:2]))
		typ := binary.NativeEndian.Uint16(a[2:4])
		if n < 4 || n > len(a) {
			break
		}
		if typ == unix.FRA_SRC {
			if addr, ok := netip.AddrFromSlice(a[4:n]); ok {
				if p, err := addr.Prefix(srcLen); err == nil {
					return p, true
				}
			}
		}
		a = a[min((n+3)&^3, len(a)):]
	}
	return netip.Prefix{}, false
}

// sourceRouted reports whether a rule routes traffic from addr by its source.
func sourceRouted(rules []netip.Prefix, addr netip.Addr) bool {
	addr = addr.Unmap().WithZone("")
	for _, p := range rules {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}
