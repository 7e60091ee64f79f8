package plugin

// NCCL's profiler (v10+) gets a start and a stop event per network request
// whose proxy step carries a profiler handle (phandle). The event descriptor
// is ncclGoProfilerNetDesc_v1 (docs/metrics.md): pluginId = profPluginID.
const (
	profSend  = 1
	profRecv  = 2
	profFlush = 3

	// profPluginID: upper 16 bits identify the plugin type (IB uses 1<<16 and
	// Socket 2<<16 in nccl_profiler.h); 0x47 ('G') is ours; lower 16 bits are
	// the descriptor version.
	profPluginID = 0x47<<16 | 1
)

// profiler is installed by the cgo layer when NCCL passed a profiler callback
// to init; nil otherwise (NCCL must never be called with a NULL callback).
type profilerHooks interface {
	start(phandle uintptr, typ int, dev int, size int64, tag int, reqHandle uintptr) (event uintptr)
	stop(event uintptr)
}

var profiler profilerHooks

func (e *commEntry) profStart(id int, r *reqState, phandle uintptr, typ int, size int64, tag int) {
	p := profiler
	if p == nil || r.events >= maxProfEvents {
		return
	}
	if e.events == nil {
		e.events = make([][maxProfEvents]uintptr, len(e.reqs))
	}
	ev := p.start(phandle, typ, e.dev, size, tag, e.requestHandle(0, false)|uintptr(id))
	if ev == 0 {
		return
	}
	e.events[id][r.events] = ev
	r.events++
}

func (e *commEntry) profStopAll(id int, r *reqState) {
	if r.events == 0 {
		return
	}
	p := profiler
	for i := int8(0); i < r.events; i++ {
		if p != nil {
			p.stop(e.events[id][i])
		}
		e.events[id][i] = 0
	}
	r.events = 0
}
