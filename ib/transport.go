package ib

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/ibv"
	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/sysfs"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Options configure a transport; the zero value is the production setup.
type Options struct {
	// Provider replaces libibverbs (tests pass a softnic provider).
	Provider verbs.Provider
	// SysfsRoot replaces /sys for device facts.
	SysfsRoot string
}

// Transport is the IB verbs transport. It implements nccl.Transport,
// nccl.VDeviceMaker and MRStatsProvider.
type Transport struct {
	opts     Options
	fs       sysfs.FS
	log      nccl.Logger
	provider verbs.Provider
	feats    verbs.Features

	mu      sync.RWMutex
	hcas    []*hca
	devs    []*device // usable ports, in NCCL device order
	vdevs   [][]int   // NCCL device -> member ports (indices into devs)
	oobName string
	oobAddr netip.Addr
	ready   bool

	pendMu  sync.Mutex
	pending map[uint64]*connector
}

var (
	_ nccl.Transport    = (*Transport)(nil)
	_ nccl.VDeviceMaker = (*Transport)(nil)
	_ MRStatsProvider   = (*Transport)(nil)
)

// New returns the transport on the real libibverbs; register it with
// nccl.Register("ib", 10, ib.New).
func New() nccl.Transport { return NewWithOptions(Options{}) }

// NewWithOptions returns a transport with the given options.
func NewWithOptions(o Options) *Transport {
	return &Transport{opts: o, fs: sysfs.New(o.SysfsRoot), pending: map[uint64]*connector{}}
}

func (t *Transport) Name() string { return "ib" }

// hca is one opened RDMA device: its context and protection domain, shared
// by all its usable ports and all comms on them.
type hca struct {
	name    string
	ctx     verbs.Context
	pd      verbs.PD
	attr    verbs.DeviceAttr
	ports   []*device
	stop    chan struct{}
	stopped chan struct{}
	owners  sync.Map // QP number (uint32) or CQ id (uint64) -> *commCore
	dmabuf  bool
}

// device is one usable port: what NCCL sees as a physical device.
type device struct {
	index    int
	hca      *hca
	name     string
	port     int
	attr     verbs.PortAttr
	gidIndex int
	gid      verbs.GID
	pciPath  string
	netdev   string
	speed    int
	fatal    atomic.Uint64 // fatal device/port events seen
	fatalWhy atomic.Pointer[string]
	mrCache  mrCache
	stats    mrCounters
}

func (d *device) String() string { return fmt.Sprintf("%s:%d", d.name, d.port) }

// Init discovers usable ports. It returns an error wrapping nccl.ErrNoDevice
// when IB is disabled, libibverbs is missing or no port qualifies, so the
// glue falls back to the socket transport.
func (t *Transport) Init(ic nccl.InitContext) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.log = ic.Log
	if t.log == nil {
		t.log = nccl.DiscardLogger{}
	}
	if t.ready {
		return nil
	}
	if nccl.EnvBool(t.log, "NCCL_IB_DISABLE", false) {
		return fmt.Errorf("%w: NCCL_IB_DISABLE=1", nccl.ErrNoDevice)
	}
	p := t.opts.Provider
	if p == nil {
		lib := nccl.EnvString("NCCL_IBVERBS_LIB", ibv.DefaultLibrary)
		lp, err := ibv.Load(lib)
		if err != nil {
			return fmt.Errorf("%w: %v (install rdma-core's libibverbs1 or point NCCL_IBVERBS_LIB at libibverbs.so.1)", nccl.ErrNoDevice, err)
		}
		p = lp
	}
	t.provider = p
	t.feats = p.Features()
	if !t.feats.DMABuf {
		t.log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/GoIB : %s has no ibv_reg_dmabuf_mr (IBVERBS_1.12): dma-buf registration (NCCL_PTR_DMABUF) disabled", p.Name())
	}
	if !t.feats.RegIova2 {
		t.log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/GoIB : %s has no ibv_reg_mr_iova2 (IBVERBS_1.8): PCI relaxed ordering disabled", p.Name())
	}
	if !t.feats.ECE {
		t.log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/GoIB : %s has no ibv_query_ece/ibv_set_ece (IBVERBS_1.10): ECE negotiation disabled", p.Name())
	}
	name, addr, err := findOOBInterface(t.log)
	if err != nil {
		return fmt.Errorf("%w: no interface for the IB out-of-band handshake: %v", nccl.ErrNoDevice, err)
	}
	t.oobName, t.oobAddr = name, addr
	if err := t.discoverLocked(); err != nil {
		t.closeHCAsLocked()
		return err
	}
	t.ready = true
	var names []string
	for _, d := range t.devs {
		names = append(names, fmt.Sprintf("[%d]%s:%d/%s", d.index, d.name, d.port, d.attr.LinkLayer))
	}
	t.log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/GoIB : using %s ; OOB %s:%v (verbs provider %s)", strings.Join(names, " "), name, addr, p.Name())
	return nil
}

func (t *Transport) discoverLocked() error {
	filterSpec := nccl.EnvString("NCCL_IB_HCA", "")
	filter, err := parseHCAFilter(filterSpec)
	if err != nil {
		return nccl.Errorf(nccl.InvalidArgument, "NCCL_IB_HCA=%s: %v; expected e.g. mlx5_0:1,mlx5_1 or ^mlx5_2", filterSpec, err)
	}
	gcfg, err := readGIDConfig(t.log)
	if err != nil {
		return err
	}
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
	for _, name := range names {
		h, err := t.openHCA(name, filter, gcfg)
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
	if len(t.devs) == 0 {
		why := "no ACTIVE IB or RoCE port"
		if filterSpec != "" {
			why += " matches NCCL_IB_HCA=" + filterSpec
		}
		return fmt.Errorf("%w: %s", nccl.ErrNoDevice, why)
	}
	if nccl.EnvBool(t.log, "NCCL_IB_DEVICE_PCI_ORDER", true) {
		sort.SliceStable(t.devs, func(i, j int) bool { return t.devs[i].pciPath < t.devs[j].pciPath })
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
func (t *Transport) openHCA(name string, filter hcaFilter, gcfg gidConfig) (*hca, error) {
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
	for port := 1; port <= h.attr.PhysPortCnt; port++ {
		pa, err := ctx.QueryPort(port)
		if err != nil {
			t.log.Warnf("NET/GoIB : %s port %d: ibv_query_port: %v", name, port, err)
			continue
		}
		if !filter.match(name, port) {
			t.log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/GoIB : %s:%d excluded by NCCL_IB_HCA", name, port)
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
		d := &device{hca: h, name: name, port: port, attr: pa, speed: portSpeed(pa)}
		d.gidIndex, d.gid, err = selectGID(ctx, t.fs, port, pa, gcfg)
		if err != nil {
			t.log.Warnf("NET/GoIB : %s:%d skipped: %v", name, port, err)
			continue
		}
		if p, err := t.fs.PCIPath(name); err == nil {
			d.pciPath = mergePortPath(p)
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

// mergePortPath zeroes the PCI function digit so the ports of one dual-port
// NIC share a topology node, as NCCL does.
func mergePortPath(p string) string {
	if n := len(p); n > 0 && p[n-1] >= '0' && p[n-1] <= '9' {
		return p[:n-1] + "0"
	}
	return p
}

// probeDMABuf is NCCL's check: registering fd -1 fails with EBADF when the
// kernel and provider support dma-buf, with EOPNOTSUPP/EPROTONOSUPPORT when not.
func (t *Transport) probeDMABuf(h *hca) bool {
	if !t.feats.DMABuf || !nccl.EnvBool(t.log, "NCCL_DMABUF_ENABLE", true) {
		return false
	}
	mr, err := h.pd.RegDMABufMR(0, 0, 0, -1, 0)
	if err == nil {
		_ = mr.Dereg()
		return false
	}
	var en verbs.Errno
	ok := errors.As(err, &en) && en == verbs.EBADF
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

func firstBit(v uint8, n int) int {
	for i := 0; i < n; i++ {
		if v&(1<<i) != 0 {
			return i
		}
	}
	return n - 1
}

func portSpeed(pa verbs.PortAttr) int {
	return ibvSpeeds[firstBit(pa.ActiveSpeed, len(ibvSpeeds))] * ibvWidths[firstBit(pa.ActiveWidth, len(ibvWidths))]
}

func (t *Transport) Devices() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.vdevs)
}

// members returns the ports of NCCL device dev.
func (t *Transport) members(dev int) ([]*device, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if !t.ready {
		return nil, nccl.Errorf(nccl.InternalError, "NET/GoIB : transport used before Init")
	}
	if dev < 0 || dev >= len(t.vdevs) {
		return nil, nccl.Errorf(nccl.InvalidArgument, "NET/GoIB : device %d out of range [0,%d)", dev, len(t.vdevs))
	}
	out := make([]*device, len(t.vdevs[dev]))
	for i, p := range t.vdevs[dev] {
		out[i] = t.devs[p]
	}
	return out, nil
}

func (t *Transport) ptrSupport(devs []*device) nccl.PtrType {
	pt := nccl.PtrHost
	if ok, _ := t.fs.PeerMemory(); ok {
		pt |= nccl.PtrCUDA
	}
	dmabuf := true
	for _, d := range devs {
		dmabuf = dmabuf && d.hca.dmabuf
	}
	if dmabuf {
		pt |= nccl.PtrDMABuf
	}
	return pt
}

func (t *Transport) Properties(dev int) (nccl.Properties, error) {
	devs, err := t.members(dev)
	if err != nil {
		return nccl.Properties{}, err
	}
	d0 := devs[0]
	p := nccl.Properties{
		Name:         d0.name,
		PCIPath:      d0.pciPath,
		GUID:         d0.hca.attr.SysImageGUID,
		PtrSupport:   t.ptrSupport(devs),
		RegIsGlobal:  true,
		Speed:        0,
		Port:         d0.port,
		MaxComms:     d0.hca.attr.MaxQP,
		MaxRecvs:     maxRecvs,
		MaxP2PBytes:  nccl.MaxNetSizeBytes,
		MaxCollBytes: nccl.MaxCollSize,
		RailID:       nccl.IDUndef,
		PlaneID:      nccl.IDUndef,
	}
	names := make([]string, len(devs))
	t.mu.RLock()
	p.VDevs = append([]int(nil), t.vdevs[dev]...)
	t.mu.RUnlock()
	for i, d := range devs {
		names[i] = d.name
		p.Speed += d.speed
		p.MaxComms = min(p.MaxComms, d.hca.attr.MaxQP)
	}
	p.Name = strings.Join(names, "+")
	return p, nil
}

// MakeVDevice fuses ports into one virtual NIC whose QPs are striped over
// the members (NCCL's makeVDevice).
func (t *Transport) MakeVDevice(devs []int) (int, error) {
	if len(devs) > 1 && !nccl.EnvBool(t.log, "NCCL_IB_MERGE_NICS", true) {
		return -1, nccl.Errorf(nccl.InvalidUsage, "NET/GoIB : NCCL_IB_MERGE_NICS=0 forbids fusing devices %v; unset it or set NCCL_NET_MERGE_LEVEL=LOC", devs)
	}
	if len(devs) < 1 || len(devs) > maxVDevs {
		return -1, nccl.Errorf(nccl.InvalidUsage, "NET/GoIB : cannot fuse %d devices (1 to %d)", len(devs), maxVDevs)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.ready {
		return -1, nccl.Errorf(nccl.InternalError, "NET/GoIB : makeVDevice before Init")
	}
	var members []int
	seen := map[int]bool{}
	for _, d := range devs {
		if d < 0 || d >= len(t.vdevs) {
			return -1, nccl.Errorf(nccl.InvalidArgument, "NET/GoIB : makeVDevice: device %d out of range [0,%d)", d, len(t.vdevs))
		}
		for _, m := range t.vdevs[d] {
			if seen[m] {
				return -1, nccl.Errorf(nccl.InvalidArgument, "NET/GoIB : makeVDevice: port %s listed twice in %v", t.devs[m], devs)
			}
			seen[m] = true
			members = append(members, m)
		}
	}
	if len(members) > maxVDevs {
		return -1, nccl.Errorf(nccl.InvalidUsage, "NET/GoIB : fused device would have %d ports (max %d)", len(members), maxVDevs)
	}
	ll := t.devs[members[0]].attr.LinkLayer
	for _, m := range members[1:] {
		if t.devs[m].attr.LinkLayer != ll {
			return -1, nccl.Errorf(nccl.InvalidUsage, "NET/GoIB : cannot fuse %s (%v) with %s (%v): link layers differ", t.devs[members[0]], ll, t.devs[m], t.devs[m].attr.LinkLayer)
		}
	}
	if len(t.vdevs) >= 256+len(t.devs) {
		return -1, nccl.Errorf(nccl.InvalidUsage, "NET/GoIB : too many virtual devices")
	}
	t.vdevs = append(t.vdevs, members)
	return len(t.vdevs) - 1, nil
}

// Finalize stops the async watchers and closes every device. Comms must be
// closed first (NCCL closes them before finalize); registrations still
// cached are released.
func (t *Transport) Finalize() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.ready {
		return nil
	}
	t.ready = false
	t.closeHCAsLocked()
	t.devs, t.vdevs = nil, nil
	return nil
}

func (t *Transport) closeHCAsLocked() {
	for _, h := range t.hcas {
		if h.stop != nil {
			close(h.stop)
			select {
			case <-h.stopped:
			case <-time.After(2 * time.Second):
				t.log.Warnf("NET/GoIB : async event watcher of %s did not stop", h.name)
			}
		}
		for _, d := range h.ports {
			d.mrCache.releaseAll()
		}
		if h.pd != nil {
			if err := h.pd.Dealloc(); err != nil {
				t.log.Warnf("NET/GoIB : %s: ibv_dealloc_pd: %v (a comm was not closed?)", h.name, err)
			}
		}
		if err := h.ctx.Close(); err != nil {
			t.log.Warnf("NET/GoIB : %s: ibv_close_device: %v", h.name, err)
		}
	}
	t.hcas = nil
}

// watchAsync reads the device's asynchronous events until Finalize. Fatal
// events fail the affected comms' next call with SystemError.
func (t *Transport) watchAsync(h *hca) {
	defer close(h.stopped)
	for {
		ev, err := h.ctx.NextAsyncEvent(h.stop)
		if err != nil {
			if !errors.Is(err, verbs.ErrClosed) {
				t.log.Warnf("NET/GoIB : %s: ibv_get_async_event: %v; no longer watching this device", h.name, err)
			}
			return
		}
		t.handleAsync(h, ev)
	}
}

func (t *Transport) handleAsync(h *hca, ev verbs.AsyncEvent) {
	if !ev.Type.Fatal() {
		t.log.Infof(nccl.SubsysNet, "NET/GoIB : %s: async event %v (port %d)", h.name, ev.Type, ev.Port)
		return
	}
	var owner *commCore
	switch ev.Type {
	case verbs.EventQPFatal, verbs.EventQPReqErr, verbs.EventQPAccessErr:
		if v, ok := h.owners.Load(ev.QPNum); ok {
			owner = v.(*commCore)
		}
		msg := fmt.Sprintf("%s: fatal async event %v on QP %#x", h.name, ev.Type, ev.QPNum)
		t.log.Warnf("NET/GoIB : %s", msg)
		if owner != nil {
			owner.setFatal(msg)
		}
	case verbs.EventCQErr:
		if v, ok := h.owners.Load(ev.CQID); ok {
			owner = v.(*commCore)
		}
		msg := fmt.Sprintf("%s: fatal async event %v (completion queue overrun)", h.name, ev.Type)
		t.log.Warnf("NET/GoIB : %s", msg)
		if owner != nil {
			owner.setFatal(msg)
		}
	default:
		msg := fmt.Sprintf("%s: fatal async event %v; the device is unusable until it is reset", h.name, ev.Type)
		t.log.Warnf("NET/GoIB : %s", msg)
		for _, d := range h.ports {
			d.fatalWhy.Store(&msg)
			d.fatal.Add(1)
		}
	}
}
