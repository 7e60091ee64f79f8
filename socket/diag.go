package socket

import (
	"fmt"
	"strings"

	"github.com/libnccl-net-go/libnccl-net-go/internal/diag"
	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclsock"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

var _ diag.Explainer = (*Transport)(nil)

// Explain implements diag.Explainer for `ncclnet-go devices`: each device's
// address, and every interface of the host with whether NCCL_SOCKET_IFNAME
// (or the step of NCCL's default search that chose) selects it and why it is
// or is not used.
func (t *Transport) Explain(d *diag.Transport, initErr error) {
	t.mu.Lock()
	devs := append([]device(nil), t.devs...)
	src := t.ifaces
	t.mu.Unlock()
	for i, dev := range devs {
		if i < len(d.Devices) && d.Devices[i].Name == dev.name {
			d.Devices[i].Address = dev.addr.String()
		}
	}
	if src == nil {
		return
	}
	ifs, err := src.Interfaces()
	if err != nil {
		d.Notes = append(d.Notes, "listing network interfaces: "+err.Error())
		return
	}
	// The same selection Init made, to learn which rule chose and what it
	// matched.
	found, how := ncclsock.Find(ifs, ncclsock.Options{Max: ncclenv.MaxIfs, Log: nccl.DiscardLogger{}, Prefix: logPrefix})
	rule, selects := ruleOf(how, found)
	if !strings.HasPrefix(how, ncclsock.IfName.Name()) {
		const search = "NCCL's default search takes ib*, else the interface in NCCL_COMM_ID's subnet, else any interface but docker*/lo*/virbr*, else docker*, else lo*, else virbr*"
		if v, ok := ncclenv.Value(ncclsock.IfName.Name()); ok {
			// Find ignored a set value: NCCL ignores one of a single character.
			d.Notes = append(d.Notes, fmt.Sprintf("NCCL_SOCKET_IFNAME=%s is ignored (NCCL ignores a value of one character), so %s", v, search))
		} else {
			d.Notes = append(d.Notes, "NCCL_SOCKET_IFNAME is unset: "+search)
		}
	}
	fam := family(nccl.DiscardLogger{})
	for _, it := range ifs {
		x := diag.Interface{Name: it.Name, Up: it.Up, Running: it.Running, Matches: selects(it.Name)}
		for _, a := range it.Addrs {
			x.Addrs = append(x.Addrs, a.Addr().String())
		}
		for i, dev := range devs {
			if dev.name == it.Name {
				x.Used, x.Address, x.DeviceIndex = true, dev.addr.String(), &i
			}
		}
		if !x.Used {
			x.Why = whyNotUsed(it, x.Matches, rule, found, fam, initErr)
		}
		d.Interfaces = append(d.Interfaces, x)
	}
}

// ruleOf turns ncclsock.Find's "how" into the rule's name and a predicate
// for the interfaces it selects.
func ruleOf(how string, found []ncclsock.Device) (string, func(string) bool) {
	inFound := func(name string) bool {
		for _, f := range found {
			if f.Name == name {
				return true
			}
		}
		return false
	}
	if v, ok := strings.CutPrefix(how, ncclsock.IfName.Name()+"="); ok {
		l, _ := ncclenv.ParseList(v, ncclenv.MaxIfs)
		return how, func(name string) bool { return l.Match(name, -1) }
	}
	if inner, ok := strings.CutPrefix(how, "default search ("); ok && !strings.HasPrefix(inner, "subnet") {
		l, _ := ncclenv.ParseList(strings.TrimSuffix(inner, ")"), ncclenv.MaxIfs)
		return "NCCL's " + how, func(name string) bool { return l.Match(name, -1) }
	}
	if len(found) == 0 {
		return "", func(string) bool { return false }
	}
	return "NCCL's " + how, inFound
}

func whyNotUsed(it Iface, matches bool, rule string, matched []ncclsock.Device, fam int, initErr error) string {
	switch {
	case !it.Up:
		return "down"
	case !it.Running:
		return "up but not RUNNING (no carrier)"
	case rule == "":
		return "no interface is up and running with a usable address"
	case !matches:
		return "not selected by " + rule
	}
	for _, m := range matched {
		if m.Name == it.Name {
			if initErr != nil {
				return "selected, but the transport is not usable: " + initErr.Error()
			}
			return "selected, but the transport did not take it"
		}
	}
	if len(matched) == ncclenv.MaxIfs {
		return fmt.Sprintf("selected, but NCCL uses at most %d interfaces", ncclenv.MaxIfs)
	}
	switch ncclenv.Family(fam) {
	case ncclenv.IPv4:
		return "no IPv4 address (NCCL_SOCKET_FAMILY=AF_INET)"
	case ncclenv.IPv6:
		return "no usable IPv6 address (NCCL_SOCKET_FAMILY=AF_INET6)"
	}
	return "no usable address (IPv6 loopback is skipped)"
}
