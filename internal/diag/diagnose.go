package diag

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Explainer is implemented by transports that can say more about their
// discovery than nccl.Properties does. Diagnose calls Explain after the
// transport's Init, whether it succeeded (initErr nil) or not, and before
// Finalize. Explain adds its facts to d.Devices (already filled from
// Properties, indexed as NCCL sees them) and fills d.Ports, d.Interfaces,
// d.Handshake and d.Notes. It must not fail: what it cannot find out it
// leaves out.
type Explainer interface {
	Explain(d *Transport, initErr error)
}

// Options tune Diagnose; the zero value reads the host as the plugin would.
type Options struct {
	// SysfsRoot is where PCI NUMA nodes are read for fusion ("" = /sys).
	SysfsRoot string
}

// Diagnose runs every registered transport's discovery as the plugin's init
// would (regs in the order the plugin tries them, NCCL_GO_TRANSPORT
// honoured), explains each, replays NCCL's NIC fusion on the usable ones, and
// finalizes them again. Settings are read through ncclenv.Lookup, so the
// caller decides what environment the plugin would see.
func Diagnose(regs []nccl.Registration, o Options) Report {
	if o.SysfsRoot == "" {
		o.SysfsRoot = "/sys"
	}
	var r Report
	for _, reg := range regs {
		r.Transports = append(r.Transports, survey(reg, o))
	}
	decide(&r, regs)
	return r
}

// decide is the glue's chooseTransport over the surveyed transports.
func decide(r *Report, regs []nccl.Registration) {
	names := make([]string, len(regs))
	for i, reg := range regs {
		names[i] = reg.Name
	}
	if len(regs) == 0 {
		r.InitError = "no transport is registered in this plugin build"
		r.Why = r.InitError
		return
	}
	r.Forced, _ = ncclenv.Value("NCCL_GO_TRANSPORT") // declared by plugin/config.go
	if r.Forced != "" {
		found := false
		for i := range r.Transports {
			t := &r.Transports[i]
			if !strings.EqualFold(t.Name, r.Forced) { // as nccl.Lookup, which the glue uses
				t.Reason = join(t.Reason, "not tried: NCCL_GO_TRANSPORT="+r.Forced)
				continue
			}
			found = true
			t.Tried = true
			if t.Usable {
				t.Selected = true
				r.Transport = t.Name
				r.Why = "NCCL_GO_TRANSPORT=" + r.Forced
			} else {
				r.InitError = fmt.Sprintf("no usable transport (%s: %s)", t.Name, t.Reason)
				r.Why = "NCCL_GO_TRANSPORT=" + r.Forced + " names a transport that is not usable here, so init fails (no fallback when the transport is forced)"
			}
		}
		if !found {
			r.InitError = fmt.Sprintf("NCCL_GO_TRANSPORT=%s names no transport of this plugin; use one of %s or unset it", r.Forced, strings.Join(names, ", "))
			r.Why = "init fails: " + r.InitError
		}
		return
	}
	var skipped, reasons []string
	for i := range r.Transports {
		t := &r.Transports[i]
		if r.Transport != "" {
			t.Reason = join(t.Reason, "not tried: the plugin uses "+r.Transport+", which comes first")
			continue
		}
		t.Tried = true
		if t.Usable {
			t.Selected = true
			r.Transport = t.Name
			continue
		}
		skipped = append(skipped, t.Name)
		reasons = append(reasons, t.Name+": "+t.Reason)
	}
	switch {
	case r.Transport == "":
		r.InitError = "no usable transport (" + strings.Join(reasons, "; ") + ")"
		r.Why = "init fails: no transport has a usable device"
	case len(skipped) == 0:
		r.Why = r.Transport + " is the first transport in priority order and is usable"
	default:
		r.Why = fmt.Sprintf("%s %s tried first and not usable, so the plugin falls back to %s", strings.Join(skipped, ", "),
			map[bool]string{true: "is", false: "are"}[len(skipped) == 1], r.Transport)
	}
}

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// survey runs one transport's discovery.
func survey(reg nccl.Registration, o Options) (d Transport) {
	d = Transport{Name: reg.Name, Priority: reg.Priority}
	lg := &captureLog{}
	defer func() {
		// A transport's bug must not take the report down with it.
		if p := recover(); p != nil {
			d.Usable = false
			d.Reason = join(d.Reason, fmt.Sprintf("discovery panicked: %v", p))
		}
		d.Log = lg.lines
	}()
	t := reg.New()
	err := t.Init(nccl.InitContext{Log: lg})
	if err == nil && t.Devices() <= 0 {
		err = fmt.Errorf("%w: transport reported 0 devices", nccl.ErrNoDevice)
		if ex, ok := t.(Explainer); ok {
			ex.Explain(&d, err)
		}
		_ = t.Finalize()
		d.Reason = err.Error()
		return d
	}
	if err != nil {
		d.Reason = err.Error()
		d.ConfigError = !errors.Is(err, nccl.ErrNoDevice)
		if ex, ok := t.(Explainer); ok {
			ex.Explain(&d, err)
		}
		return d
	}
	defer func() {
		if ferr := t.Finalize(); ferr != nil {
			d.Notes = append(d.Notes, "finalize: "+ferr.Error())
		}
	}()
	d.Usable = true
	for i := 0; i < t.Devices(); i++ {
		p, perr := t.Properties(i)
		if perr != nil {
			d.Notes = append(d.Notes, fmt.Sprintf("getProperties(%d): %v", i, perr))
			continue
		}
		d.Devices = append(d.Devices, FromProperties(i, p.WithDefaults(t.Name(), i)))
	}
	if ex, ok := t.(Explainer); ok {
		ex.Explain(&d, nil)
	}
	fusion, vnics := PredictVNICs(t, d.Devices, o.SysfsRoot)
	d.Fusion = fusion
	d.Devices = append(d.Devices, vnics...)
	return d
}

// FromProperties describes device idx as getProperties reports it, with the
// defaults the glue fills in for NCCL.
func FromProperties(idx int, p nccl.Properties) Device {
	d := Device{Index: idx, Name: p.Name, Port: p.Port, SpeedMbps: p.Speed, PCIPath: p.PCIPath,
		GUID: fmt.Sprintf("0x%016x", p.GUID), MaxComms: p.MaxComms, MaxRecvs: p.MaxRecvs}
	if d.SpeedMbps <= 0 {
		d.SpeedMbps = 10000 // the glue's default, as NCCL sees it
	}
	pt := p.PtrSupport
	if pt == 0 {
		pt = nccl.PtrHost
	}
	for _, k := range []struct {
		bit  nccl.PtrType
		name string
	}{{nccl.PtrHost, "host"}, {nccl.PtrCUDA, "cuda"}, {nccl.PtrDMABuf, "dmabuf"}} {
		if pt&k.bit != 0 {
			d.Memory = append(d.Memory, k.name)
		}
	}
	if r, ok := p.RailID.Get(); ok {
		d.RailID = &r
	}
	if len(p.VDevs) > 1 || len(p.VDevs) == 1 && p.VDevs[0] != idx {
		d.Members = append([]int(nil), p.VDevs...)
	}
	return d
}

// captureLog records what a transport logs, in the form NCCL would print it.
type captureLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *captureLog) add(level, format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, level+" "+fmt.Sprintf(format, args...))
}

func (l *captureLog) Warnf(format string, args ...any)                 { l.add("WARN", format, args...) }
func (l *captureLog) Infof(_ nccl.Subsys, format string, args ...any)  { l.add("INFO", format, args...) }
func (l *captureLog) Tracef(_ nccl.Subsys, format string, args ...any) {}
