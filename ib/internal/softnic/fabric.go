package softnic

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
)

// Fabric connects software devices. All devices of a fabric can reach each
// other (one switch).
type Fabric struct {
	mu      sync.Mutex
	devices []*Device
	byName  map[string]*Device
	nextLID uint16
	nextQPN uint32
	nextKey uint32
	nextID  uint64
	faults  []*faultState
	mfaults []*modifyFaultState
	cfaults []*CallFault
	lags    []CompletionLag

	violations []string
	recording  bool
	records    []WRRecord

	// fork(): see Provider.ForkInit.
	forkUnsafeKernel bool
	forkEnabled      bool
	opens            int
	forkCalls        int
	opensBeforeFork  int
}

// NewFabric returns an empty fabric.
func NewFabric() *Fabric {
	return &Fabric{byName: map[string]*Device{}, nextLID: 1, nextQPN: 0x100, nextKey: 0x1000}
}

// GIDEntry is one GID table entry of a RoCE port, with the type sysfs would
// report for it ("RoCE v2" or "IB/RoCE v1").
type GIDEntry struct {
	GID  verbs.GID
	Type string
}

// DeviceConfig describes a software device. Zero fields take the defaults in
// brackets.
type DeviceConfig struct {
	Name      string
	LinkLayer verbs.LinkLayer // [InfiniBand]
	Ports     int             // [1]
	State     verbs.PortState // [ACTIVE]
	MTU       verbs.MTU       // [5 = 4096]
	Width     uint8           // [2 = 4x]
	Speed     uint8           // [32 = EDR, 25 Gb/s per lane]
	SpeedEx   uint32          // active_speed_ex [0]; an XDR port: Speed 128 (the kernel's cap) and SpeedEx 256
	MaxQP     int             // [131072]
	GUID      uint64          // [derived from the device index]
	GIDs      []GIDEntry      // RoCE GID table [one IPv4 RoCE v2 GID per device]
	NetDev    string          // netdev named in sysfs for RoCE [<name>_eth]
	PCIPath   string          // [/sys/devices/pci0000:<i>/0000:<i>:00.0]
	// RefuseSL makes RTR refuse a service level above 15 on IB. ConnectX
	// does not (mlx5 keeps the low 4 bits, which is why NCCL's habit of
	// using the communicator's traffic class as the service level works
	// there); other HCAs may, and this is how tests reach the RTR failure.
	RefuseSL bool
	// GRHRequired sets IBV_QPF_GRH_REQUIRED on an IB port: RTR without a
	// GRH fails with EINVAL, as the kernel's rdma_check_ah_attr does.
	GRHRequired bool
	// EffectiveSpeed is what ibv_query_port_speed reports, in Mbps (mlx5
	// gives a LAG or multi-port e-switch function the sum of its member
	// links) [0, as for a port that is down]; PortSpeedErr makes it fail
	// instead (verbs.EPROTONOSUPPORT: a kernel without the verb). Both
	// need Features.PortSpeed, without which it fails with EOPNOTSUPP.
	EffectiveSpeed int64
	PortSpeedErr   error
}

// Device is one software HCA.
type Device struct {
	fabric *Fabric
	cfg    DeviceConfig
	index  int
	ports  []portState
	mrs    map[uint32]*mr
	qps    map[uint32]*qp
	ctxs   map[*context]struct{}
	dead   bool // Fail was called
}

type portState struct {
	attr verbs.PortAttr
	gids []GIDEntry
}

// AddDevice creates a device on the fabric.
func (f *Fabric) AddDevice(cfg DeviceConfig) *Device {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, dup := f.byName[cfg.Name]; dup || cfg.Name == "" {
		panic(fmt.Sprintf("softnic: bad or duplicate device name %q", cfg.Name))
	}
	idx := len(f.devices)
	if cfg.LinkLayer == verbs.LinkUnspecified {
		cfg.LinkLayer = verbs.LinkInfiniBand
	}
	if cfg.Ports == 0 {
		cfg.Ports = 1
	}
	if cfg.State == 0 {
		cfg.State = verbs.PortActive
	}
	if cfg.MTU == 0 {
		cfg.MTU = 5
	}
	if cfg.Width == 0 {
		cfg.Width = 2
	}
	if cfg.Speed == 0 {
		cfg.Speed = 32
	}
	if cfg.MaxQP == 0 {
		cfg.MaxQP = 131072
	}
	if cfg.GUID == 0 {
		cfg.GUID = 0x0002c90300a00000 + uint64(idx)<<8
	}
	if cfg.NetDev == "" && cfg.LinkLayer == verbs.LinkEthernet {
		cfg.NetDev = cfg.Name + "_eth"
	}
	if cfg.PCIPath == "" {
		// One PCI bus per device, as separate NICs sit on real hosts (NCCL
		// merges functions and, by default, devices of one bus).
		cfg.PCIPath = fmt.Sprintf("/sys/devices/pci0000:%02x/0000:%02x:00.0", idx+1, idx+1)
	}
	d := &Device{fabric: f, cfg: cfg, index: idx, mrs: map[uint32]*mr{}, qps: map[uint32]*qp{}, ctxs: map[*context]struct{}{}}
	for p := 0; p < cfg.Ports; p++ {
		ps := portState{attr: verbs.PortAttr{State: cfg.State, MaxMTU: cfg.MTU, ActiveMTU: cfg.MTU,
			ActiveWidth: cfg.Width, ActiveSpeed: cfg.Speed, ActiveSpeedEx: cfg.SpeedEx, LinkLayer: cfg.LinkLayer}}
		if cfg.LinkLayer == verbs.LinkEthernet {
			ps.gids = cfg.GIDs
			if ps.gids == nil {
				ip := netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + idx*4 + p)})
				ps.gids = []GIDEntry{
					{GID: linkLocalGID(cfg.GUID + uint64(p)), Type: "IB/RoCE v1"},
					{GID: linkLocalGID(cfg.GUID + uint64(p)), Type: "RoCE v2"},
					{GID: verbs.GID(netip.AddrFrom16(ip.As16()).As16()), Type: "IB/RoCE v1"},
					{GID: mapped(ip), Type: "RoCE v2"},
				}
			}
		} else {
			ps.attr.LID = f.nextLID
			f.nextLID++
			ps.gids = cfg.GIDs // another subnet prefix, a routable FLID at index 1
			if ps.gids == nil {
				ps.gids = []GIDEntry{{GID: linkLocalGID(cfg.GUID + uint64(p)), Type: "IB/RoCE v1"}}
			}
			if cfg.GRHRequired {
				ps.attr.Flags |= verbs.PortGRHRequired
			}
		}
		ps.attr.GIDTblLen = len(ps.gids)
		d.ports = append(d.ports, ps)
	}
	f.devices = append(f.devices, d)
	f.byName[cfg.Name] = d
	return d
}

func mapped(ip netip.Addr) verbs.GID { return verbs.GID(netip.AddrFrom16(ip.As16()).As16()) }

func linkLocalGID(guid uint64) verbs.GID {
	var g verbs.GID
	g[0], g[1] = 0xfe, 0x80
	for i := 0; i < 8; i++ {
		g[8+i] = byte(guid >> (56 - 8*i))
	}
	return g
}

// Name returns the device name.
func (d *Device) Name() string { return d.cfg.Name }

// SetPortState changes a port's state (e.g. to test that DOWN ports are skipped).
func (d *Device) SetPortState(port int, s verbs.PortState) {
	d.fabric.mu.Lock()
	defer d.fabric.mu.Unlock()
	d.ports[port-1].attr.State = s
}

// Fail makes the device die as an HCA does on a fatal error: it reports
// IBV_EVENT_DEVICE_FATAL to every open context, and from then on every verbs
// call on them fails with EIO, except the ones that release resources.
func (d *Device) Fail() {
	d.fabric.mu.Lock()
	defer d.fabric.mu.Unlock()
	d.dead = true
	d.deliverLocked(verbs.AsyncEvent{Type: verbs.EventDeviceFatal})
}

// FailEventLater is Fail with the event reported delay later (never, for a
// negative delay): the race a host sees, whose verbs calls fail as soon as
// the device dies while the event reaches the async fd's reader later.
func (d *Device) FailEventLater(delay time.Duration) {
	d.fabric.mu.Lock()
	defer d.fabric.mu.Unlock()
	d.dead = true
	if delay >= 0 {
		time.AfterFunc(delay, func() { d.InjectAsyncEvent(verbs.AsyncEvent{Type: verbs.EventDeviceFatal}) })
	}
}

// InjectAsyncEvent delivers an asynchronous event as the hardware would: QP
// and CQ events to the context owning that object, device and port events to
// every open context of the device.
func (d *Device) InjectAsyncEvent(ev verbs.AsyncEvent) {
	d.fabric.mu.Lock()
	defer d.fabric.mu.Unlock()
	d.deliverLocked(ev)
}

func (d *Device) deliverLocked(ev verbs.AsyncEvent) {
	var targets []*context
	switch ev.Type {
	case verbs.EventQPFatal, verbs.EventQPReqErr, verbs.EventQPAccessErr, verbs.EventCommEst,
		verbs.EventSQDrained, verbs.EventPathMig, verbs.EventPathMigErr, verbs.EventQPLastWQEReached:
		if q := d.qps[ev.QPNum]; q != nil {
			targets = append(targets, q.pd.ctx)
		}
	case verbs.EventCQErr:
		for c := range d.ctxs {
			if _, ok := c.cqs[ev.CQID]; ok {
				targets = append(targets, c)
			}
		}
	default:
		for c := range d.ctxs {
			targets = append(targets, c)
		}
	}
	for _, c := range targets {
		select {
		case c.events <- ev:
		default: // a real device drops events nobody reads, too
		}
	}
}

// QPCount returns how many QPs exist on the device (tests check for leaks).
func (d *Device) QPCount() int {
	d.fabric.mu.Lock()
	defer d.fabric.mu.Unlock()
	return len(d.qps)
}

// MRCount returns how many MRs are registered on the device.
func (d *Device) MRCount() int {
	d.fabric.mu.Lock()
	defer d.fabric.mu.Unlock()
	return len(d.mrs)
}

// Fault makes matching work requests fail with Status. The failing WR's QP
// then enters the error state, so everything after it is flushed.
type Fault struct {
	Device string         // requester device name; "" matches any
	QPNum  uint32         // requester QP; 0 matches any
	Ops    []verbs.Opcode // nil matches any opcode
	Status verbs.WCStatus
	Count  int // WRs to fail before the fault disarms; <= 0 means forever
	// PostErr, when set, makes ibv_post_send refuse the matching WR (bad_wr
	// points at it) with this error instead of completing it with Status:
	// the WRs before it in the list are posted, it and those after are not.
	PostErr error
}

type faultState struct {
	Fault
	left int
}

// InjectFault arms a fault.
func (f *Fabric) InjectFault(flt Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults = append(f.faults, &faultState{Fault: flt, left: flt.Count})
}

// ModifyFault makes QP state transitions fail with Err, as ibv_modify_qp
// does on a real device: on RoCE the move to RTR fails with ETIMEDOUT while
// the kernel cannot resolve the destination GID's link-layer address (its
// neighbour entry has no ARP answer yet). The QP keeps its state, so the
// transition may be tried again.
type ModifyFault struct {
	Device string // the QP's device; "" matches any
	To     string // the target state: "INIT", "RTR" or "RTS"
	Err    error
	Count  int // transitions to fail before the fault disarms; <= 0 means forever
}

type modifyFaultState struct {
	ModifyFault
	left, hits int
}

// InjectModifyFault arms a QP transition fault.
func (f *Fabric) InjectModifyFault(flt ModifyFault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mfaults = append(f.mfaults, &modifyFaultState{ModifyFault: flt, left: flt.Count})
}

// ModifyFaultHits is how many transitions the armed or spent transition
// faults have failed so far.
func (f *Fabric) ModifyFaultHits() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, fs := range f.mfaults {
		n += fs.hits
	}
	return n
}

// modifyFaultLocked is the error an armed fault fails dev's transition to
// state with; a spent fault stays listed (for ModifyFaultHits) but no longer
// matches.
func (f *Fabric) modifyFaultLocked(dev, state string) error {
	for _, fs := range f.mfaults {
		if fs.To != state || fs.Device != "" && fs.Device != dev || fs.Count > 0 && fs.left <= 0 {
			continue
		}
		fs.left--
		fs.hits++
		return fs.Err
	}
	return nil
}

// CompletionLag holds back the send completions of a device's QPs, as a
// requester whose ACKs come late sees them: the work requests have executed
// at the responder (their data is there), but their completions, and the
// send-queue slots that polling those frees, wait for ReleaseCompletions.
// Once one completion of a QP is held, every later one of it is too.
type CompletionLag struct {
	Device string         // requester device name; "" matches any
	Ops    []verbs.Opcode // nil matches any opcode
}

// LagCompletions arms a completion lag.
func (f *Fabric) LagCompletions(l CompletionLag) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lags = append(f.lags, l)
}

// ReleaseCompletions disarms every lag and queues the completions held so
// far on their CQs, each QP's in posting order.
func (f *Fabric) ReleaseCompletions() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lags = nil
	for _, d := range f.byName {
		for _, q := range d.qps {
			for _, e := range q.held {
				if q.state != qpsDestroyed {
					q.sendCQ.pushLocked(e)
				}
			}
			q.held = nil
		}
	}
}

func (f *Fabric) lagLocked(dev string, op verbs.Opcode) bool {
	for _, l := range f.lags {
		if l.Device != "" && l.Device != dev {
			continue
		}
		if l.Ops == nil {
			return true
		}
		for _, o := range l.Ops {
			if o == op {
				return true
			}
		}
	}
	return false
}

// CallFault makes a resource-creating verb fail with Err, as a real device
// does when it runs out of something: ibv_reg_mr with ENOMEM when the
// locked-memory limit (ulimit -l) is reached or EFAULT when the range is not
// mapped, ibv_create_qp or ibv_create_cq with ENOMEM. Call is the verb's
// name ("ibv_reg_mr" also covers ibv_reg_dmabuf_mr).
type CallFault struct {
	Device string // "" matches any
	Call   string // "ibv_reg_mr", "ibv_create_qp", "ibv_create_cq"
	Err    error
	Count  int // calls to fail before the fault disarms; <= 0 means forever
	left   int
}

// InjectCallFault arms a verb failure.
func (f *Fabric) InjectCallFault(flt CallFault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	flt.left = flt.Count
	f.cfaults = append(f.cfaults, &flt)
}

// callFaultLocked is the error an armed CallFault fails dev's call with.
func (f *Fabric) callFaultLocked(dev, call string) error {
	for _, cf := range f.cfaults {
		if cf.Call != call || cf.Device != "" && cf.Device != dev || cf.Count > 0 && cf.left <= 0 {
			continue
		}
		cf.left--
		return fmt.Errorf("softnic: %s on %s (injected): %w", call, dev, cf.Err)
	}
	return nil
}

// OverrunCQ makes the CQ with the given id overflow, as one whose consumer
// fell behind does: IBV_EVENT_CQ_ERR to its context, and polling it fails.
func (d *Device) OverrunCQ(id uint64) bool {
	d.fabric.mu.Lock()
	defer d.fabric.mu.Unlock()
	for c := range d.ctxs {
		if q, ok := c.cqs[id]; ok {
			if !q.overrun {
				q.overrun = true
				d.deliverLocked(verbs.AsyncEvent{Type: verbs.EventCQErr, CQID: id})
			}
			return true
		}
	}
	return false
}

// ClearFaults disarms every fault.
func (f *Fabric) ClearFaults() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults = nil
	f.mfaults = nil
	f.cfaults = nil
}

func (f *Fabric) matchFaultLocked(dev string, qpn uint32, op verbs.Opcode) (verbs.WCStatus, bool) {
	fs := f.takeFaultLocked(dev, qpn, op, false)
	if fs == nil {
		return 0, false
	}
	return fs.Status, true
}

// matchPostFaultLocked returns the error a post-time fault refuses the WR with.
func (f *Fabric) matchPostFaultLocked(dev string, qpn uint32, op verbs.Opcode) error {
	if fs := f.takeFaultLocked(dev, qpn, op, true); fs != nil {
		return fs.PostErr
	}
	return nil
}

func (f *Fabric) takeFaultLocked(dev string, qpn uint32, op verbs.Opcode, atPost bool) *faultState {
	for i, fs := range f.faults {
		if (fs.PostErr != nil) != atPost || fs.Device != "" && fs.Device != dev || fs.QPNum != 0 && fs.QPNum != qpn {
			continue
		}
		if fs.Ops != nil {
			hit := false
			for _, o := range fs.Ops {
				hit = hit || o == op
			}
			if !hit {
				continue
			}
		}
		if fs.Count > 0 {
			fs.left--
			if fs.left <= 0 {
				f.faults = append(f.faults[:i:i], f.faults[i+1:]...)
			}
		}
		return fs
	}
	return nil
}

// resolveLocked finds the destination port of an address vector.
// resolveLocked finds the device an address vector reaches from a port
// whose GID 0 is from: by GID with a GRH, else by LID, which is local to a
// subnet (an IB port of another subnet is reached only through a GRH).
func (f *Fabric) resolveLocked(ah verbs.AH, from verbs.GID) *Device {
	for _, d := range f.devices {
		for _, p := range d.ports {
			if ah.IsGlobal {
				for _, g := range p.gids {
					if g.GID == ah.DGID && !g.GID.IsZero() {
						return d
					}
				}
			} else if p.attr.LID != 0 && p.attr.LID == ah.DLID && len(p.gids) > 0 && p.gids[0].GID.Subnet() == from.Subnet() {
				return d
			}
		}
	}
	return nil
}

// Provider returns a verbs provider that sees the named devices (all of the
// fabric's devices when none are named), with the given optional features.
func (f *Fabric) Provider(feat verbs.Features, names ...string) *Provider {
	return &Provider{fabric: f, names: names, feat: feat}
}

// Provider is one host's view of a fabric.
type Provider struct {
	fabric *Fabric
	names  []string
	feat   verbs.Features
}

func (p *Provider) Name() string             { return "softnic" }
func (p *Provider) Features() verbs.Features { return p.feat }

func (p *Provider) Devices() ([]string, error) {
	if p.names != nil {
		return append([]string(nil), p.names...), nil
	}
	p.fabric.mu.Lock()
	defer p.fabric.mu.Unlock()
	out := make([]string, len(p.fabric.devices))
	for i, d := range p.fabric.devices {
		out[i] = d.cfg.Name
	}
	return out, nil
}

// SetForkUnsafeKernel models a kernel older than 5.13, which does not copy
// pinned pages when the process forks: there ibv_fork_init must run before
// the first registration, or it fails with EINVAL ("too late").
func (f *Fabric) SetForkUnsafeKernel(unsafe bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forkUnsafeKernel = unsafe
}

// ForkInits reports how often ForkInit was called and how many devices had
// been opened before its first call.
func (f *Fabric) ForkInits() (calls, opensBefore int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.forkCalls, f.opensBeforeFork
}

// ForkInit answers as libibverbs does: "unneeded" on a kernel that copies
// pinned pages at fork; elsewhere "enabled", unless memory was registered
// before the first call, which libibverbs refuses with EINVAL.
func (p *Provider) ForkInit() (verbs.ForkStatus, error) {
	f := p.fabric
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.forkCalls == 0 {
		f.opensBeforeFork = f.opens
	}
	f.forkCalls++
	switch {
	case !f.forkUnsafeKernel:
		return verbs.ForkUnneeded, nil
	case f.forkEnabled:
		return verbs.ForkEnabled, nil
	}
	for _, d := range f.devices {
		if len(d.mrs) > 0 {
			return verbs.ForkDisabled, fmt.Errorf("softnic: ibv_fork_init after memory was registered: %w", verbs.EINVAL)
		}
	}
	f.forkEnabled = true
	return verbs.ForkEnabled, nil
}

func (p *Provider) Open(name string) (verbs.Context, error) {
	f := p.fabric
	f.mu.Lock()
	defer f.mu.Unlock()
	f.opens++
	d := f.byName[name]
	if d == nil {
		return nil, fmt.Errorf("softnic: no device %q: %w", name, verbs.ENOENT)
	}
	c := &context{dev: d, events: make(chan verbs.AsyncEvent, 64), closed: make(chan struct{}), cqs: map[uint64]*cq{}, pds: map[*pd]struct{}{}, dmabuf: p.feat.DMABuf, portSpeed: p.feat.PortSpeed}
	d.ctxs[c] = struct{}{}
	return c, nil
}

// WriteSysfs lays out, under root, the sysfs files the IB transport reads for
// every device of the fabric: class/infiniband/<dev>/device (a link to the PCI
// device directory), ports/<p>/state, link_layer, gid_attrs/types/<i> and
// gid_attrs/ndevs/<i>.
func (f *Fabric) WriteSysfs(root string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, d := range f.devices {
		base := filepath.Join(root, "class", "infiniband", d.cfg.Name)
		pci := filepath.Join(root, "devices", filepath.Base(filepath.Dir(d.cfg.PCIPath)), filepath.Base(d.cfg.PCIPath))
		if err := os.MkdirAll(pci, 0o755); err != nil {
			return err
		}
		if err := os.MkdirAll(base, 0o755); err != nil {
			return err
		}
		if err := os.Symlink(pci, filepath.Join(base, "device")); err != nil && !os.IsExist(err) {
			return err
		}
		for pi, p := range d.ports {
			pd := filepath.Join(base, "ports", strconv.Itoa(pi+1))
			for _, sub := range []string{"gid_attrs/types", "gid_attrs/ndevs"} {
				if err := os.MkdirAll(filepath.Join(pd, sub), 0o755); err != nil {
					return err
				}
			}
			files := map[string]string{
				"state":      fmt.Sprintf("%d: %s\n", int(p.attr.State), p.attr.State),
				"link_layer": map[bool]string{true: "Ethernet\n", false: "InfiniBand\n"}[d.cfg.LinkLayer == verbs.LinkEthernet],
			}
			for i, g := range p.gids {
				files[fmt.Sprintf("gid_attrs/types/%d", i)] = g.Type + "\n"
				if d.cfg.NetDev != "" {
					files[fmt.Sprintf("gid_attrs/ndevs/%d", i)] = d.cfg.NetDev + "\n"
				}
			}
			for name, content := range files {
				if err := os.WriteFile(filepath.Join(pd, name), []byte(content), 0o644); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// Device returns the named device, or nil.
func (f *Fabric) Device(name string) *Device {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.byName[name]
}

// SetGID changes (or, past the end, appends to) a RoCE port's GID table, as
// an address change on the netdev does, and reports IBV_EVENT_GID_CHANGE on
// the port like the kernel; call WriteSysfs again for the types.
func (d *Device) SetGID(port, index int, e GIDEntry) {
	d.fabric.mu.Lock()
	defer d.fabric.mu.Unlock()
	p := &d.ports[port-1]
	for len(p.gids) <= index {
		p.gids = append(p.gids, GIDEntry{Type: "RoCE v2"})
	}
	p.gids[index] = e
	p.attr.GIDTblLen = len(p.gids)
	d.deliverLocked(verbs.AsyncEvent{Type: verbs.EventGIDChange, Port: port})
}

// RTR returns the attributes QP qpn was moved to RTR with, so that tests can
// check what the transport asked of the NIC.
func (f *Fabric) RTR(qpn uint32) (verbs.RTRAttr, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, d := range f.byName {
		if q := d.qps[qpn]; q != nil {
			return q.rtr, true
		}
	}
	return verbs.RTRAttr{}, false
}
