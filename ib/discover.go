package ib

import (
	"errors"
	"fmt"
	"math"
	"sort"

	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/metrics"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Device discovery: which ports are usable and what NCCL is told about
// them (docs/ib.md, "Devices and properties").

func (t *Transport) discoverLocked() error {
	filter, filterSpec := t.cfg.hca, t.cfg.hcaSpec
	gcfg := t.cfg.gid
	names, err := t.provider.Devices()
	if err != nil {
		return fmt.Errorf("%w: listing RDMA devices: %v", nccl.ErrNoDevice, err)
	}
	if len(names) == 0 {
		return fmt.Errorf("%w: %s reports no RDMA devices", nccl.ErrNoDevice, t.provider.Name())
	}
	peerMem, peerFile := t.fs.PeerMemory()
	if peerMem {
		t.log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/GoIB : GPU peer memory available (%s): NCCL_PTR_CUDA supported", peerFile)
	}
	var seen hcaSeen
	for _, name := range names {
		h, err := t.openHCA(name, filter, gcfg, &seen)
		if err != nil {
			t.log.Warnf("NET/GoIB : skipping %s: %v", name, err)
			continue
		}
		if h != nil {
			t.hcas = append(t.hcas, h)
		}
	}
	for _, h := range t.hcas {
		t.devs = append(t.devs, h.ports...)
	}
	if filterSpec != "" {
		for _, w := range seen.filterWarnings(filter, filterSpec, len(t.devs)) {
			t.log.Warnf("NET/GoIB : %s", w)
		}
	}
	if len(t.devs) == 0 {
		why := "no ACTIVE IB or RoCE port"
		if filterSpec != "" {
			why += " matches NCCL_IB_HCA=" + filterSpec
		}
		return fmt.Errorf("%w: %s", nccl.ErrNoDevice, why)
	}
	// In discovery order, as NCCL's ncclIbGetPciPath counts, before any sort.
	for i, d := range t.devs {
		d.realPort = 0
		for _, e := range t.devs[:i] {
			if d.pciPath != "" && e.pciPath == d.pciPath {
				d.realPort++
			}
		}
		// The registration series carry the port NCCL shows, as the glue's
		// traffic series of the same device do (docs/metrics.md).
		d.stats.met = metrics.ForDevice(t.Name(), d.name, d.port+d.realPort)
	}
	if t.cfg.pciOrder {
		// NCCL orders by the full path, so the ports and VFs that merge into
		// one topology node keep a stable order among themselves; a device
		// without one (a virtual NIC) goes to the back, as in NCCL's
		// ncclIbCompareDevs.
		sort.SliceStable(t.devs, func(i, j int) bool {
			a, b := t.devs[i].fullPCIPath, t.devs[j].fullPCIPath
			if a == "" || b == "" {
				return a != "" && b == ""
			}
			return a < b
		})
	}
	t.vdevs = t.vdevs[:0]
	for i, d := range t.devs {
		d.index = i
		t.vdevs = append(t.vdevs, []int{i})
	}
	for _, h := range t.hcas {
		h.stop, h.stopped = make(chan struct{}), make(chan struct{})
		go t.watchAsync(h)
	}
	return nil
}

// openHCA opens one device and returns it with its usable ports, or nil
// when none qualifies.
func (t *Transport) openHCA(name string, filter hcaFilter, gcfg gidConfig, seen *hcaSeen) (*hca, error) {
	ctx, err := t.provider.Open(name)
	if err != nil {
		return nil, fmt.Errorf("ibv_open_device: %v", err)
	}
	h := &hca{name: name, ctx: ctx}
	ok := false
	defer func() {
		if !ok {
			if h.pd != nil {
				_ = h.pd.Dealloc()
			}
			_ = ctx.Close()
		}
	}()
	h.attr, err = ctx.QueryDevice()
	if err != nil {
		return nil, fmt.Errorf("ibv_query_device: %v", err)
	}
	seen.ports = append(seen.ports, hcaPorts{name: name, count: h.attr.PhysPortCnt})
	for port := 1; port <= h.attr.PhysPortCnt; port++ {
		pa, err := ctx.QueryPort(port)
		if err != nil {
			t.log.Warnf("NET/GoIB : %s port %d: ibv_query_port: %v", name, port, err)
			continue
		}
		if !filter.match(name, port) {
			t.log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/GoIB : %s:%d excluded by NCCL_IB_HCA", name, port)
			if pa.State == verbs.PortActive && (pa.LinkLayer == verbs.LinkInfiniBand || pa.LinkLayer == verbs.LinkEthernet) {
				seen.excluded = append(seen.excluded, fmt.Sprintf("%s:%d", name, port))
			}
			continue
		}
		if pa.State != verbs.PortActive {
			t.log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/GoIB : %s:%d is %v, not ACTIVE; skipped", name, port, pa.State)
			continue
		}
		if pa.LinkLayer != verbs.LinkInfiniBand && pa.LinkLayer != verbs.LinkEthernet {
			t.log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/GoIB : %s:%d has link layer %v; skipped", name, port, pa.LinkLayer)
			continue
		}
		d := &device{hca: h, name: name, port: port, attr: pa, speed: effectiveSpeed(t.log, ctx, t.cfg.querySpeed && t.feats.PortSpeed, name, port, pa), ar: pa.LinkLayer == verbs.LinkInfiniBand}
		if t.cfg.adaptive != arAuto {
			d.ar = t.cfg.adaptive == 1
		}
		d.gidIndex, d.gid, err = selectGID(ctx, t.fs, port, pa, gcfg)
		if err != nil {
			t.log.Warnf("NET/GoIB : %s:%d skipped: %v", name, port, err)
			continue
		}
		if gcfg.unroutable(pa.LinkLayer, d.gid) {
			if d.gid.IsZero() {
				// NCCL would use it and every connection would fail; a
				// port skipped leaves the other ports, or the socket
				// fallback, to the job.
				t.log.Warnf("NET/GoIB : %s:%d skipped: its GID table has no entry to use (index %d is empty); give the port's netdev an IP address, or set NCCL_IB_GID_INDEX", name, port, d.gidIndex)
				continue
			}
			t.log.Warnf("%s", gcfg.unroutableWarning(name, port, d.gidIndex, d.gid))
		}
		if p, err := t.fs.PCIPath(name); err == nil {
			d.fullPCIPath, d.pciPath = p, mergePCIPath(p, t.cfg.mergeVFs)
		} else {
			t.log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/GoIB : %s: no PCI path in sysfs (%v); NCCL treats it as a virtual NIC", name, err)
		}
		if pa.LinkLayer == verbs.LinkEthernet {
			d.netdev, _ = t.fs.NetDev(name, port, d.gidIndex)
		}
		t.log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/GoIB : %s:%d %v speed %d Mbps, MTU %d, GID index %d (%v)%s", name, port, pa.LinkLayer, d.speed, pa.ActiveMTU.Bytes(), d.gidIndex, d.gid, ifNonEmpty(" netdev ", d.netdev))
		h.ports = append(h.ports, d)
	}
	if len(h.ports) == 0 {
		return nil, nil
	}
	h.pd, err = ctx.AllocPD()
	if err != nil {
		return nil, fmt.Errorf("ibv_alloc_pd: %v", err)
	}
	h.dmabuf = t.probeDMABuf(h)
	ok = true
	return h, nil
}

func ifNonEmpty(prefix, s string) string {
	if s == "" {
		return ""
	}
	return prefix + s
}

// mergePCIPath is NCCL's topology key for a port: the PCI function digit
// zeroed so the ports of one dual-port NIC share a node, and with
// NCCL_IB_MERGE_VFS (default on) the two device digits before it as well,
// so the virtual functions of one physical NIC merge too
// ("0000:17:02.3" -> "0000:17:00.0").
func mergePCIPath(p string, mergeVFs bool) string {
	b := []byte(p)
	n := len(b)
	if n == 0 {
		return p
	}
	b[n-1] = '0'
	if mergeVFs && n >= 4 {
		b[n-3], b[n-4] = '0', '0'
	}
	return string(b)
}

// probeDMABuf is NCCL's check: a 0-byte registration of fd -1 fails with
// EOPNOTSUPP/EPROTONOSUPPORT when the provider or kernel lacks dma-buf, and
// with anything else when it has it (the kernel answers EINVAL for the empty
// range before it looks at the fd, so EBADF alone would miss real devices).
func (t *Transport) probeDMABuf(h *hca) bool {
	if !t.feats.DMABuf || !t.cfg.dmabuf {
		return false
	}
	mr, err := h.pd.RegDMABufMR(0, 0, 0, -1, 0)
	if err == nil {
		_ = mr.Dereg()
		return false
	}
	var en verbs.Errno
	ok := errors.As(err, &en) && en != verbs.EOPNOTSUPP && en != verbs.EPROTONOSUPPORT
	if !ok {
		t.log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/GoIB : %s: dma-buf registration unsupported (%v)", h.name, err)
	}
	return ok
}

// IB rate per lane in Mbps by the bit position of ibv_port_attr.active_speed,
// and lanes by the bit position of active_width (NCCL's tables).
var (
	ibvSpeeds = [...]int{2500, 5000, 10000, 10000, 14000, 25000, 50000, 100000, 200000}
	ibvWidths = [...]int{1, 4, 8, 12, 2}
)

func firstBit(v uint32, n int) int {
	for i := 0; i < n; i++ {
		if v&(1<<i) != 0 {
			return i
		}
	}
	return n - 1
}

// effectiveSpeed is the speed, in Mbps, that a port reports to NCCL. With
// query (NCCL_IB_QUERY_PORT_SPEED, on by default, and a libibverbs that has
// ibv_query_port_speed), it is what the provider answers, as in NCCL 2.30: on
// a LAG or multi-port e-switch function, the sum of the member links, which
// lane rate × width cannot express and NCCL's topology search would
// otherwise undercount. Otherwise, and when the call fails or answers 0, it
// is lane rate × width. A kernel without the verb fails it on every port
// (EOPNOTSUPP, or EPROTONOSUPPORT from the ioctl); NCCL WARNs each time,
// which users learned to ignore, so here that is an INFO.
func effectiveSpeed(log nccl.Logger, ctx verbs.Context, query bool, name string, port int, pa verbs.PortAttr) int {
	lanes := portSpeed(pa)
	if !query {
		return lanes
	}
	mbps, err := ctx.QueryPortSpeed(port)
	switch {
	case err != nil:
		log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/GoIB : %s:%d: %v; reporting lane rate × width (%d Mbps)", name, port, err, lanes)
		return lanes
	case mbps <= 0 || mbps > math.MaxInt32:
		log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/GoIB : %s:%d: ibv_query_port_speed answered %d Mbps; reporting lane rate × width (%d Mbps)", name, port, mbps, lanes)
		return lanes
	case int(mbps) != lanes:
		log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/GoIB : %s:%d: effective speed %d Mbps (ibv_query_port_speed), lane rate × width %d Mbps", name, port, mbps, lanes)
	}
	return int(mbps)
}

// portSpeed is lane rate × width. As NCCL's ncclIbInitDevices, a non-zero
// active_speed_ex wins over active_speed: an XDR port (256) does not fit in
// the 8-bit field, which the kernel caps at NDR, so reading it alone would
// report half of a 4x XDR port's 800 Gb/s.
func portSpeed(pa verbs.PortAttr) int {
	speed := uint32(pa.ActiveSpeed)
	if pa.ActiveSpeedEx != 0 {
		speed = pa.ActiveSpeedEx
	}
	return ibvSpeeds[firstBit(speed, len(ibvSpeeds))] * ibvWidths[firstBit(uint32(pa.ActiveWidth), len(ibvWidths))]
}
