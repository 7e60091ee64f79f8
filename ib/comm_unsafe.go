package ib

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// ctsEntry is one clear-to-send FIFO entry (64 bytes, so entries never
// straddle a 32-byte boundary under PCIe relaxed ordering). The receiver
// RDMA-writes n of them (one per buffer of a grouped receive) into the
// sender's FIFO slot; Idx is written last in memory order and tells the
// sender the entry belongs to message Idx-1.
type ctsEntry struct {
	Addr  uint64
	Size  uint64
	RKeys [maxVDevs]uint32 // one per receiver member device
	Tag   uint32
	NReqs uint32
	Idx   uint64
}

func init() {
	if unsafe.Sizeof(ctsEntry{}) != ctsEntrySize {
		panic("ib: ctsEntry must be 64 bytes")
	}
}

// Work-request ids carry a kind in the top byte.
const (
	wrData  = 1 << 56
	wrCTS   = 2 << 56
	wrRecv  = 3 << 56
	wrFlush = 4 << 56
	wrKind  = 0xff << 56

	// immTruncated in a single receive's immediate says the send was larger
	// than the posted buffer and nothing was written; the low bits carry the
	// attempted size. Sizes are at most 1 GiB, so bit 31 is free.
	immTruncated = 1 << 31

	flushIDBase = maxRequests // flush request ids follow receive ids
	chunkAlign  = 128         // LL/LL128 need 128-byte aligned QP splits
)

// chunkSize is each data QP's share of a message: ceil(size/nq) rounded up to
// 128 bytes, so LL/LL128 lines never straddle two QPs.
func chunkSize(size, nq int) int {
	c := (size + nq - 1) / nq
	return (c + chunkAlign - 1) / chunkAlign * chunkAlign
}

func qpsPerConnection(log nccl.Logger) int {
	n := int(nccl.EnvInt(log, "NCCL_IB_QPS_PER_CONNECTION", 1))
	if n < 1 || n > maxQPs {
		log.Warnf("NET/GoIB : NCCL_IB_QPS_PER_CONNECTION=%d outside [1,%d]; using %d", n, maxQPs, min(max(n, 1), maxQPs))
		n = min(max(n, 1), maxQPs)
	}
	return n
}

// ---------------------------------------------------------------- send side

type sendReq struct {
	inUse     bool
	truncated bool
	size      int
	posted    uint64
	data      uint64
	mh        *mrHandle
	pending   int
}

type sendComm struct {
	*commCore
	fifo        *hostMem
	cts         *[maxRequests][maxRecvs]ctsEntry
	sizesMem    *hostMem
	sizes       *[maxRequests][maxRecvs]int32
	remRec      uint64
	remRecRKeys [maxVDevs]uint32
	fifoHead    uint64

	reqs        [maxRequests]sendReq
	free        [maxRequests]int16
	nfree       int
	slotReq     [maxRequests][maxRecvs]int16
	slotMatched [maxRequests]uint8
	wrs         [maxRecvs + 1]verbs.SendWR
}

func newSendComm(t *Transport, dev int, devs []*device, remDevs int, peer string) (*sendComm, error) {
	perConn := qpsPerConnection(t.log)
	nqps := min(max(len(devs), remDevs)*perConn, maxQPs)
	core, err := newCore(t, devs, nqps, verbs.AccessRemoteWrite, 0)
	if err != nil {
		return nil, err
	}
	core.peer = peer
	core.nDataQPs = max(len(devs), remDevs)
	if nccl.EnvBool(t.log, "NCCL_IB_SPLIT_DATA_ON_QPS", false) {
		core.nDataQPs = nqps
	}
	s := &sendComm{commCore: core}
	ok := false
	defer func() {
		if !ok {
			_ = s.Close()
		}
	}()
	if s.fifo, err = newHostMem(fifoBytes); err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : CTS FIFO: %w", err)
	}
	if err := s.fifo.register(devs, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : CTS FIFO: %w", err)
	}
	s.cts = (*[maxRequests][maxRecvs]ctsEntry)(s.fifo.ptr())
	if s.sizesMem, err = newHostMem(recordBytes); err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : size records: %w", err)
	}
	if err := s.sizesMem.register(devs, verbs.AccessLocalWrite); err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : size records: %w", err)
	}
	s.sizes = (*[maxRequests][maxRecvs]int32)(s.sizesMem.ptr())
	for i := range s.free {
		s.free[i] = int16(maxRequests - 1 - i)
	}
	s.nfree = maxRequests
	for i := range s.slotReq {
		for j := range s.slotReq[i] {
			s.slotReq[i][j] = -1
		}
	}
	ok = true
	return s, nil
}

// finish connects the QPs once the receiver's QP numbers are known.
func (s *sendComm) finish(rm *connMeta, tc, sl int) error {
	if err := s.connectQPs(rm, tc, sl); err != nil {
		return err
	}
	s.remRec = rm.Addr
	for i := 0; i < int(rm.NDevs); i++ {
		s.remRecRKeys[i] = rm.Devs[i].RKey
	}
	return nil
}

func (s *sendComm) PeerAddr() string { return s.peer }

func (s *sendComm) RegMr(data unsafe.Pointer, size int, t nccl.PtrType) (nccl.MemHandle, error) {
	return s.regMr(data, size, t)
}

func (s *sendComm) RegMrDMABuf(data unsafe.Pointer, size int, t nccl.PtrType, off uint64, fd int) (nccl.MemHandle, error) {
	return s.regMrDMABuf(data, size, t, off, fd)
}

func (s *sendComm) DeregMr(mh nccl.MemHandle) error { return s.deregMr(mh) }

// Isend matches the send to the oldest clear-to-send slot. It returns
// NoRequest until the receiver's CTS entries for that slot have arrived;
// once every buffer of the slot has a send, the data is posted.
func (s *sendComm) Isend(data unsafe.Pointer, size int, tag int, mh nccl.MemHandle) (nccl.Request, error) {
	if err := s.check(); err != nil {
		return nccl.NoRequest, err
	}
	slot := int(s.fifoHead % maxRequests)
	ents := &s.cts[slot]
	idx := s.fifoHead + 1
	if atomic.LoadUint64(&ents[0].Idx) != idx {
		if s.watch.gone() {
			return nccl.NoRequest, s.peerGoneError(fmt.Sprintf("send of %d bytes (waiting for the receiver's clear-to-send)", size))
		}
		return nccl.NoRequest, nil
	}
	nreqs := int(ents[0].NReqs)
	if nreqs < 1 || nreqs > maxRecvs {
		return nccl.NoRequest, s.protocolError(fmt.Sprintf("CTS entry announces %d receive buffers", nreqs))
	}
	for r := 1; r < nreqs; r++ {
		if atomic.LoadUint64(&ents[r].Idx) != idx {
			return nccl.NoRequest, nil
		}
	}
	for r := 0; r < nreqs; r++ {
		if ents[r].Addr == 0 || ents[r].RKeys[0] == 0 {
			return nccl.NoRequest, s.protocolError(fmt.Sprintf("CTS entry %d of %d advertises address %#x rkey %#x", r, nreqs, ents[r].Addr, ents[r].RKeys[0]))
		}
	}
	entry := -1
	for r := 0; r < nreqs; r++ {
		if s.slotReq[slot][r] < 0 && ents[r].Tag == uint32(tag) {
			entry = r
			break
		}
	}
	if entry < 0 {
		return nccl.NoRequest, nccl.Errorf(nccl.InvalidUsage, "NET/GoIB : isend with tag %d matches no free buffer of the receive posted by %s (%d buffers); sends and receives must agree on tags", tag, s.peer, nreqs)
	}
	var h *mrHandle
	if size > 0 {
		if h = lookupMR(mh); h == nil || h.n != len(s.devs) {
			return nccl.NoRequest, nccl.Errorf(nccl.InvalidArgument, "NET/GoIB : isend of %d bytes with invalid memory handle %#x (not from regMr on this device)", size, uintptr(mh))
		}
		if !h.covers(uint64(uintptr(data)), size) {
			return nccl.NoRequest, nccl.Errorf(nccl.InvalidArgument, "NET/GoIB : isend buffer %p+%d lies outside its registration", data, size)
		}
	}
	if s.nfree == 0 {
		return nccl.NoRequest, nil
	}
	s.nfree--
	id := s.free[s.nfree]
	req := &s.reqs[id]
	*req = sendReq{inUse: true, size: size, data: uint64(uintptr(data)), mh: h, posted: ents[entry].Size}
	if uint64(size) > req.posted {
		req.truncated = true
		s.log.Warnf("NET/GoIB : send of %d bytes to %s is larger than the posted receive buffer of %d bytes (tag %d); nothing was written past the buffer and both requests fail with ncclInvalidUsage: sender and receiver disagree on message sizes",
			size, s.peer, req.posted, tag)
	}
	s.slotReq[slot][entry] = id
	s.slotMatched[slot]++
	if int(s.slotMatched[slot]) == nreqs {
		if err := s.post(slot, nreqs); err != nil {
			return nccl.NoRequest, err
		}
		s.fifoHead++
	}
	return nccl.Request(id), nil
}

// post writes every request of the slot: on each data QP a chain of RDMA
// WRITEs (each request's 128-byte-aligned share), ending with a signaled
// WRITE_WITH_IMM that carries the size (single receive) or writes the sizes
// array into the receiver's completion record (grouped receive).
func (s *sendComm) post(slot, nreqs int) error {
	ents := &s.cts[slot]
	nq := s.nDataQPs
	for r := 0; r < nreqs; r++ {
		s.reqs[s.slotReq[slot][r]].pending = nq
		if nreqs > 1 {
			req := &s.reqs[s.slotReq[slot][r]]
			if req.truncated {
				s.sizes[slot][r] = -int32(req.size) - 1
			} else {
				s.sizes[slot][r] = int32(req.size)
			}
		}
	}
	for i := 0; i < nq; i++ {
		qi := int((s.fifoHead*uint64(nq) + uint64(i)) % uint64(len(s.qps)))
		q := &s.qps[qi]
		n := 0
		for r := 0; r < nreqs; r++ {
			req := &s.reqs[s.slotReq[slot][r]]
			if req.truncated || req.size == 0 {
				continue
			}
			chunk := chunkSize(req.size, nq)
			off := i * chunk
			if off >= req.size {
				continue
			}
			l := min(chunk, req.size-off)
			s.wrs[n] = verbs.SendWR{WRID: wrData | uint64(slot), Opcode: verbs.WrRDMAWrite, NumSGE: 1,
				SGE:        verbs.SGE{Addr: req.data + uint64(off), Length: uint32(l), LKey: req.mh.lkeys[q.dev]},
				RemoteAddr: ents[r].Addr + uint64(off), RKey: ents[r].RKeys[q.remDev]}
			n++
		}
		if nreqs == 1 {
			req := &s.reqs[s.slotReq[slot][0]]
			imm := uint32(req.size)
			if req.truncated {
				imm = immTruncated | uint32(min(req.size, immTruncated-1))
			}
			if n == 0 {
				// Nothing to write (0 bytes, or truncated): a zero-length
				// WRITE_WITH_IMM that still names the receiver's buffer and
				// key, as NCCL posts it; NICs may check both.
				s.wrs[0] = verbs.SendWR{WRID: wrData | uint64(slot), RemoteAddr: ents[0].Addr, RKey: ents[0].RKeys[q.remDev]}
				n = 1
			}
			last := &s.wrs[n-1]
			last.Opcode, last.Imm, last.Flags = verbs.WrRDMAWriteWithImm, imm, verbs.SendSignaled
		} else {
			s.wrs[n] = verbs.SendWR{WRID: wrData | uint64(slot), Opcode: verbs.WrRDMAWriteWithImm, Flags: verbs.SendSignaled, NumSGE: 1,
				SGE:        verbs.SGE{Addr: s.sizesMem.addr() + uint64(slot*maxRecvs*4), Length: uint32(nreqs * 4), LKey: s.sizesMem.lkeys[q.dev]},
				RemoteAddr: s.remRec + uint64(slot*maxRecvs*4), RKey: s.remRecRKeys[q.remDev], Imm: uint32(slot)}
			n++
		}
		if _, err := q.qp.PostSend(s.wrs[:n]); err != nil {
			s.failed = nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_post_send on %s to %s: %w", s.devs[q.dev], s.peer, err)
			return s.failed
		}
	}
	return nil
}

func (s *sendComm) protocolError(what string) error {
	s.failed = nccl.Errorf(nccl.InternalError, "NET/GoIB : protocol error with %s: %s", s.peer, what)
	return s.failed
}

// Test reports a send complete once every data QP's signaled write of its
// slot has completed.
func (s *sendComm) Test(r nccl.Request) (bool, int, error) {
	if r < 0 || int(r) >= maxRequests || !s.reqs[r].inUse {
		return false, 0, nccl.Errorf(nccl.InternalError, "NET/GoIB : test of unknown send request %d", r)
	}
	if err := s.check(); err != nil {
		return false, 0, err
	}
	req := &s.reqs[r]
	if req.pending > 0 {
		if err := s.progress(); err != nil {
			return false, 0, err
		}
		if req.pending > 0 {
			if s.watch.gone() {
				return false, 0, s.peerGoneError(fmt.Sprintf("send of %d bytes", req.size))
			}
			return false, 0, nil
		}
	}
	req.inUse = false
	s.free[s.nfree] = int16(r)
	s.nfree++
	if req.truncated {
		return true, 0, nccl.Errorf(nccl.InvalidUsage, "NET/GoIB : send of %d bytes to %s exceeded the posted receive of %d bytes", req.size, s.peer, req.posted)
	}
	return true, req.size, nil
}

func (s *sendComm) progress() error {
	for ci, cq := range s.cqs {
		for {
			n, err := cq.Poll(s.wcs[:])
			if err != nil {
				s.failed = nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_poll_cq on %s: %w", s.devs[ci], err)
				return s.failed
			}
			for k := 0; k < n; k++ {
				wc := &s.wcs[k]
				if wc.Status != verbs.WCSuccess {
					return s.wcFailed(wc, ci)
				}
				if wc.WRID&wrKind != wrData {
					continue
				}
				slot := int(wc.WRID &^ wrKind)
				done := true
				for e := 0; e < maxRecvs && s.slotReq[slot][e] >= 0; e++ {
					req := &s.reqs[s.slotReq[slot][e]]
					req.pending--
					done = done && req.pending == 0
				}
				if done {
					for e := range s.slotReq[slot] {
						s.slotReq[slot][e] = -1
					}
					s.slotMatched[slot] = 0
				}
			}
			if n < len(s.wcs) {
				break
			}
		}
	}
	return nil
}

func (s *sendComm) Close() error {
	if s.commCore == nil {
		return nil
	}
	s.destroy()
	if s.fifo != nil {
		s.fifo.free()
	}
	if s.sizesMem != nil {
		s.sizesMem.free()
	}
	s.failed = nccl.Errorf(nccl.InternalError, "NET/GoIB : send comm used after close")
	return nil
}

// ------------------------------------------------------------- receive side

type recvReq struct {
	inUse   bool
	n       int
	pending int
	imm     uint32
	caps    [maxRecvs]int
}

type flushReq struct {
	inUse   bool
	pending int
}

type recvComm struct {
	*commCore
	meta         *connMeta
	shadow       *hostMem
	cts          *[maxRequests][maxRecvs]ctsEntry
	recMem       *hostMem
	rec          *[maxRequests][maxRecvs]int32
	remFifo      uint64
	remFifoRKeys [maxVDevs]uint32
	fifoHead     uint64
	reqs         [maxRequests]recvReq

	flushEnabled bool
	flushQPs     []verbs.QP
	flushMem     *hostMem
	flushReqs    [maxRequests]flushReq
	flushFree    [maxRequests]int16
	nflushFree   int

	rwr [1]verbs.RecvWR
	swr [1]verbs.SendWR
}

func newRecvComm(t *Transport, dev int, devs []*device, sm *connMeta, peer string) (*recvComm, error) {
	nqps := int(sm.NQPs)
	core, err := newCore(t, devs, nqps, verbs.AccessRemoteWrite|verbs.AccessRemoteRead|verbs.AccessRemoteAtomic, 2*len(devs)+maxRequests)
	if err != nil {
		return nil, err
	}
	core.peer = peer
	core.nDataQPs = int(sm.NDataQPs)
	if core.nDataQPs < 1 || core.nDataQPs > nqps {
		core.destroy()
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : peer %s uses %d data QPs of %d", peer, sm.NDataQPs, nqps)
	}
	c := &recvComm{commCore: core, remFifo: sm.Addr}
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
	c.cts = (*[maxRequests][maxRecvs]ctsEntry)(c.shadow.ptr())
	if c.recMem, err = newHostMem(recordBytes); err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : completion records: %w", err)
	}
	if err := c.recMem.register(devs, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : completion records: %w", err)
	}
	c.rec = (*[maxRequests][maxRecvs]int32)(c.recMem.ptr())
	tc := int(nccl.EnvInt(t.log, "NCCL_IB_FIFO_TC", -1))
	if tc < 0 {
		tc = int(sm.TC)
	}
	if err := c.connectQPs(sm, tc, int(sm.SL)); err != nil {
		return nil, err
	}
	forced := nccl.EnvBool(t.log, "NCCL_GO_IB_FORCE_FLUSH", false)
	c.flushEnabled = (c.ptrSupport&(nccl.PtrCUDA|nccl.PtrDMABuf) != 0 || forced) && !nccl.EnvBool(t.log, "NCCL_GDR_FLUSH_DISABLE", false)
	if c.flushEnabled {
		if err := c.setupFlush(); err != nil {
			return nil, err
		}
	}
	c.meta = c.localMeta(c.recMem.addr(), c.recMem, tc, int(sm.SL))
	ok = true
	return c, nil
}

// setupFlush creates, per member device, an RC QP connected to itself: the
// flush is a 1-byte RDMA READ through it, which the NIC orders after the
// data writes it has placed in the buffer.
func (c *recvComm) setupFlush() error {
	var err error
	if c.flushMem, err = newHostMem(int(pageSize)); err != nil {
		return nccl.Errorf(nccl.SystemError, "NET/GoIB : flush buffer: %w", err)
	}
	if err := c.flushMem.register(c.devs, verbs.AccessLocalWrite); err != nil {
		return nccl.Errorf(nccl.SystemError, "NET/GoIB : flush buffer: %w", err)
	}
	for i, d := range c.devs {
		qp, err := d.hca.pd.CreateQP(verbs.QPInitAttr{SendCQ: c.cqs[i], RecvCQ: c.cqs[i], MaxSendWR: maxRequests, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1})
		if err != nil {
			return nccl.Errorf(nccl.SystemError, "NET/GoIB : flush QP on %s: %w", d, err)
		}
		c.flushQPs = append(c.flushQPs, qp)
		d.hca.owners.Store(qp.Num(), c.commCore)
		ah := verbs.AH{Port: d.port}
		if d.attr.LinkLayer == verbs.LinkEthernet {
			ah.IsGlobal, ah.DGID, ah.SGIDIndex, ah.HopLimit = true, d.gid, d.gidIndex, 255
		} else {
			ah.DLID = d.attr.LID
		}
		if err := qp.ModifyToInit(verbs.InitAttr{Port: d.port, Access: verbs.AccessRemoteRead}); err != nil {
			return nccl.Errorf(nccl.SystemError, "NET/GoIB : flush QP INIT on %s: %w", d, err)
		}
		if err := qp.ModifyToRTR(verbs.RTRAttr{PathMTU: d.attr.ActiveMTU, DestQPN: qp.Num(), MaxDestRdAtomic: 1, MinRNRTimer: 12, AH: ah}); err != nil {
			return nccl.Errorf(nccl.SystemError, "NET/GoIB : flush QP RTR on %s: %w", d, err)
		}
		if err := qp.ModifyToRTS(verbs.RTSAttr{Timeout: int(nccl.EnvInt(c.log, "NCCL_IB_TIMEOUT", 20)), RetryCnt: int(nccl.EnvInt(c.log, "NCCL_IB_RETRY_CNT", 7)), RNRRetry: 7, MaxRdAtom: 1}); err != nil {
			return nccl.Errorf(nccl.SystemError, "NET/GoIB : flush QP RTS on %s: %w", d, err)
		}
	}
	for i := range c.flushFree {
		c.flushFree[i] = int16(maxRequests - 1 - i)
	}
	c.nflushFree = maxRequests
	return nil
}

func (c *recvComm) PeerAddr() string { return c.peer }

func (c *recvComm) RegMr(data unsafe.Pointer, size int, t nccl.PtrType) (nccl.MemHandle, error) {
	return c.regMr(data, size, t)
}

func (c *recvComm) RegMrDMABuf(data unsafe.Pointer, size int, t nccl.PtrType, off uint64, fd int) (nccl.MemHandle, error) {
	return c.regMrDMABuf(data, size, t, off, fd)
}

func (c *recvComm) DeregMr(mh nccl.MemHandle) error { return c.deregMr(mh) }

// Irecv posts the receive WRs that will catch the sender's immediates and
// RDMA-writes the clear-to-send entries into the sender's FIFO.
func (c *recvComm) Irecv(bufs []nccl.RecvBuffer) (nccl.Request, error) {
	if err := c.check(); err != nil {
		return nccl.NoRequest, err
	}
	n := len(bufs)
	if n < 1 || n > maxRecvs {
		return nccl.NoRequest, nccl.Errorf(nccl.InvalidArgument, "NET/GoIB : grouped receive of %d buffers; this device allows 1 to %d (maxRecvs)", n, maxRecvs)
	}
	slot := int(c.fifoHead % maxRequests)
	req := &c.reqs[slot]
	if req.inUse {
		return nccl.NoRequest, nil
	}
	ents := &c.cts[slot]
	for i := range bufs {
		b := &bufs[i]
		e := &ents[i]
		*e = ctsEntry{Addr: uint64(uintptr(b.Data)), Size: uint64(b.Size), Tag: uint32(b.Tag), NReqs: uint32(n)}
		if b.Size == 0 && (b.MH == 0 || b.Data == nil) {
			// A 0-byte buffer without a registration still needs a real
			// address and key for the sender's zero-length WRITE_WITH_IMM:
			// the completion records, which nothing but sizes ever lands in.
			e.Addr = c.recMem.addr()
			for d := range c.devs {
				e.RKeys[d] = c.recMem.rkeys[d]
			}
		} else {
			h := lookupMR(b.MH)
			if h == nil || h.n != len(c.devs) {
				return nccl.NoRequest, nccl.Errorf(nccl.InvalidArgument, "NET/GoIB : irecv buffer %d (%d bytes) has invalid memory handle %#x", i, b.Size, uintptr(b.MH))
			}
			if b.Size > 0 && !h.covers(e.Addr, b.Size) {
				return nccl.NoRequest, nccl.Errorf(nccl.InvalidArgument, "NET/GoIB : irecv buffer %d at %p+%d lies outside its registration", i, b.Data, b.Size)
			}
			for d := 0; d < h.n; d++ {
				e.RKeys[d] = h.rkeys[d]
			}
		}
	}
	nq := c.nDataQPs
	c.rwr[0] = verbs.RecvWR{WRID: wrRecv | uint64(slot)}
	for i := 0; i < nq; i++ {
		qi := int((c.fifoHead*uint64(nq) + uint64(i)) % uint64(len(c.qps)))
		if _, err := c.qps[qi].qp.PostRecv(c.rwr[:]); err != nil {
			c.failed = nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_post_recv on %s: %w", c.devs[c.qps[qi].dev], err)
			return nccl.NoRequest, c.failed
		}
	}
	idx := c.fifoHead + 1
	for i := 0; i < n; i++ {
		ents[i].Idx = idx
	}
	// The CTS goes on the first QP of member (id % ndevs); it is signaled
	// once every 64 slots per QP so the send queue drains.
	di := int(c.fifoHead % uint64(len(c.devs)))
	q := &c.qps[di]
	flags := verbs.SendFlags(0)
	if slot%64 == di {
		flags = verbs.SendSignaled
	}
	c.swr[0] = verbs.SendWR{WRID: wrCTS | uint64(slot), Opcode: verbs.WrRDMAWrite, Flags: flags, NumSGE: 1,
		SGE:        verbs.SGE{Addr: c.shadow.addr() + uint64(slot*maxRecvs*ctsEntrySize), Length: uint32(n * ctsEntrySize), LKey: c.shadow.lkeys[q.dev]},
		RemoteAddr: c.remFifo + uint64(slot*maxRecvs*ctsEntrySize), RKey: c.remFifoRKeys[q.remDev]}
	if _, err := q.qp.PostSend(c.swr[:]); err != nil {
		c.failed = nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_post_send (CTS) on %s: %w", c.devs[q.dev], err)
		return nccl.NoRequest, c.failed
	}
	*req = recvReq{inUse: true, n: n, pending: nq}
	for i := range bufs {
		req.caps[i] = bufs[i].Size
	}
	c.fifoHead++
	return nccl.Request(slot), nil
}

// Iflush issues a 1-byte RDMA READ of the last non-empty buffer on every
// member device through the loopback QP. It returns NoRequest when flush is
// disabled or nothing was received.
func (c *recvComm) Iflush(bufs []nccl.RecvBuffer) (nccl.Request, error) {
	if err := c.check(); err != nil {
		return nccl.NoRequest, err
	}
	if !c.flushEnabled {
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
	if c.nflushFree == 0 {
		return nccl.NoRequest, nccl.Errorf(nccl.InternalError, "NET/GoIB : more than %d flushes in flight", maxRequests)
	}
	c.nflushFree--
	id := int(c.flushFree[c.nflushFree])
	c.flushReqs[id] = flushReq{inUse: true, pending: len(c.devs)}
	for d, qp := range c.flushQPs {
		c.swr[0] = verbs.SendWR{WRID: wrFlush | uint64(id), Opcode: verbs.WrRDMARead, Flags: verbs.SendSignaled, NumSGE: 1,
			SGE:        verbs.SGE{Addr: c.flushMem.addr(), Length: 1, LKey: c.flushMem.lkeys[d]},
			RemoteAddr: uint64(uintptr(bufs[last].Data)), RKey: h.rkeys[d]}
		if _, err := qp.PostSend(c.swr[:]); err != nil {
			c.failed = nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_post_send (flush) on %s: %w", c.devs[d], err)
			return nccl.NoRequest, c.failed
		}
	}
	return nccl.Request(flushIDBase + id), nil
}

// Test completes a receive once every data QP's immediate has arrived, or a
// flush once its READs completed.
func (c *recvComm) Test(r nccl.Request, sizes []int) (bool, error) {
	if r >= flushIDBase && r < flushIDBase+maxRequests {
		return c.testFlush(int(r - flushIDBase))
	}
	if r < 0 || int(r) >= maxRequests || !c.reqs[r].inUse {
		return false, nccl.Errorf(nccl.InternalError, "NET/GoIB : test of unknown receive request %d", r)
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

func (c *recvComm) testFlush(id int) (bool, error) {
	f := &c.flushReqs[id]
	if !f.inUse {
		return false, nccl.Errorf(nccl.InternalError, "NET/GoIB : test of unknown flush request %d", flushIDBase+id)
	}
	if err := c.check(); err != nil {
		return false, err
	}
	if f.pending > 0 {
		if err := c.progress(); err != nil {
			return false, err
		}
		if f.pending > 0 {
			return false, nil
		}
	}
	f.inUse = false
	c.flushFree[c.nflushFree] = int16(id)
	c.nflushFree++
	return true, nil
}

func (c *recvComm) progress() error {
	for ci, cq := range c.cqs {
		for {
			n, err := cq.Poll(c.wcs[:])
			if err != nil {
				c.failed = nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_poll_cq on %s: %w", c.devs[ci], err)
				return c.failed
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
				case wrFlush:
					c.flushReqs[v].pending--
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
	if c.commCore == nil {
		return nil
	}
	for i, qp := range c.flushQPs {
		c.devs[i].hca.owners.Delete(qp.Num())
		_ = qp.Destroy()
	}
	c.flushQPs = nil
	c.destroy()
	for _, m := range []*hostMem{c.shadow, c.recMem, c.flushMem} {
		if m != nil {
			m.free()
		}
	}
	c.failed = nccl.Errorf(nccl.InternalError, "NET/GoIB : receive comm used after close")
	return nil
}

// wcFailed turns an error completion into RemoteError with a WARN naming the
// status, opcode, peer, device and what to check.
func (c *commCore) wcFailed(wc *verbs.WC, ci int) error {
	var hint string
	switch wc.Status {
	case verbs.WCRetryExcErr:
		hint = fmt.Sprintf("the peer stopped acknowledging: it died, the link is down, or NCCL_IB_TIMEOUT (now %d) is too short for this fabric", nccl.EnvInt(c.log, "NCCL_IB_TIMEOUT", 20))
	case verbs.WCRemAccessErr:
		hint = "the peer rejected the RDMA access (bad rkey or out of bounds): its buffer was deregistered or closed, or the two ranks run different plugin builds"
	case verbs.WCLocProtErr:
		hint = "local protection error: PCI ACS is probably breaking GPU-direct; try NCCL_NET_GDR_LEVEL=0 or disable ACS"
	case verbs.WCWRFlushErr:
		hint = "the QP had already failed (see the first error); NICs on one host may be unable to reach each other"
	case verbs.WCRNRRetryExcErr:
		hint = "the receiver had no receive posted"
	default:
		hint = "check the fabric (ibv_devinfo, dmesg, port counters)"
	}
	kind := "data"
	switch wc.WRID & wrKind {
	case wrCTS:
		kind = "clear-to-send"
	case wrRecv:
		kind = "receive"
	case wrFlush:
		kind = "flush"
	}
	c.log.Warnf("NET/GoIB : got completion from peer %s with status=%v(%d) opcode=%v (%s) len=%d vendor_err=%d on %s: %s",
		c.peer, wc.Status, int(wc.Status), wc.Opcode, kind, wc.ByteLen, wc.VendorErr, c.devs[ci], hint)
	c.failed = nccl.Errorf(nccl.RemoteError, "NET/GoIB : completion with status %v on %s from %s", wc.Status, c.devs[ci], c.peer)
	return c.failed
}
