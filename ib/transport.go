package ib

import (
	"errors"
	"fmt"
	"net/netip"
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

// Transport is the IB verbs transport. It implements nccl.Transport and
// nccl.VDeviceMaker.
type Transport struct {
	opts     Options
	fs       sysfs.FS
	log      nccl.Logger
	provider verbs.Provider
	feats    verbs.Features

	cfg config // read once by Init

	flidWarned atomic.Bool // the cross-subnet peer without a FLID was WARNed about

	mu      sync.RWMutex
	hcas    []*hca
	devs    []*device // usable ports, in NCCL device order
	vdevs   [][]int   // NCCL device -> member ports (indices into devs)
	oobName string
	oobAddr netip.Addr
	state   transportState

	life    lifecycle
	pendMu  sync.Mutex
	pending map[uint64]*connector
}

type transportState int

const (
	stateNew transportState = iota
	stateReady
	stateFinalized
)

var (
	_ nccl.Transport    = (*Transport)(nil)
	_ nccl.VDeviceMaker = (*Transport)(nil)
)

// New returns the transport on the real libibverbs; register it with
// nccl.Register("ib", 10, ib.New).
func New() nccl.Transport { return NewWithOptions(Options{}) }

// NewWithOptions returns a transport with the given options.
func NewWithOptions(o Options) *Transport {
	t := &Transport{opts: o, fs: sysfs.New(o.SysfsRoot), pending: map[uint64]*connector{}}
	t.life.init()
	return t
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
	// fatal is the WARN of the device-fatal event the watcher saw (nil:
	// none). A dead context stays dead until the device is reset, which
	// this process does not survive: it is never cleared.
	fatal atomic.Pointer[string]
}

// device is one usable port: what NCCL sees as a physical device.
type device struct {
	index       int
	hca         *hca
	name        string
	port        int
	attr        verbs.PortAttr
	gidMu       sync.Mutex // gidIndex, gid, gidStale (connections resolve concurrently)
	gidStale    bool
	gidIndex    int
	gid         verbs.GID
	pciPath     string // topology key (merged, see mergePCIPath)
	fullPCIPath string
	// realPort: how many ports found before this one share its merged PCI
	// path. NCCL reports port + realPort, so that the two functions of a
	// dual-port card (each ibv port 1) stay two ports to its topology search.
	realPort int
	netdev   string
	speed    int
	ar       bool // adaptive routing: NCCL_IB_ADAPTIVE_ROUTING, else on for IB, off for RoCE
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
	switch t.state {
	case stateReady:
		return nil
	case stateFinalized:
		return nccl.Errorf(nccl.InternalError, "NET/GoIB : init after finalize: a finalized transport cannot be reused")
	}
	cfg, err := readConfig(t.log)
	if err != nil {
		return err
	}
	t.cfg = cfg
	if cfg.disable {
		return fmt.Errorf("%w: NCCL_IB_DISABLE=1", nccl.ErrNoDevice)
	}
	p := t.opts.Provider
	if p == nil {
		lp, err := loadVerbs(t.log, cfg.ibverbsLib)
		if err != nil {
			return fmt.Errorf("%w: %v (install rdma-core's libibverbs1 or point NCCL_IBVERBS_LIB at libibverbs.so.1)", nccl.ErrNoDevice, err)
		}
		p = lp
	}
	t.provider = p
	t.forkInit(p)
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
	if !t.feats.PortSpeed && cfg.querySpeed {
		t.log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/GoIB : %s has no ibv_query_port_speed: ports report lane rate × width (a LAG function, one link's)", p.Name())
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
	t.state = stateReady
	var names []string
	for _, d := range t.devs {
		names = append(names, fmt.Sprintf("[%d]%s:%d/%s", d.index, d.name, d.port, d.attr.LinkLayer))
	}
	t.log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/GoIB : using %s ; OOB %s:%v (verbs provider %s)", strings.Join(names, " "), name, addr, p.Name())
	return nil
}

// loadVerbs opens libibverbs as NCCL's ibvsymbols.cc does: NCCL_IBVERBS_LIB
// when set, then libibverbs.so, then libibverbs.so.1. A set library that does
// not load falls back to the defaults, as in NCCL, with a WARN: the user
// asked for that one.
func loadVerbs(log nccl.Logger, set string) (*ibv.Provider, error) {
	var errs []string
	if set != "" {
		p, err := ibv.Load(set)
		if err == nil {
			return p, nil
		}
		log.Warnf("NET/GoIB : NCCL_IBVERBS_LIB=%s: %v; trying %s, as NCCL does", set, err, strings.Join(ibv.DefaultLibraries, " and "))
		errs = append(errs, "NCCL_IBVERBS_LIB="+set+": "+err.Error())
	}
	for _, lib := range ibv.DefaultLibraries {
		p, err := ibv.Load(lib)
		if err == nil {
			return p, nil
		}
		errs = append(errs, err.Error())
	}
	return nil, errors.New(strings.Join(errs, "; "))
}

func (t *Transport) Devices() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.state != stateReady {
		return 0
	}
	return len(t.vdevs)
}

// usableLocked fails calls made before Init or after Finalize.
func (t *Transport) usableLocked() error {
	switch t.state {
	case stateNew:
		return nccl.Errorf(nccl.InternalError, "NET/GoIB : transport used before Init")
	case stateFinalized:
		return nccl.Errorf(nccl.InternalError, "NET/GoIB : transport used after finalize")
	}
	return nil
}

// members returns the ports of NCCL device dev.
func (t *Transport) members(dev int) ([]*device, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if err := t.usableLocked(); err != nil {
		return nil, err
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
		Port:         d0.port + d0.realPort,
		MaxComms:     d0.hca.attr.MaxQP,
		MaxRecvs:     maxRecvs,
		MaxP2PBytes:  nccl.MaxNetSizeBytes,
		MaxCollBytes: nccl.MaxCollSize,
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
	if len(devs) > 1 && !t.cfg.mergeNICs {
		return -1, nccl.Errorf(nccl.InvalidUsage, "NET/GoIB : NCCL_IB_MERGE_NICS=0 forbids fusing devices %v; unset it or set NCCL_NET_MERGE_LEVEL=LOC", devs)
	}
	if len(devs) < 1 || len(devs) > maxVDevs {
		return -1, nccl.Errorf(nccl.InvalidUsage, "NET/GoIB : cannot fuse %d devices (1 to %d)", len(devs), maxVDevs)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.usableLocked(); err != nil {
		return -1, err
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

// closeHCAs closes every device: its registrations still cached, its PD and
// its context. Only once no comm core exists (Finalize, or the last comm's
// Close after it).
func (t *Transport) closeHCAs() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closeHCAsLocked()
}

func (t *Transport) closeHCAsLocked() {
	// The registrations NCCL never deregistered go with the devices
	// (closeMRCache), and so do their handles: the table is the package's,
	// so an entry left there would keep these devices, their HCA and MR
	// caches reachable for the life of the process, one more set for every
	// restart (NCCL 2.28+ restarts the transport per communicator), and
	// would count against the table's limit. No comm of this transport is
	// left to pass one of them back.
	forgetHandlesOf(t.hcas)
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
			d.closeMRCache()
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
