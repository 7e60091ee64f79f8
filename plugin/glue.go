package plugin

import (
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/libnccl-net-go/libnccl-net-go/internal/slots"
	"github.com/libnccl-net-go/libnccl-net-go/metrics"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// maxABIRecvs bounds n in a grouped irecv at the ABI.
const maxABIRecvs = nccl.MaxGroupedRecvs

// state is the process-wide plugin state. NCCL calls the plugin from its
// application, service and progress threads at once (nccl-net-api.md §3.1),
// and from v11 on it may finalize the last communicator's context while other
// threads are still inside set-up calls. mu is the transport's lifetime:
// every set-up call (devices, getProperties, listen, connect, accept, regMr,
// deregMr, close) holds it shared for as long as it uses the transport; only
// the first init and the finalize that ends the transport take it
// exclusively. The data path (isend, irecv, iflush, test) never touches it:
// a comm that exists keeps the transport alive (finalize waits for the last
// comm to close).
var state struct {
	mu        sync.RWMutex
	ready     bool
	transport nccl.Transport
	// Settings read once at the first init, copied into each comm.
	countMetrics bool
	stallWarn    int64
	// v11+ contexts alive. init adds with mu held shared; the finalize that
	// takes it to 0 then holds mu exclusively and looks again, so a context
	// created in between keeps the transport.
	ctxRefs atomic.Int32
	// The last context went while comms were still open (ncclCommAbort may
	// leave them to be closed later): the last close finalizes the transport,
	// or, if none comes, the next init does (see restartLocked).
	finalizePending atomic.Bool
	// NCCL_NET_PLUGIN_REF_COUNT > 0: NCCL never unloads the plugin and keeps
	// the device count (virtual NICs included) it read at the first init, so
	// the transport stays up after the last finalize. Set by setupLocked.
	neverUnloaded bool
	// A v8-v10 init succeeded. Those APIs have no finalize, so from then on
	// the transport lives as long as the process: a v11+ table's last
	// finalize (a second NCCL in the same process) must not end it under
	// the older table's user, whose NCCL would never call init again.
	pinned atomic.Bool
}

// devs caches every device's properties and metrics. Virtual devices appear
// after init (makeVDevice), so it grows under its own lock, held only briefly
// by set-up calls that already hold state.mu shared.
var devs struct {
	mu      sync.Mutex
	metrics []*metrics.Device
	props   []nccl.Properties
}

// netCtx is what v11+ init returns per communicator: the comm config, which v11
// moved from connect to init.
type netCtx struct {
	trafficClass int
}

// Handles given to NCCL are integers, never Go pointers (cgo forbids C keeping
// Go pointers, and a forged or stale value must be detectable). A comm or
// context handle packs a kind tag with its slots.Ref:
//
//	bits 63..56 kind tag | 55..24 generation | 23..0 slot
//
// so it is never 0 or 1 and never a valid user-space address. Request handles
// (requests.go) carry the comm's slot in 16 bits, hence maxSlots.
const (
	tagListen = 0x4c // 'L'
	tagSend   = 0x53 // 'S'
	tagRecv   = 0x52 // 'R'
	tagCtx    = 0x43 // 'C': a v11+ per-communicator context

	slotBits = 16
	maxSlots = 1 << slotBits
)

var (
	ctxs  = slots.Table[netCtx]{Limit: maxSlots}
	comms = slots.Table[commEntry]{Limit: maxSlots}
)

func commHandle(tag uint8, gen uint32, slot uint32) uintptr {
	return uintptr(tag)<<56 | uintptr(gen)<<24 | uintptr(slot)
}

func splitCommHandle(h uintptr) (tag uint8, gen uint32, slot uint32) {
	return uint8(h >> 56), uint32(h>>24) & 0xffffffff, uint32(h) & 0xffffff
}

// onSetup runs once per real initialisation, with the chosen transport and
// before any other thread can see it: the cgo layer points the C tables'
// makeVDevice at it, or at NULL (NCCL reads makeVDevice only after init).
var onSetup func(t nccl.Transport)

// errNotReady is what every call before a successful init gets.
var errNotReady = nccl.Errorf(nccl.InternalError, "NET/Go : plugin used before init succeeded (or after the last finalize)")

// panicResult turns a panic recovered at an exported entry into
// ncclInternalError with a WARN: a Go panic must never unwind into NCCL's C
// frames. Every panic is a bug of the glue or the transport: inputs NCCL can
// get wrong are checked and answered with a plain error before they can panic.
func panicResult(entry string, r any) nccl.Result {
	log.Warnf("NET/Go : internal error in %s: %v; please report this with the stack below\n%s", entry, r, debug.Stack())
	return nccl.InternalError
}

// fail logs err (a WARN naming the call) and returns its result code.
func fail(call string, err error) nccl.Result {
	res := nccl.ResultOf(err)
	log.Warnf("NET/Go : %s failed: %v (%v)", call, err, res)
	return res
}

// acquire returns the transport with state.mu held shared; the caller must
// state.mu.RUnlock() when it no longer uses the transport.
func acquire() (nccl.Transport, error) {
	state.mu.RLock()
	if !state.ready {
		state.mu.RUnlock()
		return nil, errNotReady
	}
	return state.transport, nil
}

// chooseTransport runs with state.mu held exclusively.
func chooseTransport() (nccl.Transport, error) {
	regs := nccl.Transports()
	if len(regs) == 0 {
		return nil, nccl.Errorf(nccl.InternalError, "no transport is registered in this plugin build")
	}
	if want := settingTransport.Get(); want != "" {
		reg, ok := nccl.Lookup(want)
		if !ok {
			names := make([]string, len(regs))
			for i, r := range regs {
				names[i] = r.Name
			}
			return nil, nccl.Errorf(nccl.InvalidArgument, "NCCL_GO_TRANSPORT=%s names no transport of this plugin; use one of %s or unset it",
				want, strings.Join(names, ", "))
		}
		regs = []nccl.Registration{reg}
	}
	var reasons []string
	for _, reg := range regs {
		t := reg.New()
		err := t.Init(nccl.InitContext{Log: log})
		if err == nil && t.Devices() <= 0 {
			_ = t.Finalize()
			err = fmt.Errorf("%w: transport reported 0 devices", nccl.ErrNoDevice)
		}
		if err == nil {
			return t, nil
		}
		reasons = append(reasons, reg.Name+": "+err.Error())
		if errors.Is(err, nccl.ErrNoDevice) {
			log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/Go : transport %s unavailable (%v); trying the next one", reg.Name, err)
		} else {
			log.Warnf("NET/Go : transport %s failed to initialise: %v", reg.Name, err)
		}
	}
	return nil, nccl.Errorf(nccl.SystemError, "no usable transport (%s)", strings.Join(reasons, "; "))
}

// setupLocked is the real initialisation, with state.mu held exclusively.
func setupLocked(version int) error {
	readDebugLevel()
	t, err := chooseTransport()
	if err != nil {
		return err
	}
	state.transport = t
	state.ready = true
	state.neverUnloaded = settingRefCount.Get(log) > 0
	if onSetup != nil {
		onSetup(t)
	}
	state.countMetrics = metrics.Enabled(log)
	state.stallWarn = readStallWarn()
	loadDeviceInfo(t)
	metrics.Start(log, metrics.Info{PluginVersion: Version, APIVersion: fmt.Sprintf("v%d", version), Transport: t.Name()})
	log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/Go : libnccl-net-go %s, NCCL net API v%d, transport %s, %s",
		Version, version, t.Name(), describeDevices())
	return nil
}

// netInit is init for every API version. withCtx is true for v11+, which get a
// per-communicator context back and call finalize for each.
func netInit(version int, withCtx bool, trafficClass int) (ctx uintptr, res nccl.Result) {
	state.mu.RLock()
	if !state.ready || state.finalizePending.Load() {
		state.mu.RUnlock()
		state.mu.Lock()
		defer state.mu.Unlock()
		if state.ready && state.finalizePending.Load() && state.ctxRefs.Load() == 0 {
			restartLocked()
		}
		if !state.ready {
			if err := setupLocked(version); err != nil {
				return 0, fail("init", err)
			}
		}
	} else {
		defer state.mu.RUnlock()
	}
	if !withCtx {
		state.pinned.Store(true)
		return 0, nccl.Success
	}
	c := &netCtx{trafficClass: trafficClass}
	r, ok := ctxs.Add(c)
	if !ok {
		return 0, fail("init", nccl.Errorf(nccl.InternalError, "too many communicators (%d) hold a plugin context", maxSlots))
	}
	state.ctxRefs.Add(1)
	state.finalizePending.Store(false)
	return commHandle(tagCtx, r.Gen, r.Slot), nccl.Success
}

// lookupCtx resolves a v11+ context handle.
func lookupCtx(h uintptr) (*netCtx, slots.Ref, error) {
	tag, gen, slot := splitCommHandle(h)
	r := slots.Ref{Slot: slot, Gen: gen}
	c := ctxs.Get(r)
	if tag != tagCtx || c == nil {
		return nil, r, nccl.Errorf(nccl.InvalidArgument, "%#x is not a live context of this plugin (finalized already, or never returned by init)", h)
	}
	return c, r, nil
}

func netFinalize(h uintptr) nccl.Result {
	_, r, err := lookupCtx(h)
	if err != nil {
		return fail("finalize", err)
	}
	if ctxs.Remove(r) == nil {
		return fail("finalize", nccl.Errorf(nccl.InvalidArgument, "context %#x finalized twice", h))
	}
	finalizeListens(h)
	if state.ctxRefs.Add(-1) > 0 {
		return nccl.Success
	}
	finalizeIfIdle()
	return nccl.Success
}

// finalizeListens closes the listen comms made under context h. NCCL closes
// a listen comm only after its accept succeeded: one whose connection set-up
// was aborted (ncclCommAbort, a peer that never connected) is never closed,
// and NCCL finalizes the communicator's context after freeing everything it
// will free. Left open, each would hold its socket (and, for ib, its
// handshake listener) for as long as another communicator keeps the
// transport up.
func finalizeListens(h uintptr) {
	n := 0
	comms.Range(func(r slots.Ref, e *commEntry) bool {
		if e.tag == tagListen && e.ctx == h && closeQuietly(e, r, "finalize") {
			n++
		}
		return true
	})
	if n > 0 {
		log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/Go : finalize closed %d listen comm(s) of its communicator that NCCL never accepted on (an aborted connection set-up)", n)
	}
}

func finalizeIfIdle() {
	state.mu.Lock()
	defer state.mu.Unlock()
	finalizeIfIdleLocked()
}

// finalizeIfIdleLocked ends the transport once no context and no comm is left
// (state.mu held exclusively, so no set-up call is inside the transport and no
// new context can appear). v8-v10 have no finalize: their transport lives as
// long as the process.
func finalizeIfIdleLocked() {
	if !state.ready || state.ctxRefs.Load() > 0 {
		return
	}
	if state.pinned.Load() {
		state.finalizePending.Store(false)
		log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/Go : last context finalized; transport %s stays for the v8-v10 API user in this process, which has no finalize", state.transport.Name())
		return
	}
	if state.neverUnloaded {
		state.finalizePending.Store(false)
		log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/Go : last context finalized; transport %s stays up: with NCCL_NET_PLUGIN_REF_COUNT > 0 NCCL keeps the plugin loaded and its devices (fused NICs included) for the next communicator", state.transport.Name())
		return
	}
	if n := comms.Len(); n > 0 {
		// ncclCommAbort may finalize before the service thread closed every
		// comm; the last close finishes the job.
		state.finalizePending.Store(true)
		log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/Go : last context finalized with %d comm(s) still open; transport %s ends when they are closed", n, state.transport.Name())
		return
	}
	endTransportLocked()
}

// restartLocked handles an init that finds the last context gone while comms
// were still open. With NCCL_NET_PLUGIN_REF_COUNT at 0 (NCCL 2.28+'s default)
// NCCL unloaded the plugin at that last finalize, and on this new load it
// calls devices and makes its fused NICs afresh: an old transport would
// report the previous load's fused NICs as physical. Listen comms left open
// belong to the previous load and no one will close them (NCCL closes a
// listen comm only after an accept on it succeeded; a v11+ context's own are
// closed at its finalize, so these are ones made without a context): close
// them, and if nothing else is open, start the transport afresh. Send and
// receive comms may still be in use by the previous communicators' threads
// (an abort that finalized before its service thread closed them): those
// keep the transport, and the INFO says the device list may be stale.
// state.mu is held exclusively, so no set-up call is inside the transport.
func restartLocked() {
	n := 0
	comms.Range(func(r slots.Ref, e *commEntry) bool {
		if e.tag == tagListen {
			if closeLeftListen(state.transport, e, r, closeCall(e.tag)) {
				n++
			}
		}
		return true
	})
	if left := comms.Len(); left > 0 {
		state.finalizePending.Store(false)
		log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/Go : init after the last finalize with %d comm(s) of the previous communicators still open: transport %s stays up until they close; if NCCL fused NICs, the device count it reads now may include the previous fused ones", left, state.transport.Name())
		return
	}
	log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/Go : init after the last finalize: closed %d listen comm(s) the previous communicators left open and restarting transport %s, as NCCL has loaded the plugin again", n, state.transport.Name())
	endTransportLocked()
}

// endTransportLocked finalizes the transport (state.mu held exclusively).
func endTransportLocked() {
	state.finalizePending.Store(false)
	// With counting off every figure would read 0: a NIC that carried the
	// whole job logged as having moved nothing.
	if state.countMetrics {
		for _, line := range metrics.Summary() {
			log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/Go : %s", line)
		}
	}
	metrics.Stop()
	if err := state.transport.Finalize(); err != nil {
		log.Warnf("NET/Go : transport %s finalize: %v", state.transport.Name(), err)
	}
	state.ready = false
	state.transport = nil
}

// loadDeviceInfo (re)reads every device's properties and metrics handle.
func loadDeviceInfo(t nccl.Transport) {
	devs.mu.Lock()
	defer devs.mu.Unlock()
	n := t.Devices()
	devs.metrics = make([]*metrics.Device, n)
	devs.props = make([]nccl.Properties, n)
	for d := 0; d < n; d++ {
		p, err := normalizedProperties(t, d)
		if err != nil {
			p = nccl.Properties{Name: fmt.Sprintf("dev%d", d), MaxRecvs: 1}
		}
		devs.props[d] = p
		devs.metrics[d] = metrics.ForDevice(t.Name(), p.Name, p.Port)
	}
}

func describeDevices() string {
	devs.mu.Lock()
	defer devs.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "%d device(s):", len(devs.props))
	for d, p := range devs.props {
		fmt.Fprintf(&b, " [%d]%s", d, p.Name)
		if p.Port != 0 {
			fmt.Fprintf(&b, ":%d", p.Port)
		}
		fmt.Fprintf(&b, " %dMbps", p.Speed)
	}
	return b.String()
}

// deviceInfo returns dev's counters and its largest grouped receive, reloading
// the cache when a virtual device appeared after init. The caller holds
// state.mu shared.
func deviceInfo(t nccl.Transport, dev int) (*metrics.Device, int) {
	devs.mu.Lock()
	stale := dev >= len(devs.metrics)
	devs.mu.Unlock()
	if stale {
		loadDeviceInfo(t)
	}
	devs.mu.Lock()
	defer devs.mu.Unlock()
	if dev < 0 || dev >= len(devs.metrics) {
		return metrics.ForDevice(t.Name(), fmt.Sprintf("dev%d", dev), 0), 1
	}
	return devs.metrics[dev], devs.props[dev].MaxRecvs
}

func netDevices() (int, nccl.Result) {
	t, err := acquire()
	if err != nil {
		return 0, fail("devices", err)
	}
	defer state.mu.RUnlock()
	return t.Devices(), nccl.Success
}

// checkDev validates a device index from NCCL.
func checkDev(t nccl.Transport, dev int) error {
	if n := t.Devices(); dev < 0 || dev >= n {
		return nccl.Errorf(nccl.InvalidArgument, "device %d out of range [0,%d)", dev, n)
	}
	return nil
}

// netProperties returns dev's properties with every field NCCL validates made
// valid.
func netProperties(dev int) (nccl.Properties, nccl.Result) {
	t, err := acquire()
	if err != nil {
		return nccl.Properties{}, fail("getProperties", err)
	}
	defer state.mu.RUnlock()
	if err := checkDev(t, dev); err != nil {
		return nccl.Properties{}, fail("getProperties", err)
	}
	p, err := normalizedProperties(t, dev)
	if err != nil {
		return nccl.Properties{}, fail("getProperties", err)
	}
	return p, nccl.Success
}

// normalizedProperties fills what NCCL validates: it rejects maxP2pBytes
// outside (0, 2^40] and treats maxRecvs < 1 as a broken plugin; the glue's
// ABI takes at most maxABIRecvs buffers in a grouped receive
// (nccl.Properties.WithDefaults, which the device diagnosis shares).
func normalizedProperties(t nccl.Transport, dev int) (nccl.Properties, error) {
	p, err := t.Properties(dev)
	if err != nil {
		return p, err
	}
	return p.WithDefaults(t.Name(), dev), nil
}

func netMakeVDevice(devList []int, maxDevs int) (int, nccl.Result) {
	t, err := acquire()
	if err != nil {
		return -1, fail("makeVDevice", err)
	}
	defer state.mu.RUnlock()
	if len(devList) < 1 || len(devList) > maxDevs {
		return -1, fail("makeVDevice", nccl.Errorf(nccl.InvalidUsage, "cannot fuse %d devices; this API version allows 1 to %d", len(devList), maxDevs))
	}
	members := 0
	for _, d := range devList {
		if err := checkDev(t, d); err != nil {
			return -1, fail("makeVDevice", err)
		}
		// A device may itself be fused: what this API version's vProps must
		// hold is every member, not the indices NCCL passed.
		p, err := normalizedProperties(t, d)
		if err != nil {
			return -1, fail("makeVDevice", err)
		}
		members += len(p.VDevs)
	}
	if members > maxDevs {
		return -1, fail("makeVDevice", nccl.Errorf(nccl.InvalidUsage, "devices %v have %d members together; this API version's fused NIC holds at most %d (NCCL_NET_MERGE_LEVEL, NCCL_NET_FORCE_MERGE)", devList, members, maxDevs))
	}
	vm, ok := t.(nccl.VDeviceMaker)
	if !ok {
		// NCCL 2.24-2.26 asks for single-device "fusions" too; the device itself
		// is the answer. Real fusion needs a transport that can stripe.
		if len(devList) == 1 {
			return devList[0], nccl.Success
		}
		return -1, fail("makeVDevice", nccl.Errorf(nccl.InvalidUsage, "transport %s cannot fuse devices; unset NCCL_NET_FORCE_MERGE or lower NCCL_NET_MERGE_LEVEL", t.Name()))
	}
	d, err := vm.MakeVDevice(devList)
	if err != nil {
		return -1, fail("makeVDevice", err)
	}
	return d, nccl.Success
}

// trafficClassOf resolves a v11+ context to its traffic class.
func trafficClassOf(ctx uintptr) (int, error) {
	if ctx == 0 {
		return nccl.TrafficClassUndef, nil
	}
	c, _, err := lookupCtx(ctx)
	if err != nil {
		return 0, err
	}
	return c.trafficClass, nil
}
