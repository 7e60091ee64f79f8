package softnic

import (
	"fmt"

	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
)

// context is an open device (ibv_context).
type context struct {
	dev    *Device
	events chan verbs.AsyncEvent
	closed chan struct{}
	cqs    map[uint64]*cq
	dmabuf bool
	done   bool
}

func (c *context) Name() string { return c.dev.cfg.Name }

func (c *context) QueryDevice() (verbs.DeviceAttr, error) {
	return verbs.DeviceAttr{MaxQP: c.dev.cfg.MaxQP, MaxQPWR: 32768, MaxCQE: 4194303,
		SysImageGUID: c.dev.cfg.GUID, PhysPortCnt: len(c.dev.ports), VendorID: 0x1af4}, nil
}

func (c *context) QueryPort(port int) (verbs.PortAttr, error) {
	f := c.dev.fabric
	f.mu.Lock()
	defer f.mu.Unlock()
	if port < 1 || port > len(c.dev.ports) {
		return verbs.PortAttr{}, fmt.Errorf("softnic: %s has no port %d: %w", c.dev.cfg.Name, port, verbs.EINVAL)
	}
	return c.dev.ports[port-1].attr, nil
}

func (c *context) QueryGID(port, index int) (verbs.GID, error) {
	f := c.dev.fabric
	f.mu.Lock()
	defer f.mu.Unlock()
	if port < 1 || port > len(c.dev.ports) || index < 0 || index >= len(c.dev.ports[port-1].gids) {
		return verbs.GID{}, fmt.Errorf("softnic: %s port %d has no GID %d: %w", c.dev.cfg.Name, port, index, verbs.EINVAL)
	}
	return c.dev.ports[port-1].gids[index].GID, nil
}

func (c *context) AllocPD() (verbs.PD, error) {
	f := c.dev.fabric
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	return &pd{ctx: c, id: f.nextID}, nil
}

func (c *context) CreateCQ(entries int) (verbs.CQ, error) {
	if entries < 1 || entries > 4194303 {
		return nil, fmt.Errorf("softnic: CQ of %d entries: %w", entries, verbs.EINVAL)
	}
	f := c.dev.fabric
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	q := &cq{ctx: c, id: f.nextID, ring: make([]cqe, entries)}
	c.cqs[q.id] = q
	return q, nil
}

func (c *context) NextAsyncEvent(stop <-chan struct{}) (verbs.AsyncEvent, error) {
	select {
	case ev := <-c.events:
		return ev, nil
	case <-c.closed:
		return verbs.AsyncEvent{}, verbs.ErrClosed
	case <-stop:
		return verbs.AsyncEvent{}, verbs.ErrClosed
	}
}

func (c *context) Close() error {
	f := c.dev.fabric
	f.mu.Lock()
	defer f.mu.Unlock()
	if c.done {
		return fmt.Errorf("softnic: %s context closed twice: %w", c.dev.cfg.Name, verbs.EINVAL)
	}
	c.done = true
	delete(c.dev.ctxs, c)
	close(c.closed)
	return nil
}

// pd is a protection domain; its memory-registration half is in mem_unsafe.go.
type pd struct {
	ctx  *context
	id   uint64
	gone bool
}

func (p *pd) Dealloc() error {
	f := p.ctx.dev.fabric
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range p.ctx.dev.mrs {
		if m.pd == p {
			return fmt.Errorf("softnic: PD still has MRs: %w", verbs.EINVAL) // EBUSY on hardware
		}
	}
	for _, q := range p.ctx.dev.qps {
		if q.pd == p {
			return fmt.Errorf("softnic: PD still has QPs: %w", verbs.EINVAL)
		}
	}
	p.gone = true
	return nil
}

func (p *pd) CreateQP(a verbs.QPInitAttr) (verbs.QP, error) {
	scq, ok1 := a.SendCQ.(*cq)
	rcq, ok2 := a.RecvCQ.(*cq)
	if !ok1 || !ok2 || a.MaxSendWR < 1 || a.MaxRecvWR < 0 || a.MaxSendWR > 32768 || a.MaxRecvWR > 32768 {
		return nil, fmt.Errorf("softnic: bad QP attributes %+v: %w", a, verbs.EINVAL)
	}
	f := p.ctx.dev.fabric
	f.mu.Lock()
	defer f.mu.Unlock()
	d := p.ctx.dev
	if len(d.qps) >= d.cfg.MaxQP {
		return nil, fmt.Errorf("softnic: %s has %d QPs (max_qp): %w", d.cfg.Name, len(d.qps), verbs.ENOMEM)
	}
	f.nextQPN++
	q := &qp{num: f.nextQPN, pd: p, dev: d, sendCQ: scq, recvCQ: rcq, maxSend: a.MaxSendWR,
		maxInline: a.MaxInline, rq: make([]verbs.RecvWR, max(a.MaxRecvWR, 1)), blocked: make([]verbs.SendWR, a.MaxSendWR)}
	d.qps[q.num] = q
	return q, nil
}
