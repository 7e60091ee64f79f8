package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/libnccl-net-go/libnccl-net-go/internal/diag"
	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// sysfsRoot is where device facts are read (tests point it at fixtures).
var sysfsRoot = "/sys"

func runDevices(c *cli, args []string) error {
	fs := newFlags(c, "devices", "[--json] [-v]", `
Shows what libnccl-net-go would expose to NCCL on this host and why: the
transport it picks (NCCL_GO_TRANSPORT, else ib when an RDMA port is usable,
else socket) and why each transport is or is not usable; every RDMA port with
its link layer, state, speed, the GID index chosen and its address, the PCI
path; the virtual NICs NCCL's fusion would make (NCCL_NET_MERGE_LEVEL,
NCCL_NET_FORCE_MERGE); every network interface and whether
NCCL_SOCKET_IFNAME (or NCCL's default search) selects it.

It runs the plugin's own discovery code with the settings the plugin would
see inside NCCL: the environment, then NCCL_CONF_FILE or ~/.nccl.conf, then
/etc/nccl.conf. Exit status 1 when the plugin's init would fail.`)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	verbose := fs.Bool("v", false, "also print what each transport logged during discovery")
	if err := fs.parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	conf := loadConf()
	conf.install()
	defer ncclenv.SetLookup(nil)
	r := diag.Diagnose(nccl.Transports(), diag.Options{SysfsRoot: sysfsRoot})
	conf.warnProblems(c, "devices")
	if *asJSON {
		if err := printJSON(c.stdout, r); err != nil {
			return err
		}
	} else {
		printReport(c.stdout, r, *verbose)
	}
	if r.Transport == "" {
		return failure{}
	}
	return nil
}

func printReport(w io.Writer, r diag.Report, verbose bool) {
	if r.Transport != "" {
		fmt.Fprintf(w, "transport: %s\n", r.Transport)
	} else {
		fmt.Fprintf(w, "transport: none: the plugin's init would fail: %s\n", r.InitError)
	}
	fmt.Fprintf(w, "why: %s\n", r.Why)
	for _, t := range r.Transports {
		fmt.Fprintln(w)
		status := "used"
		switch {
		case t.Selected:
		case !t.Usable && t.Tried:
			status = "not usable: " + t.Reason
		case !t.Usable:
			status = "not usable: " + t.Reason
		default:
			status = "usable, " + t.Reason
		}
		if t.ConfigError {
			status += " (a configuration error: the plugin WARNs)"
		}
		fmt.Fprintf(w, "%s (priority %d): %s\n", t.Name, t.Priority, status)
		if len(t.Devices) > 0 {
			fmt.Fprintf(w, "  devices (as NCCL sees them):\n")
			for _, d := range t.Devices {
				fmt.Fprintf(w, "    %s\n", deviceLine(d))
			}
		}
		if t.Ports != nil {
			fmt.Fprintf(w, "  RDMA ports:\n")
			for _, p := range t.Ports {
				fmt.Fprintf(w, "    %s\n", portLine(p))
			}
		} else if t.Name == "ib" {
			fmt.Fprintf(w, "  RDMA ports: none found\n")
		}
		if h := t.Handshake; h != nil {
			if h.Name != "" {
				fmt.Fprintf(w, "  handshake interface: %s %s%s\n", h.Name, h.Address, paren(h.Why))
			} else {
				fmt.Fprintf(w, "  handshake interface: none: %s\n", h.Why)
			}
		}
		if len(t.Interfaces) > 0 {
			fmt.Fprintf(w, "  interfaces:\n")
			width := 0
			for _, i := range t.Interfaces {
				width = max(width, len(i.Name))
			}
			for _, i := range t.Interfaces {
				fmt.Fprintf(w, "    %s\n", ifaceLine(i, width))
			}
		}
		if f := t.Fusion; f != nil {
			fmt.Fprintf(w, "  %s\n", fusionLine(f))
			for _, n := range f.Notes {
				fmt.Fprintf(w, "    note: %s\n", n)
			}
		}
		for _, n := range t.Notes {
			fmt.Fprintf(w, "  note: %s\n", n)
		}
		if verbose && len(t.Log) > 0 {
			fmt.Fprintf(w, "  log:\n")
			for _, l := range t.Log {
				fmt.Fprintf(w, "    %s\n", l)
			}
		}
	}
}

func paren(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

func devName(name string, port int) string {
	if port != 0 {
		return fmt.Sprintf("%s:%d", name, port)
	}
	return name
}

// linkFacts formats what a device and a port have in common.
func linkFacts(ll, state string, mtu, mbps int, gidIdx *int, gid string, roce int, netdev string) []string {
	var f []string
	for _, s := range []string{ll, state} {
		if s != "" {
			f = append(f, s)
		}
	}
	if mtu > 0 {
		f = append(f, fmt.Sprintf("MTU %d", mtu))
	}
	if mbps > 0 {
		f = append(f, fmt.Sprintf("%d Mbps", mbps))
	}
	if gidIdx != nil {
		g := fmt.Sprintf("GID index %d %s", *gidIdx, gid)
		if roce > 0 {
			g += fmt.Sprintf(" (RoCE v%d)", roce)
		}
		f = append(f, g)
	}
	if netdev != "" {
		f = append(f, "netdev "+netdev)
	}
	return f
}

func deviceLine(d diag.Device) string {
	f := []string{fmt.Sprintf("[%d] %s", d.Index, devName(d.Name, d.Port))}
	if d.Virtual {
		f = append(f, fmt.Sprintf("virtual NIC of devices %v", d.Members))
	}
	f = append(f, linkFacts(d.LinkLayer, d.State, d.MTU, d.SpeedMbps, d.GIDIndex, d.GID, d.RoCEVersion, d.NetDev)...)
	if d.Address != "" {
		f = append(f, "address "+d.Address)
	}
	if d.PCIPath != "" {
		f = append(f, "pci "+d.PCIPath)
	} else if !d.Virtual {
		f = append(f, "no PCI path (virtual)")
	}
	f = append(f, "memory "+strings.Join(d.Memory, ","))
	return strings.Join(f, "  ")
}

func portLine(p diag.Port) string {
	if p.Port == 0 && p.State == "" {
		return devName(p.Device, p.Port) + ": " + p.Why
	}
	f := append([]string{devName(p.Device, p.Port)},
		linkFacts(p.LinkLayer, p.State, p.MTU, p.SpeedMbps, p.GIDIndex, p.GID, p.RoCEVersion, p.NetDev)...)
	if p.PCIPath != "" {
		f = append(f, "pci "+p.PCIPath)
	}
	if p.Used && p.DeviceIndex != nil {
		f = append(f, fmt.Sprintf("-> device %d", *p.DeviceIndex))
	} else {
		f = append(f, "-> not used: "+p.Why)
	}
	return strings.Join(f, "  ")
}

func ifaceLine(i diag.Interface, width int) string {
	state := "down"
	if i.Up && i.Running {
		state = "up"
	} else if i.Up {
		state = "no-carrier"
	}
	addrs := strings.Join(i.Addrs, " ")
	if addrs == "" {
		addrs = "no address"
	}
	verdict := "-> not used: " + i.Why
	if i.Used && i.DeviceIndex != nil {
		verdict = fmt.Sprintf("-> device %d (listens on %s)", *i.DeviceIndex, i.Address)
	}
	return fmt.Sprintf("%-*s  %-10s  %s  %s", width, i.Name, state, addrs, verdict)
}

func fusionLine(f *diag.Fusion) string {
	if !f.Supported {
		return "virtual NICs: none (this transport cannot fuse devices: the plugin gives NCCL no makeVDevice)"
	}
	head := fmt.Sprintf("virtual NICs (NCCL_NET_MERGE_LEVEL %s", f.Level)
	if f.Force != "" {
		head += ", NCCL_NET_FORCE_MERGE " + f.Force
	}
	if f.Policy != "ALL" {
		head += ", policy " + f.Policy
	}
	head += "): "
	if f.Error != "" {
		return head + "NCCL's init would fail: " + f.Error
	}
	if len(f.VNICs) == 0 {
		return head + "none"
	}
	var parts []string
	for _, v := range f.VNICs {
		s := fmt.Sprintf("device %d = %s (members %v, %s apart", v.Index, strings.Join(v.Names, "+"), v.Members, v.Path)
		if v.Forced {
			s += ", forced"
		}
		parts = append(parts, s+")")
	}
	return head + strings.Join(parts, "; ")
}
