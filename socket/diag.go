package socket

import (
	"fmt"

	"github.com/libnccl-net-go/libnccl-net-go/internal/diag"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

var _ diag.Explainer = (*Transport)(nil)

// defaultSearch is NCCL's interface search when NCCL_SOCKET_IFNAME is unset:
// the first list that finds anything wins (findDevices).
var defaultSearch = []string{"ib", "^docker,lo,virbr", "docker", "lo", "virbr"}

// Explain implements diag.Explainer for `ncclnet-go devices`: each device's
// address, and every interface of the host with whether NCCL_SOCKET_IFNAME
// (or NCCL's default search) selects it and why it is or is not used.
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
	fam := family(nccl.DiscardLogger{})
	list, rule := "", ""
	if v, ok := nccl.LookupEnv(envIfname); ok && len(v) > 1 {
		list, rule = v, envIfname+"="+v
	} else {
		for _, l := range defaultSearch {
			if len(findIfaces(ifs, l, fam, maxIfs)) > 0 {
				list, rule = l, "NCCL's default search step "+l
				break
			}
		}
		d.Notes = append(d.Notes, "NCCL_SOCKET_IFNAME is unset: NCCL's default search takes ib*, else any interface but docker*/lo/virbr*, else docker*, else lo, else virbr*")
	}
	matched := findIfaces(ifs, list, fam, maxIfs)
	for _, it := range ifs {
		x := diag.Interface{Name: it.Name, Up: it.Up, Running: it.Running}
		for _, a := range it.Addrs {
			x.Addrs = append(x.Addrs, a.String())
		}
		x.Matches = list != "" && parseIfList(list).match(it.Name)
		for i, dev := range devs {
			if dev.name == it.Name {
				x.Used, x.Address, x.DeviceIndex = true, dev.addr.String(), &i
			}
		}
		if !x.Used {
			x.Why = whyNotUsed(it, x.Matches, rule, matched, fam, initErr)
		}
		d.Interfaces = append(d.Interfaces, x)
	}
}

func whyNotUsed(it Iface, matches bool, rule string, matched []device, fam int, initErr error) string {
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
		if m.name == it.Name {
			if initErr != nil {
				return "selected, but the transport is not usable: " + initErr.Error()
			}
			return "selected, but the transport did not take it"
		}
	}
	if len(matched) == maxIfs {
		return fmt.Sprintf("selected, but NCCL uses at most %d interfaces", maxIfs)
	}
	switch fam {
	case 4:
		return "no IPv4 address (NCCL_SOCKET_FAMILY=AF_INET)"
	case 6:
		return "no usable IPv6 address (NCCL_SOCKET_FAMILY=AF_INET6)"
	}
	return "no usable address (IPv6 loopback is skipped)"
}
