package ib

import (
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/internal/reqpool"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// flusher is the GPU-direct flush of a receive comm: per member device an RC
// QP connected to itself, through which a 1-byte RDMA READ of the last
// received buffer makes the NIC finish placing the data written before it.
type flusher struct {
	enabled bool
	qps     []verbs.QP
	mem     *hostMem // the READ's 1-byte landing place
	reqs    *reqpool.Pool[flushReq]
}

type flushReq struct {
	pending int
}

// setup creates the flush QPs. tc and sl are the sender's, as NCCL gives its
// flush QP the remote meta's: on a fabric where SL 0 is not usable on the
// port the READ would fail while the data, on the configured SL, flows.
func (f *flusher) setup(c *commCore, tc, sl int) error {
	var err error
	if f.mem, err = newHostMem(int(pageSize)); err != nil {
		return nccl.Errorf(nccl.SystemError, "NET/GoIB : flush buffer: %w", err)
	}
	devs := make([]*device, len(c.devs))
	for i := range c.devs {
		devs[i] = c.devs[i].device
	}
	if err := f.mem.register(devs, verbs.AccessLocalWrite); err != nil {
		return nccl.Errorf(nccl.SystemError, "NET/GoIB : flush buffer: %w", err)
	}
	for i := range c.devs {
		d := &c.devs[i]
		qp, err := d.hca.pd.CreateQP(verbs.QPInitAttr{SendCQ: c.cqs[i], RecvCQ: c.cqs[i], MaxSendWR: maxRequests, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1})
		if err != nil {
			return nccl.Errorf(nccl.SystemError, "NET/GoIB : flush QP on %s: %w", d.device, err)
		}
		f.qps = append(f.qps, qp)
		d.hca.owners.Store(qp.Num(), c)
		ah := verbs.AH{Port: d.port, SL: uint8(sl)}
		if d.attr.LinkLayer == verbs.LinkEthernet || d.attr.Flags&verbs.PortGRHRequired != 0 {
			ah.IsGlobal, ah.DGID, ah.SGIDIndex, ah.HopLimit = true, d.gid, d.gidIndex, 255
		}
		if d.attr.LinkLayer == verbs.LinkEthernet {
			ah.TrafficClass = uint8(tc)
		}
		if d.attr.LinkLayer != verbs.LinkEthernet {
			ah.DLID = d.attr.LID
		}
		init := verbs.InitAttr{PKeyIndex: c.cfg.pkey, Port: d.port, Access: verbs.AccessLocalWrite | verbs.AccessRemoteRead}
		if err := c.modifyQP("flush QP INIT on "+d.device.String(), func() error { return qp.ModifyToInit(init) }); err != nil {
			return nccl.Errorf(nccl.SystemError, "NET/GoIB : flush QP INIT on %s: %w", d.device, err)
		}
		rtr := verbs.RTRAttr{PathMTU: d.attr.ActiveMTU, DestQPN: qp.Num(), MaxDestRdAtomic: 1, MinRNRTimer: 12, AH: ah}
		if err := c.modifyQP("flush QP RTR on "+d.device.String(), func() error { return qp.ModifyToRTR(rtr) }); err != nil {
			return nccl.Errorf(nccl.SystemError, "NET/GoIB : flush QP RTR on %s: %w", d.device, err)
		}
		rts := verbs.RTSAttr{Timeout: c.cfg.ackTimeout, RetryCnt: c.cfg.retryCnt, RNRRetry: 7, MaxRdAtom: 1}
		if err := c.modifyQP("flush QP RTS on "+d.device.String(), func() error { return qp.ModifyToRTS(rts) }); err != nil {
			return nccl.Errorf(nccl.SystemError, "NET/GoIB : flush QP RTS on %s: %w", d.device, err)
		}
	}
	f.reqs = reqpool.New[flushReq](maxRequests)
	f.enabled = true
	return nil
}

func (f *flusher) destroy(c *commCore) {
	for i, qp := range f.qps {
		c.devs[i].hca.owners.Delete(qp.Num())
		if err := qp.Destroy(); err != nil {
			c.log.Warnf("NET/GoIB : ibv_destroy_qp (flush): %v", err)
		}
	}
	f.qps = nil
	f.enabled = false
}

// Iflush issues a 1-byte RDMA READ of the last non-empty buffer on every
// member device through the loopback QP. It returns NoRequest when flush is
// disabled or nothing was received (NCCL counts that as done).
func (c *recvComm) Iflush(bufs []nccl.RecvBuffer) (nccl.Request, error) {
	if err := c.check(); err != nil {
		return nccl.NoRequest, err
	}
	f := &c.flush
	if !f.enabled {
		return nccl.NoRequest, nil
	}
	last := -1
	for i := range bufs {
		if bufs[i].Size > 0 {
			last = i
		}
	}
	if last < 0 {
		return nccl.NoRequest, nil
	}
	h := lookupMR(bufs[last].MH)
	if h == nil || h.n != len(c.devs) {
		return nccl.NoRequest, nccl.Errorf(nccl.InvalidArgument, "NET/GoIB : iflush buffer %d has invalid memory handle %#x", last, uintptr(bufs[last].MH))
	}
	// The READ names this byte with the handle's rkey: outside the
	// registration it would fail on the loopback QP and take the whole
	// receive comm down with an error blaming the peer.
	if addr := uint64(uintptr(bufs[last].Data)); !h.covers(addr, 1) {
		return nccl.NoRequest, nccl.Errorf(nccl.InvalidArgument, "NET/GoIB : iflush buffer %d at %#x lies outside its registration", last, addr)
	}
	id, req, ok := f.reqs.Get()
	if !ok {
		// Not NoRequest: a NULL flush request tells NCCL there was nothing
		// to flush. NCCL never has this many flushes outstanding.
		return nccl.NoRequest, nccl.Errorf(nccl.InternalError, "NET/GoIB : more than %d flushes in flight", maxRequests)
	}
	req.pending = len(c.devs)
	for d, qp := range f.qps {
		c.swr[0] = verbs.SendWR{WRID: wrFlush | uint64(id), Opcode: verbs.WrRDMARead, Flags: verbs.SendSignaled, NumSGE: 1,
			SGE:        verbs.SGE{Addr: f.mem.addr(), Length: 1, LKey: f.mem.lkeys[d]},
			RemoteAddr: uint64(uintptr(bufs[last].Data)), RKey: h.rkeys[d]}
		if _, err := qp.PostSend(c.swr[:]); err != nil {
			// NCCL never tests a request it was not given: the slot goes
			// back now. A READ already posted on an earlier member may
			// still complete; progress ignores completions of free slots,
			// and the failed comm hands out no new flush to reuse it.
			f.reqs.Put(id)
			return nccl.NoRequest, c.verbsFailed(nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_post_send (flush) on %s: %w", c.devs[d].device, err), true)
		}
	}
	return nccl.Request(flushIDBase + id), nil
}

func (c *recvComm) testFlush(id int) (bool, error) {
	f := &c.flush
	var req *flushReq
	if f.reqs != nil { // nil while flush is off
		req = f.reqs.At(id)
	}
	if req == nil {
		return false, nccl.Errorf(nccl.InvalidArgument, "NET/GoIB : test of unknown flush request %d", flushIDBase+id)
	}
	if err := c.check(); err != nil {
		return false, err
	}
	if req.pending > 0 {
		if err := c.progress(); err != nil {
			return false, err
		}
		if req.pending > 0 {
			return false, nil
		}
	}
	f.reqs.Put(id)
	return true, nil
}
