package ib

import (
	"fmt"
	"sync/atomic"

	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

type recvReq struct {
	inUse   bool
	n       int
	pending int
	imm     uint32
	caps    [maxRecvs]int
}

type recvComm struct {
	*commCore
	meta         *connMeta
	shadow       *hostMem
	cts          *ctsFifo
	recMem       *hostMem
	rec          *sizeRecord
	remFifo      uint64
	remFifoRKeys [maxVDevs]uint32
	fifoHead     uint64
	ctsInline    bool // NCCL_IB_USE_INLINE: single-buffer CTS entries go inline
	reqs         [maxRequests]recvReq

	flush flusher

	rwr [1]verbs.RecvWR
	swr [1]verbs.SendWR
}

// ctsInlineBytes is the max_inline_data the receive QPs ask for with
// NCCL_IB_USE_INLINE, as NCCL does: one CTS entry.
const ctsInlineBytes = ctsEntrySize

func newRecvComm(t *Transport, devs []*device, sm *connMeta, peer string, setup setupBound) (*recvComm, error) {
	nqps := int(sm.NQPs)
	inline := 0
	if t.cfg.useInline {
		inline = ctsInlineBytes
	}
	core, err := newCore(t, devs, nqps, verbs.AccessRemoteWrite|verbs.AccessRemoteRead|verbs.AccessRemoteAtomic, 2*len(devs)+maxRequests, maxRequests, inline, setup)
	if err != nil {
		return nil, err
	}
	core.peer = peer
	core.nDataQPs = int(sm.NDataQPs)
	c := &recvComm{commCore: core, remFifo: sm.Addr, ctsInline: t.cfg.useInline}
	ok := false
	defer func() {
		if !ok {
			_ = c.Close()
		}
	}()
	for i := 0; i < int(sm.NDevs); i++ {
		c.remFifoRKeys[i] = sm.Devs[i].RKey
	}
	if c.shadow, err = newHostMem(fifoBytes); err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : CTS shadow: %w", err)
	}
	if err := c.shadow.register(devs, verbs.AccessLocalWrite); err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : CTS shadow: %w", err)
	}
	c.cts = c.shadow.ctsFifo()
	if c.recMem, err = newHostMem(recordBytes); err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : completion records: %w", err)
	}
	if err := c.recMem.register(devs, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : completion records: %w", err)
	}
	c.rec = c.recMem.sizeRecord()
	qs := t.cfg.receiverQoS(sm)
	if err := c.connectQPs(sm, qs); err != nil {
		return nil, err
	}
	if (c.ptrSupport&(nccl.PtrCUDA|nccl.PtrDMABuf) != 0 || t.cfg.forceFlush) && !t.cfg.noFlush {
		if err := c.flush.setup(c.commCore, int(sm.TC), int(sm.SL)); err != nil {
			return nil, err
		}
	}
	c.meta = c.localMeta(c.recMem.addr(), c.recMem, qs.tc, qs.sl)
	ok = true
	return c, nil
}

func (c *recvComm) PeerAddr() string { return c.peer }

func (c *recvComm) DeregMr(mh nccl.MemHandle) error { return c.deregMr(mh) }

// Irecv posts the receive WRs that will catch the sender's immediates and
// RDMA-writes the clear-to-send entries into the sender's FIFO.
func (c *recvComm) Irecv(bufs []nccl.RecvBuffer) (nccl.Request, error) {
	if err := c.check(); err != nil {
		return nccl.NoRequest, err
	}
	n := len(bufs)
	slot := int(c.fifoHead % maxRequests)
	req := &c.reqs[slot]
	if req.inUse {
		return nccl.NoRequest, nil
	}
	ents := &c.cts[slot]
	for i := range bufs {
		b := &bufs[i]
		e := &ents[i]
		addr := uint64(uintptr(b.Data))
		*e = ctsEntry{Addr: addr, Size: uint64(b.Size), Tag: uint32(b.Tag), NReqs: uint32(n)}
		if b.Size == 0 && (b.MH == 0 || addr == 0) {
			// A 0-byte buffer without a registration still needs a real
			// address and key for the sender's zero-length WRITE_WITH_IMM:
			// the completion records, which nothing but sizes ever lands in.
			e.Addr = c.recMem.addr()
			e.RKeys = c.recMem.rkeys
			continue
		}
		h := lookupMR(b.MH)
		if h == nil || h.n != len(c.devs) {
			return nccl.NoRequest, nccl.Errorf(nccl.InvalidArgument, "NET/GoIB : irecv buffer %d (%d bytes) has invalid memory handle %#x", i, b.Size, uintptr(b.MH))
		}
		if !h.covers(addr, b.Size) {
			return nccl.NoRequest, nccl.Errorf(nccl.InvalidArgument, "NET/GoIB : irecv buffer %d at %#x+%d lies outside its registration", i, addr, b.Size)
		}
		e.RKeys = h.rkeys
	}
	nq := c.nDataQPs
	c.rwr[0] = verbs.RecvWR{WRID: wrRecv | uint64(slot)}
	for i := 0; i < nq; i++ {
		qi := dataQP(c.fifoHead, i, nq, len(c.qps))
		if _, err := c.qps[qi].qp.PostRecv(c.rwr[:]); err != nil {
			return nccl.NoRequest, c.verbsFailed(nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_post_recv on %s: %w", c.devs[c.qps[qi].dev].device, err), true)
		}
	}
	idx := c.fifoHead + 1
	for i := 0; i < n; i++ {
		ents[i].Idx = idx
	}
	// The CTS goes on the first QP of member (id % ndevs). Like NCCL, it is
	// signaled only when the slot number equals that member's index, once
	// per FIFO round per member, which keeps the send queue draining.
	di := int(c.fifoHead % uint64(len(c.devs)))
	q := &c.qps[di]
	flags := verbs.SendFlags(0)
	if slot == di {
		flags = verbs.SendSignaled
	}
	if c.ctsInline && n*ctsEntrySize <= ctsInlineBytes {
		flags |= verbs.SendInline
	}
	c.swr[0] = verbs.SendWR{WRID: wrCTS | uint64(slot), Opcode: verbs.WrRDMAWrite, Flags: flags, NumSGE: 1,
		SGE:        verbs.SGE{Addr: c.shadow.addr() + uint64(slot*maxRecvs*ctsEntrySize), Length: uint32(n * ctsEntrySize), LKey: c.shadow.lkeys[q.dev]},
		RemoteAddr: c.remFifo + uint64(slot*maxRecvs*ctsEntrySize), RKey: c.remFifoRKeys[q.remDev]}
	if _, err := q.qp.PostSend(c.swr[:]); err != nil {
		return nccl.NoRequest, c.verbsFailed(nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_post_send (CTS) on %s: %w", c.devs[q.dev].device, err), true)
	}
	*req = recvReq{inUse: true, n: n, pending: nq}
	if flags&verbs.SendSignaled != 0 {
		// The unsignaled CTS writes posted since the last signaled one hold
		// their send-queue entries until this completion is polled (a
		// ConnectX frees them then, not when the ACK arrives). Holding the
		// receive, and so its slot, until then, as NCCL does, is what makes
		// the queue's 2 × 256 entries enough whatever the ACKs' timing.
		req.pending++
	}
	for i := range bufs {
		req.caps[i] = bufs[i].Size
	}
	c.fifoHead++
	return nccl.Request(slot), nil
}

// Test completes a receive once every data QP's immediate has arrived, or a
// flush once its READs completed.
func (c *recvComm) Test(r nccl.Request, sizes []int) (bool, error) {
	if r >= flushIDBase && r < flushIDBase+maxRequests {
		return c.testFlush(int(r - flushIDBase))
	}
	if r < 0 || int(r) >= maxRequests || !c.reqs[r].inUse {
		return false, nccl.Errorf(nccl.InvalidArgument, "NET/GoIB : test of unknown receive request %d", r)
	}
	if err := c.check(); err != nil {
		return false, err
	}
	req := &c.reqs[r]
	if req.pending > 0 {
		if err := c.progress(); err != nil {
			return false, err
		}
		if req.pending > 0 {
			if c.watch.gone() {
				return false, c.peerGoneError(fmt.Sprintf("receive of up to %d bytes", req.caps[0]))
			}
			return false, nil
		}
	}
	req.inUse = false
	if req.n == 1 {
		if req.imm&immTruncated != 0 {
			return true, c.truncated(int(req.imm&^immTruncated), req.caps[0], 0)
		}
		if int(req.imm) > req.caps[0] {
			return true, c.truncated(int(req.imm), req.caps[0], 0)
		}
		if len(sizes) > 0 {
			sizes[0] = int(req.imm)
		}
		return true, nil
	}
	for i := 0; i < req.n; i++ {
		v := atomic.LoadInt32(&c.rec[r][i])
		if v < 0 {
			return true, c.truncated(int(-v-1), req.caps[i], i)
		}
		if i < len(sizes) {
			sizes[i] = int(v)
		}
	}
	return true, nil
}

func (c *recvComm) truncated(sent, posted, i int) error {
	c.log.Warnf("NET/GoIB : message truncated: %s sent %d bytes into receive buffer %d of %d bytes; nothing was written past the buffer; check that both sides agree on message sizes",
		c.peer, sent, i, posted)
	return nccl.Errorf(nccl.InvalidUsage, "NET/GoIB : receive of %d bytes into a %d-byte buffer from %s", sent, posted, c.peer)
}

// progress reaps the receive and flush completions of every member CQ.
func (c *recvComm) progress() error {
	for ci, cq := range c.cqs {
		for {
			n, err := cq.Poll(c.wcs[:])
			if err != nil {
				return c.verbsFailed(nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_poll_cq on %s: %w", c.devs[ci].device, err), true)
			}
			for k := 0; k < n; k++ {
				wc := &c.wcs[k]
				if wc.Status != verbs.WCSuccess {
					return c.wcFailed(wc, ci)
				}
				v := int(wc.WRID &^ wrKind)
				switch wc.WRID & wrKind {
				case wrRecv:
					req := &c.reqs[v]
					req.pending--
					req.imm = wc.Imm
				case wrCTS:
					c.reqs[v].pending--
				case wrFlush:
					if req := c.flush.reqs.At(v); req != nil {
						req.pending--
					}
				}
			}
			if n < len(c.wcs) {
				break
			}
		}
	}
	return nil
}

func (c *recvComm) Close() error {
	if c.commCore == nil || c.destroyed {
		return nil
	}
	c.flush.destroy(c.commCore)
	c.destroy()
	for _, m := range []*hostMem{c.shadow, c.recMem, c.flush.mem} {
		if m != nil {
			m.free()
		}
	}
	c.release()
	c.failed = nccl.Errorf(nccl.InternalError, "NET/GoIB : receive comm used after close")
	return nil
}
