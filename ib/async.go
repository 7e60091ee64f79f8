package ib

import (
	"errors"
	"fmt"

	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

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
		if ev.Type == verbs.EventGIDChange {
			for _, d := range h.ports {
				if d.port == ev.Port {
					d.gidChanged() // the next connection scans the table again
				}
			}
		}
		switch ev.Type {
		case verbs.EventPortErr, verbs.EventPathMigErr:
			// Not fatal to the device, but the comms over the port will fail
			// with retry-exceeded completions: say why where NCCL_DEBUG=WARN
			// shows it, as NCCL does.
			t.log.Warnf("NET/GoIB : %s: async event %v (port %d): the link went down or lost its path; comms over it fail until it is back (check ibstat, cables, the switch)", h.name, ev.Type, ev.Port)
		default:
			t.log.Infof(nccl.SubsysNet, "NET/GoIB : %s: async event %v (port %d)", h.name, ev.Type, ev.Port)
		}
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
		if owner != nil && t.cfg.returnAsync {
			owner.setFatal(msg)
		}
	case verbs.EventCQErr:
		if v, ok := h.owners.Load(ev.CQID); ok {
			owner = v.(*commCore)
		}
		msg := fmt.Sprintf("%s: fatal async event %v (completion queue overrun)", h.name, ev.Type)
		t.log.Warnf("NET/GoIB : %s", msg)
		if owner != nil && t.cfg.returnAsync {
			owner.setFatal(msg)
		}
	default:
		msg := fmt.Sprintf("%s: fatal async event %v; the device is unusable until it is reset: check the NIC (ibv_devinfo, dmesg, firmware), "+
			"then restart the job (or leave the device out with NCCL_IB_HCA=^%s)", h.name, ev.Type, h.name)
		t.log.Warnf("NET/GoIB : %s", msg)
		// Store before walking the owners: a comm registering concurrently
		// either is in the walk or sees fatal in newCore's last check.
		if !h.fatal.CompareAndSwap(nil, &msg) {
			return // the first fatal event already failed everything
		}
		if !t.cfg.returnAsync {
			return
		}
		h.owners.Range(func(_, v any) bool {
			v.(*commCore).setFatal(msg)
			return true
		})
	}
}
