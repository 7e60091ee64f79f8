package softnic

import (
	"fmt"

	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
)

// context is an open device (ibv_context).
type context struct {
	dev       *Device
	events    chan verbs.AsyncEvent
	closed    chan struct{}
	cqs       map[uint64]*cq
	pds       map[*pd]struct{}
	dmabuf    bool
	portSpeed bool // the library has ibv_query_port_speed
	done      bool
}

func (c *context) Name() string { return c.dev.cfg.Name }

// aliveLocked refuses calls on a closed context.
func (c *context) aliveLocked(call string) error {
	if c.done {
		return c.dev.fabric.violationLocked("%s on %s after ibv_close_device", call, c.dev.cfg.Name)
	}
	if c.dev.dead && !releases(call) {
		return fmt.Errorf("softnic: %s on %s after a fatal device error: %w", call, c.dev.cfg.Name, verbs.Errno(5))
	}
	return nil
}

// releases reports the calls a dead device still serves: freeing what was
// allocated on it.
func releases(call string) bool {
	switch call {
	case "ibv_close_device", "ibv_dealloc_pd", "ibv_dereg_mr", "ibv_destroy_cq", "ibv_destroy_qp":
		return true
	}
	return false
}

func (c *context) QueryDevice() (verbs.DeviceAttr, error) {
	f := c.dev.fabric
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := c.aliveLocked("ibv_query_device"); err != nil {
		return verbs.DeviceAttr{}, err
	}
	return verbs.DeviceAttr{MaxQP: c.dev.cfg.MaxQP, MaxQPWR: 32768, MaxCQE: 4194303,
		SysImageGUID: c.dev.cfg.GUID, PhysPortCnt: len(c.dev.ports), VendorID: 0x1af4}, nil
}

func (c *context) QueryPort(port int) (verbs.PortAttr, error) {
	f := c.dev.fabric
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := c.aliveLocked("ibv_query_port"); err != nil {
		return verbs.PortAttr{}, err
	}
	if port < 1 || port > len(c.dev.ports) {
		return verbs.PortAttr{}, fmt.Errorf("softnic: %s has no port %d: %w", c.dev.cfg.Name, port, verbs.EINVAL)
	}
	return c.dev.ports[port-1].attr, nil
}

func (c *context) QueryPortSpeed(port int) (int64, error) {
	f := c.dev.fabric
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := c.aliveLocked("ibv_query_port_speed"); err != nil {
		return 0, err
	}
	switch {
	case !c.portSpeed:
		return 0, fmt.Errorf("softnic: no ibv_query_port_speed in this library: %w", verbs.EOPNOTSUPP)
	case port < 1 || port > len(c.dev.ports):
		return 0, fmt.Errorf("softnic: %s has no port %d: %w", c.dev.cfg.Name, port, verbs.EINVAL)
	case c.dev.cfg.PortSpeedErr != nil:
		return 0, fmt.Errorf("ibv_query_port_speed: %w", c.dev.cfg.PortSpeedErr)
	}
	return c.dev.cfg.EffectiveSpeed, nil
}

func (c *context) QueryGID(port, index int) (verbs.GID, error) {
	f := c.dev.fabric
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := c.aliveLocked("ibv_query_gid"); err != nil {
		return verbs.GID{}, err
	}
	if port < 1 || port > len(c.dev.ports) || index < 0 || index >= len(c.dev.ports[port-1].gids) {
		return verbs.GID{}, fmt.Errorf("softnic: %s port %d has no GID %d: %w", c.dev.cfg.Name, port, index, verbs.EINVAL)
	}
	return c.dev.ports[port-1].gids[index].GID, nil
}

func (c *context) AllocPD() (verbs.PD, error) {
	f := c.dev.fabric
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := c.aliveLocked("ibv_alloc_pd"); err != nil {
		return nil, err
	}
	f.nextID++
	p := &pd{ctx: c, id: f.nextID}
	c.pds[p] = struct{}{}
	return p, nil
}

func (c *context) CreateCQ(entries int) (verbs.CQ, error) {
	f := c.dev.fabric
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := c.aliveLocked("ibv_create_cq"); err != nil {
		return nil, err
	}
	if err := f.callFaultLocked(c.dev.cfg.Name, "ibv_create_cq"); err != nil {
		return nil, err
	}
	if entries < 1 || entries > 4194303 {
		return nil, fmt.Errorf("softnic: CQ of %d entries: %w", entries, verbs.EINVAL)
	}
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

// Close closes the context. Objects still alive are a leak (the kernel would
// reclaim them, but whoever holds them now holds freed memory): it is
// recorded as a violation.
func (c *context) Close() error {
	f := c.dev.fabric
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := c.aliveLocked("ibv_close_device"); err != nil {
		return err
	}
	if len(c.pds) > 0 || len(c.cqs) > 0 {
		_ = f.violationLocked("ibv_close_device on %s with %d PD(s) and %d CQ(s) still allocated", c.dev.cfg.Name, len(c.pds), len(c.cqs))
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

func (p *pd) aliveLocked(call string) error {
	if err := p.ctx.aliveLocked(call); err != nil {
		return err
	}
	if p.gone {
		return p.ctx.dev.fabric.violationLocked("%s on a deallocated PD of %s", call, p.ctx.dev.cfg.Name)
	}
	return nil
}

// Dealloc fails with EBUSY (as the kernel does) while MRs or QPs of the PD
// are alive; that leak is recorded as a violation too.
func (p *pd) Dealloc() error {
	f := p.ctx.dev.fabric
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := p.aliveLocked("ibv_dealloc_pd"); err != nil {
		return err
	}
	nmr, nqp := 0, 0
	for _, m := range p.ctx.dev.mrs {
		if m.pd == p {
			nmr++
		}
	}
	for _, q := range p.ctx.dev.qps {
		if q.pd == p {
			nqp++
		}
	}
	if nmr+nqp > 0 {
		_ = f.violationLocked("ibv_dealloc_pd on %s with %d MR(s) and %d QP(s) still alive", p.ctx.dev.cfg.Name, nmr, nqp)
		return fmt.Errorf("softnic: PD still has %d MRs and %d QPs: %w", nmr, nqp, verbs.Errno(16)) // EBUSY
	}
	p.gone = true
	delete(p.ctx.pds, p)
	return nil
}

func (p *pd) CreateQP(a verbs.QPInitAttr) (verbs.QP, error) {
	scq, ok1 := a.SendCQ.(*cq)
	rcq, ok2 := a.RecvCQ.(*cq)
	if !ok1 || !ok2 || a.MaxSendWR < 1 || a.MaxRecvWR < 0 || a.MaxSendWR > 32768 || a.MaxRecvWR > 32768 || a.MaxInline < 0 || a.MaxInline > maxInline {
		return nil, fmt.Errorf("softnic: bad QP attributes %+v: %w", a, verbs.EINVAL)
	}
	f := p.ctx.dev.fabric
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := p.aliveLocked("ibv_create_qp"); err != nil {
		return nil, err
	}
	for _, c := range []*cq{scq, rcq} {
		if err := c.aliveLocked("ibv_create_qp"); err != nil {
			return nil, err
		}
	}
	d := p.ctx.dev
	if err := f.callFaultLocked(d.cfg.Name, "ibv_create_qp"); err != nil {
		return nil, err
	}
	if len(d.qps) >= d.cfg.MaxQP {
		return nil, fmt.Errorf("softnic: %s has %d QPs (max_qp): %w", d.cfg.Name, len(d.qps), verbs.ENOMEM)
	}
	f.nextQPN++
	q := &qp{num: f.nextQPN, pd: p, dev: d, sendCQ: scq, recvCQ: rcq, maxSend: a.MaxSendWR,
		maxInline: a.MaxInline, rq: make([]verbs.RecvWR, max(a.MaxRecvWR, 1)), blocked: make([]blockedWR, a.MaxSendWR)}
	if a.MaxInline > 0 {
		for i := range q.blocked {
			q.blocked[i].inline = make([]byte, a.MaxInline)
		}
	}
	d.qps[q.num] = q
	return q, nil
}
