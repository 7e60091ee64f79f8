package ib

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"

	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/internal/diag"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

var _ diag.Explainer = (*Transport)(nil)

// Explain implements diag.Explainer for `ncclnet-go devices`: the facts behind
// each device NCCL sees (link layer, GID, netdev), every RDMA port of the host
// with the reason it is or is not used, and the handshake interface. It reads
// what Init discovered; for the ports Init skipped it asks the same questions
// openHCA asks, in the same order, through the same helpers.
func (t *Transport) Explain(d *diag.Transport, initErr error) {
	t.mu.RLock()
	devs := append([]*device(nil), t.devs...)
	provider, feats := t.provider, t.feats
	oobName, oobAddr := t.oobName, t.oobAddr
	t.mu.RUnlock()

	for _, dev := range devs {
		if dev.index < len(d.Devices) && d.Devices[dev.index].Index == dev.index {
			x := &d.Devices[dev.index]
			x.LinkLayer, x.State, x.MTU = dev.attr.LinkLayer.String(), dev.attr.State.String(), dev.attr.ActiveMTU.Bytes()
			x.GIDIndex, x.GID, x.NetDev = intp(dev.gidIndex), dev.gid.String(), dev.netdev
			if dev.attr.LinkLayer == verbs.LinkEthernet {
				x.RoCEVersion, _ = t.fs.RoCEVersion(dev.name, dev.port, dev.gidIndex)
			}
		}
	}
	if oobName != "" {
		d.Handshake = &diag.Interface{Name: oobName, Address: oobAddr.String(), Up: true, Running: true, Matches: true, Used: initErr == nil}
		if initErr != nil {
			d.Handshake.Why = "chosen, but the transport is not usable"
		}
	} else if name, addr, err := findOOBInterface(nccl.DiscardLogger{}); err == nil {
		d.Handshake = &diag.Interface{Name: name, Address: addr.String(), Up: true, Running: true, Matches: true,
			Why: "would be used if the transport initialised"}
	} else {
		d.Handshake = &diag.Interface{Why: err.Error()}
	}
	if provider == nil {
		d.Ports = t.sysfsPorts(initErr)
		return
	}
	if !feats.DMABuf {
		d.Notes = append(d.Notes, provider.Name()+" has no ibv_reg_dmabuf_mr: no dma-buf registration")
	}
	if ok, file := t.fs.PeerMemory(); ok {
		d.Notes = append(d.Notes, "GPU peer memory available ("+file+")")
	}
	d.Ports = t.verbsPorts(provider, devs, initErr)
}

func intp(i int) *int { return &i }

// verbsPorts opens every device the provider lists and judges each port.
func (t *Transport) verbsPorts(p verbs.Provider, used []*device, initErr error) []diag.Port {
	names, err := p.Devices()
	if err != nil {
		return []diag.Port{{Why: "listing RDMA devices: " + err.Error()}}
	}
	filter, spec := readHCAFilter(nccl.DiscardLogger{})
	gcfg := readGIDConfig(nccl.DiscardLogger{})
	querySpeed := envQuerySpeed.Get(nccl.DiscardLogger{}) && p.Features().PortSpeed
	var out []diag.Port
	for _, name := range names {
		ctx, err := p.Open(name)
		if err != nil {
			out = append(out, diag.Port{Device: name, Why: "ibv_open_device: " + err.Error()})
			continue
		}
		attr, err := ctx.QueryDevice()
		if err != nil {
			out = append(out, diag.Port{Device: name, Why: "ibv_query_device: " + err.Error()})
			_ = ctx.Close()
			continue
		}
		// The device's sysfs path; a used port shows the topology key the
		// transport reports instead.
		pci, _ := t.fs.PCIPath(name)
		for port := 1; port <= attr.PhysPortCnt; port++ {
			pa, err := ctx.QueryPort(port)
			if err != nil {
				out = append(out, diag.Port{Device: name, Port: port, Why: "ibv_query_port: " + err.Error()})
				continue
			}
			pt := diag.Port{Device: name, Port: port, State: pa.State.String(), LinkLayer: pa.LinkLayer.String(),
				SpeedMbps: effectiveSpeed(nccl.DiscardLogger{}, ctx, querySpeed, name, port, pa), MTU: pa.ActiveMTU.Bytes(), PCIPath: pci}
			gidIdx, gid := -1, verbs.GID{}
			for _, u := range used {
				if u.name == name && u.port == port {
					pt.Used, pt.DeviceIndex, pt.PCIPath = true, intp(u.index), u.pciPath
					gidIdx, gid = u.gidIndex, u.gid
				}
			}
			if !pt.Used {
				switch {
				case !filter.match(name, port):
					pt.Why = "excluded by NCCL_IB_HCA=" + spec
				case pa.State != verbs.PortActive:
					pt.Why = fmt.Sprintf("port is %v, not ACTIVE", pa.State)
				case pa.LinkLayer != verbs.LinkInfiniBand && pa.LinkLayer != verbs.LinkEthernet:
					pt.Why = fmt.Sprintf("link layer %v is neither InfiniBand nor Ethernet", pa.LinkLayer)
				default:
					gidIdx, gid, err = selectGID(ctx, t.fs, port, pa, gcfg)
					if err != nil {
						pt.Why = err.Error()
						gidIdx = -1
					} else if initErr != nil {
						pt.Why = "the port qualifies, but the transport is not usable: " + initErr.Error()
					} else {
						pt.Why = "the port qualifies but the transport did not take it"
					}
				}
			}
			if gidIdx >= 0 {
				pt.GIDIndex, pt.GID = intp(gidIdx), gid.String()
				if pa.LinkLayer == verbs.LinkEthernet {
					pt.NetDev, _ = t.fs.NetDev(name, port, gidIdx)
					pt.RoCEVersion, _ = t.fs.RoCEVersion(name, port, gidIdx)
				}
			}
			out = append(out, pt)
		}
		_ = ctx.Close()
	}
	return out
}

// sysfsPorts lists the RDMA ports sysfs knows when libibverbs was not used
// (NCCL_IB_DISABLE, or it failed to load): they exist, and initErr is why
// none is used.
func (t *Transport) sysfsPorts(initErr error) []diag.Port {
	why := "libibverbs not loaded"
	if initErr != nil {
		why = initErr.Error()
	}
	devs, _ := os.ReadDir(filepath.Join(t.fs.Root, "class", "infiniband"))
	var out []diag.Port
	for _, e := range devs {
		ports, _ := os.ReadDir(filepath.Join(t.fs.Root, "class", "infiniband", e.Name(), "ports"))
		var nums []int
		for _, p := range ports {
			if n, err := strconv.Atoi(p.Name()); err == nil {
				nums = append(nums, n)
			}
		}
		sort.Ints(nums)
		for _, n := range nums {
			pt := diag.Port{Device: e.Name(), Port: n, Why: why + " (port seen in sysfs only)"}
			if _, state, err := t.fs.PortState(e.Name(), n); err == nil {
				pt.State = state
			}
			switch ll, _ := t.fs.LinkLayer(e.Name(), n); ll {
			case "InfiniBand":
				pt.LinkLayer = verbs.LinkInfiniBand.String()
			case "Ethernet":
				pt.LinkLayer = verbs.LinkEthernet.String()
			default:
				pt.LinkLayer = ll
			}
			if p, err := t.fs.PCIPath(e.Name()); err == nil {
				pt.PCIPath = p
			}
			out = append(out, pt)
		}
	}
	return out
}
