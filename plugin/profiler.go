package plugin

import "sync/atomic"

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

// profilerHooks calls NCCL's profiler callback (the cgo layer implements it).
type profilerHooks interface {
	start(phandle uintptr, typ int, dev int, size int64, tag int, reqHandle uintptr) (event uintptr)
	stop(event uintptr)
}

// profiler is the callback the latest init passed (v10+; NCCL passes the
// same one to every communicator's init). init runs on application threads
// while other communicators move data, so it is published atomically and each
// comm copies it once, at connect/accept; the data path reads the comm's copy.
var profiler atomic.Pointer[profilerHooks]

func setProfiler(p profilerHooks) { profiler.Store(&p) }

func currentProfiler() profilerHooks {
	if p := profiler.Load(); p != nil {
		return *p
	}
	return nil
}

func (e *commEntry) profStart(idx int, r *reqState, phandle uintptr, typ int, size int64, tag int) {
	if e.prof == nil || r.events >= maxProfEvents {
		return
	}
	ev := e.prof.start(phandle, typ, e.dev, size, tag, e.requestHandle(idx))
	if ev == 0 {
		return
	}
	e.events[idx][r.events] = ev
	r.events++
}

func (e *commEntry) profStopAll(idx int, r *reqState) {
	for i := int8(0); i < r.events; i++ {
		e.prof.stop(e.events[idx][i])
		e.events[idx][i] = 0
	}
	r.events = 0
}
