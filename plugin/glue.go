package plugin

import (
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/metrics"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// maxABIRecvs bounds n in a grouped irecv at the ABI: NCCL's proxy groups at
// most NCCL_PROXY_MAX_SUBS (64) receives and never more than maxRecvs.
const maxABIRecvs = 64

// state is the process-wide plugin state. NCCL may call init/listen/connect from
// several application and service threads at once; mu serialises set-up and
// teardown, never the data path.
var state struct {
	mu         sync.Mutex
	ready      bool
	transport  nccl.Transport
	apiVersion int
	ctxRefs    int // v11+ contexts alive
	devMetrics []*metrics.Device
	devProps   []nccl.Properties
}

// netCtx is what v11+ init returns per communicator: the comm config, which v11
// moved from connect to init.
type netCtx struct {
	trafficClass int
}

var (
	ctxs  slotTable[netCtx]
	comms slotTable[commEntry]
)

const tagCtx = 0x43 // 'C'

// errNotReady is what every call before a successful init gets.
var errNotReady = nccl.Errorf(nccl.InternalError, "NET/Go : plugin used before init succeeded")

// recoverResult turns a panic inside an exported entry into ncclInternalError
// with a WARN: a Go panic must never unwind into NCCL's C frames.
func recoverResult(entry string, res *nccl.Result) {
	if r := recover(); r != nil {
		log.Warnf("NET/Go : internal error in %s: %v; please report this with the stack below\n%s", entry, r, debug.Stack())
		*res = nccl.InternalError
	}
}

// fail logs err (a WARN naming the call) and returns its result code.
func fail(call string, err error) nccl.Result {
	res := nccl.ResultOf(err)
	log.Warnf("NET/Go : %s failed: %v (%v)", call, err, res)
	return res
}

// chooseTransport runs with state.mu held.
func chooseTransport() (nccl.Transport, error) {
	regs := nccl.Transports()
	if len(regs) == 0 {
		return nil, nccl.Errorf(nccl.InternalError, "no transport is registered in this plugin build")
	}
	if want := nccl.EnvString("NCCL_GO_TRANSPORT", ""); want != "" {
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

// netInit is init for every API version. withCtx is true for v11+, which get a
// per-communicator context back and call finalize for each.
func netInit(version int, withCtx bool, trafficClass int) (ctx uintptr, res nccl.Result) {
	state.mu.Lock()
	defer state.mu.Unlock()
	if !state.ready {
		readDebugLevel()
		t, err := chooseTransport()
		if err != nil {
			return 0, fail("init", err)
		}
		state.transport = t
		state.apiVersion = version
		state.ready = true
		countMetrics = nccl.EnvBool(log, "NCCL_GO_METRICS", true)
		readStallSettings()
		loadDeviceInfoLocked()
		metrics.Start(log, metrics.Info{PluginVersion: Version, APIVersion: fmt.Sprintf("v%d", version), Transport: t.Name()})
		log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/Go : libnccl-net-go %s, NCCL net API v%d, transport %s, %s",
			Version, version, t.Name(), describeDevicesLocked())
	}
	if !withCtx {
		return 0, nccl.Success
	}
	slot, gen, ok := ctxs.add(&netCtx{trafficClass: trafficClass})
	if !ok {
		return 0, fail("init", nccl.Errorf(nccl.InternalError, "too many communicators (%d) hold a plugin context", maxSlots))
	}
	state.ctxRefs++
	return commHandle(tagCtx, gen, slot), nccl.Success
}

func loadDeviceInfoLocked() {
	n := state.transport.Devices()
	state.devMetrics = make([]*metrics.Device, n)
	state.devProps = make([]nccl.Properties, n)
	for d := 0; d < n; d++ {
		p, err := state.transport.Properties(d)
		if err != nil {
			p = nccl.Properties{Name: fmt.Sprintf("dev%d", d)}
		}
		state.devProps[d] = p
		state.devMetrics[d] = metrics.ForDevice(state.transport.Name(), p.Name, p.Port)
	}
}

func describeDevicesLocked() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d device(s):", len(state.devProps))
	for d, p := range state.devProps {
		fmt.Fprintf(&b, " [%d]%s", d, p.Name)
		if p.Port != 0 {
			fmt.Fprintf(&b, ":%d", p.Port)
		}
		fmt.Fprintf(&b, " %dMbps", p.Speed)
	}
	return b.String()
}

// deviceMetrics returns the counters of dev, growing the table when a virtual
// device appeared after init.
func deviceMetrics(dev int) *metrics.Device {
	state.mu.Lock()
	defer state.mu.Unlock()
	if !state.ready {
		return metrics.ForDevice("none", fmt.Sprintf("dev%d", dev), 0)
	}
	if dev >= len(state.devMetrics) {
		loadDeviceInfoLocked()
	}
	if dev < 0 || dev >= len(state.devMetrics) {
		return metrics.ForDevice(state.transport.Name(), fmt.Sprintf("dev%d", dev), 0)
	}
	return state.devMetrics[dev]
}

func netFinalize(ctx uintptr) (res nccl.Result) {
	tag, gen, slot := splitCommHandle(ctx)
	c := ctxs.get(slot)
	if tag != tagCtx || c == nil || uint32(gen) == 0 {
		return fail("finalize", nccl.Errorf(nccl.InternalError, "finalize got an unknown context %#x", ctx))
	}
	if !ctxs.remove(slot, c) {
		return fail("finalize", nccl.Errorf(nccl.InternalError, "context %#x finalized twice", ctx))
	}
	state.mu.Lock()
	defer state.mu.Unlock()
	state.ctxRefs--
	if state.ctxRefs > 0 || !state.ready {
		return nccl.Success
	}
	for _, line := range metrics.Summary() {
		log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/Go : %s", line)
	}
	if n := comms.count(); n > 0 {
		// NCCL 2.28+ may dlclose us after this; with comms still open the
		// transport must live on (a Go library is never really unloaded).
		log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/Go : last context finalized with %d comm(s) still open; keeping transport %s", n, state.transport.Name())
		return nccl.Success
	}
	metrics.Stop()
	if err := state.transport.Finalize(); err != nil {
		log.Warnf("NET/Go : transport %s finalize: %v", state.transport.Name(), err)
	}
	state.ready = false
	state.transport = nil
	return nccl.Success
}

func readyTransport() (nccl.Transport, error) {
	state.mu.Lock()
	defer state.mu.Unlock()
	if !state.ready {
		return nil, errNotReady
	}
	return state.transport, nil
}

func netDevices() (int, nccl.Result) {
	t, err := readyTransport()
	if err != nil {
		return 0, fail("devices", err)
	}
	return t.Devices(), nccl.Success
}

// netProperties returns dev's properties with every field NCCL validates made
// valid: NCCL rejects maxP2pBytes outside (0, 2^40] and treats maxRecvs < 1 as
// a broken plugin.
func netProperties(dev int) (nccl.Properties, nccl.Result) {
	t, err := readyTransport()
	if err != nil {
		return nccl.Properties{}, fail("getProperties", err)
	}
	if dev < 0 || dev >= t.Devices() {
		return nccl.Properties{}, fail("getProperties", nccl.Errorf(nccl.InvalidArgument, "device %d out of range [0,%d)", dev, t.Devices()))
	}
	p, err := t.Properties(dev)
	if err != nil {
		return nccl.Properties{}, fail("getProperties", err)
	}
	if p.Name == "" {
		p.Name = fmt.Sprintf("%s%d", t.Name(), dev)
	}
	if p.MaxP2PBytes <= 0 || p.MaxP2PBytes > nccl.MaxNetSizeBytes {
		p.MaxP2PBytes = nccl.MaxNetSizeBytes
	}
	if p.MaxCollBytes <= 0 || p.MaxCollBytes > nccl.MaxNetSizeBytes {
		p.MaxCollBytes = nccl.MaxCollSize
	}
	if p.MaxMultiRequestSize < 1 {
		p.MaxMultiRequestSize = 1
	}
	if p.MaxRecvs < 1 {
		p.MaxRecvs = 1
	}
	if p.MaxComms < 1 {
		p.MaxComms = 1
	}
	if p.Speed <= 0 {
		p.Speed = 10000
	}
	if p.PtrSupport == 0 {
		p.PtrSupport = nccl.PtrHost
	}
	if len(p.VDevs) == 0 {
		p.VDevs = []int{dev}
	}
	return p, nccl.Success
}

func netMakeVDevice(devs []int, maxDevs int) (int, nccl.Result) {
	t, err := readyTransport()
	if err != nil {
		return -1, fail("makeVDevice", err)
	}
	if len(devs) < 1 || len(devs) > maxDevs {
		return -1, fail("makeVDevice", nccl.Errorf(nccl.InvalidUsage, "cannot fuse %d devices; this API version allows 1 to %d", len(devs), maxDevs))
	}
	n := t.Devices()
	for _, d := range devs {
		if d < 0 || d >= n {
			return -1, fail("makeVDevice", nccl.Errorf(nccl.InvalidArgument, "device %d out of range [0,%d)", d, n))
		}
	}
	vm, ok := t.(nccl.VDeviceMaker)
	if !ok {
		// NCCL 2.24-2.26 asks for single-device "fusions" too; the device itself
		// is the answer. Real fusion needs a transport that can stripe.
		if len(devs) == 1 {
			return devs[0], nccl.Success
		}
		return -1, fail("makeVDevice", nccl.Errorf(nccl.InvalidUsage, "transport %s cannot fuse devices; unset NCCL_NET_FORCE_MERGE or lower NCCL_NET_MERGE_LEVEL", t.Name()))
	}
	d, err := vm.MakeVDevice(devs)
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
	tag, gen, slot := splitCommHandle(ctx)
	c := ctxs.get(slot)
	if tag != tagCtx || c == nil || gen == 0 {
		return 0, nccl.Errorf(nccl.InternalError, "unknown plugin context %#x", ctx)
	}
	return c.trafficClass, nil
}

func netListen(dev int, handle *nccl.Handle) (uintptr, nccl.Result) {
	t, err := readyTransport()
	if err != nil {
		return 0, fail("listen", err)
	}
	if dev < 0 || dev >= t.Devices() {
		return 0, fail("listen", nccl.Errorf(nccl.InvalidArgument, "device %d out of range [0,%d)", dev, t.Devices()))
	}
	l, err := t.Listen(dev, handle)
	if err != nil {
		return 0, fail("listen", err)
	}
	e := &commEntry{tag: tagListen, dev: dev, listener: l}
	h, err := e.register()
	if err != nil {
		_ = l.Close()
		return 0, fail("listen", err)
	}
	return h, nccl.Success
}

func netConnect(dev int, trafficClass int, handle *nccl.Handle) (uintptr, nccl.Result) {
	t, err := readyTransport()
	if err != nil {
		return 0, fail("connect", err)
	}
	if dev < 0 || dev >= t.Devices() {
		return 0, fail("connect", nccl.Errorf(nccl.InvalidArgument, "device %d out of range [0,%d)", dev, t.Devices()))
	}
	sc, err := t.Connect(dev, handle, nccl.ConnectOptions{TrafficClass: trafficClass})
	if err != nil {
		deviceMetrics(dev).CallFailed(metrics.Send, metrics.KindOf(nccl.ResultOf(err)))
		return 0, fail("connect", err)
	}
	if sc == nil {
		return 0, nccl.Success // not ready; NCCL calls again with the same handle
	}
	e := newDataEntry(tagSend, dev)
	e.send = sc
	e.comm = sc
	h, err := e.register()
	if err != nil {
		_ = sc.Close()
		return 0, fail("connect", err)
	}
	e.m.ConnOpened(metrics.Send)
	return h, nccl.Success
}

func netAccept(listenH uintptr) (uintptr, nccl.Result) {
	l, err := lookup(listenH, tagListen)
	if err != nil {
		return 0, fail("accept", err)
	}
	rc, err := l.listener.Accept()
	if err != nil {
		deviceMetrics(l.dev).CallFailed(metrics.Recv, metrics.KindOf(nccl.ResultOf(err)))
		return 0, fail("accept", err)
	}
	if rc == nil {
		return 0, nccl.Success
	}
	e := newDataEntry(tagRecv, l.dev)
	e.recv = rc
	e.comm = rc
	h, err := e.register()
	if err != nil {
		_ = rc.Close()
		return 0, fail("accept", err)
	}
	e.m.ConnOpened(metrics.Recv)
	return h, nccl.Success
}

// closeTimeout bounds how long close waits for a transport's Close: NCCL calls
// close during ncclCommAbort, where a hang would hang the application.
var closeTimeout = 10 * time.Second

func netClose(h uintptr, tag uint8) nccl.Result {
	call := map[uint8]string{tagSend: "closeSend", tagRecv: "closeRecv", tagListen: "closeListen"}[tag]
	e, err := lookup(h, tag)
	if err != nil {
		return fail(call, err)
	}
	if !comms.remove(e.slot, e) {
		return fail(call, nccl.Errorf(nccl.InternalError, "%s: handle %#x closed twice", call, h))
	}
	var closer interface{ Close() error } = e.listener
	if tag != tagListen {
		closer = e.comm
		e.abandonRequests()
		dir := metrics.Send
		if tag == tagRecv {
			dir = metrics.Recv
		}
		e.m.ConnClosed(dir)
	}
	done := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Errorf("panic in Close: %v", r)
			}
		}()
		done <- closer.Close()
	}()
	select {
	case err := <-done:
		if err != nil {
			log.Warnf("NET/Go : %s: %v", call, err)
		}
	case <-time.After(closeTimeout):
		log.Warnf("NET/Go : %s: transport did not close within %v; continuing without waiting", call, closeTimeout)
	}
	return nccl.Success
}
