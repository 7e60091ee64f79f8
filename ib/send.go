package ib

import (
	"fmt"
	"sync/atomic"

	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/internal/reqpool"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

const (
	// immTruncated in a single receive's immediate says the send was larger
	// than the posted buffer and nothing was written; the low bits carry the
	// attempted size. Sizes are at most 1 GiB, so bit 31 is free.
	immTruncated = 1 << 31

	chunkAlign = 128 // LL/LL128 need 128-byte aligned QP splits
)

// chunkSize is each data QP's share of a message: ceil(size/nq) rounded up to
// 128 bytes, so LL/LL128 lines never straddle two QPs.
func chunkSize(size, nq int) int {
	c := (size + nq - 1) / nq
	return (c + chunkAlign - 1) / chunkAlign * chunkAlign
}

// dataQP is the QP that carries data QP i's share of message seq (the FIFO
// head when it was posted): each message starts one data-QP round further,
// so consecutive messages spread over every QP. The receiver posts its
// receive for that share on the same QP.
func dataQP(seq uint64, i, nDataQPs, nqps int) int {
	return int((seq*uint64(nDataQPs) + uint64(i)) % uint64(nqps))
}

// immOf is the immediate of a single receive's WRITE_WITH_IMM: the size
// sent, or immTruncated with the attempted size when nothing was written.
func immOf(size int, truncated bool) uint32 {
	if truncated {
		return immTruncated | uint32(min(size, immTruncated-1))
	}
	return uint32(size)
}

// sizeRecordOf is a grouped receive's completion-record word for one of
// its buffers: the size sent, or -size-1 when it was truncated.
func sizeRecordOf(size int, truncated bool) int32 {
	if truncated {
		return -int32(size) - 1
	}
	return int32(size)
}

type sendReq struct {
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
	cts         *ctsFifo
	sizesMem    *hostMem
	sizes       *sizeRecord
	remRec      uint64
	remRecRKeys [maxVDevs]uint32
	fifoHead    uint64
	// ar: every local member does adaptive routing, so a large single
	// receive's data goes as plain RDMA WRITEs (which the fabric may route
	// adaptively) followed by a zero-length WRITE_WITH_IMM, as NCCL does.
	ar          bool
	arThreshold int

	reqs        *reqpool.Pool[sendReq]
	slotReq     [maxRequests][maxRecvs]int16
	slotMatched [maxRequests]uint8
	slotPosted  [maxRequests]bool // data posted, completions outstanding
	wrs         [maxRecvs + 1]verbs.SendWR
}

func newSendComm(t *Transport, devs []*device, remDevs int, peer string, setup setupBound) (*sendComm, error) {
	nqps := min(max(len(devs), remDevs)*t.cfg.qpsPerConn, maxQPs)
	// No receive queue: nothing is ever sent to a sender's QPs with a
	// receive to consume (the CTS entries arrive by RDMA WRITE), as NCCL
	// 2.29+'s sender QPs have none; each would pin a queue and its doorbell
	// record.
	core, err := newCore(t, devs, nqps, verbs.AccessRemoteWrite, 0, 0, 0, setup)
	if err != nil {
		return nil, err
	}
	core.peer = peer
	core.nDataQPs = max(len(devs), remDevs)
	if t.cfg.splitData {
		core.nDataQPs = nqps
	}
	s := &sendComm{commCore: core, ar: true, arThreshold: t.cfg.arThreshold, reqs: reqpool.New[sendReq](maxRequests)}
	for _, d := range devs {
		s.ar = s.ar && d.ar
	}
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
	s.cts = s.fifo.ctsFifo()
	if s.sizesMem, err = newHostMem(recordBytes); err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : size records: %w", err)
	}
	if err := s.sizesMem.register(devs, verbs.AccessLocalWrite); err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : size records: %w", err)
	}
	s.sizes = s.sizesMem.sizeRecord()
	for i := range s.slotReq {
		for j := range s.slotReq[i] {
			s.slotReq[i][j] = -1
		}
	}
	ok = true
	return s, nil
}

// req is the send request matched to entry e of CTS slot slot: in use until
// its Test, which the slot's completions precede.
func (s *sendComm) req(slot, e int) *sendReq { return s.reqs.At(int(s.slotReq[slot][e])) }

// finish connects the QPs once the receiver's QP numbers are known.
func (s *sendComm) finish(rm *connMeta, qs qos) error {
	if err := s.connectQPs(rm, qs); err != nil {
		return err
	}
	s.remRec = rm.Addr
	for i := 0; i < int(rm.NDevs); i++ {
		s.remRecRKeys[i] = rm.Devs[i].RKey
	}
	return nil
}

func (s *sendComm) PeerAddr() string { return s.peer }

func (s *sendComm) DeregMr(mh nccl.MemHandle) error { return s.deregMr(mh) }

// isend matches a send to the oldest clear-to-send slot. It returns
// NoRequest until the receiver's CTS entries for that slot have arrived, or
// while no request is free (the slot's previous round still in flight, or
// every request waiting for its Test); once every buffer of the slot has a
// send, the data is posted.
func (s *sendComm) isend(data uint64, size int, tag int, mh nccl.MemHandle) (nccl.Request, error) {
	if err := s.check(); err != nil {
		return nccl.NoRequest, err
	}
	slot := int(s.fifoHead % maxRequests)
	ents := &s.cts[slot]
	idx := s.fifoHead + 1
	if atomic.LoadUint64(&ents[0].Idx) != idx {
		return s.notYet(size, "the receiver's clear-to-send")
	}
	if s.slotPosted[slot] {
		// The FIFO wrapped onto a slot whose previous sends have not
		// completed yet: exhaustion, not an error.
		if err := s.progress(); err != nil {
			return nccl.NoRequest, err
		}
		if s.slotPosted[slot] {
			return nccl.NoRequest, nil
		}
	}
	nreqs, ready, err := parseCTS(ents, idx)
	if err != nil {
		return nccl.NoRequest, s.protocolError(err.Error())
	}
	if !ready {
		// Entry 0 came and a later one of the same write has not: a
		// receiver that died mid-write would leave it so for good.
		return s.notYet(size, "the rest of the receiver's clear-to-send")
	}
	entry := -1
	for r := 0; r < nreqs; r++ {
		if ents[r].Tag == uint32(tag) && s.slotReq[slot][r] < 0 {
			entry = r
			break
		}
	}
	if entry < 0 {
		// No free buffer of the oldest slot has this tag: the send is for
		// a later receive. Every buffer with the tag may have its send
		// already (one tag of a grouped receive ahead of another), or the
		// slot may not carry the tag at all: with PXN one shared comm
		// carries the sends of several ranks and the receiver posts one
		// receive per proxy op, so a rank whose receive comes in a later
		// op can send first. NCCL's ncclIbIsend answers NULL in both
		// cases and matches the send once the slot moved on; a tag no
		// receive ever carries waits like a receive never posted (the
		// glue's stall WARN names it).
		return s.notYet(size, "the receive with a free buffer for this tag")
	}
	var h *mrHandle
	if size > 0 {
		if h = lookupMR(mh); h == nil || h.n != len(s.devs) {
			return nccl.NoRequest, nccl.Errorf(nccl.InvalidArgument, "NET/GoIB : isend of %d bytes with invalid memory handle %#x (not from regMr on this device)", size, uintptr(mh))
		}
		if !h.covers(data, size) {
			return nccl.NoRequest, nccl.Errorf(nccl.InvalidArgument, "NET/GoIB : isend buffer %#x+%d lies outside its registration", data, size)
		}
	}
	id, req, ok := s.reqs.Get()
	if !ok {
		return nccl.NoRequest, nil
	}
	// Pending from the start: a grouped receive's sends are written only once
	// the whole group is matched, and until then Test must not hand the
	// request back (NCCL would reuse the buffer, and the pool the id, while
	// slotReq still names it).
	*req = sendReq{size: size, data: data, mh: h, posted: ents[entry].Size, pending: s.nDataQPs}
	if uint64(size) > req.posted {
		req.truncated = true
		s.log.Warnf("NET/GoIB : send of %d bytes to %s is larger than the posted receive buffer of %d bytes (tag %d); nothing was written past the buffer and both requests fail with ncclInvalidUsage: sender and receiver disagree on message sizes",
			size, s.peer, req.posted, tag)
	}
	s.slotReq[slot][entry] = int16(id)
	s.slotMatched[slot]++
	if int(s.slotMatched[slot]) == nreqs {
		if err := s.post(slot, nreqs); err != nil {
			return nccl.NoRequest, err
		}
		s.slotPosted[slot] = true
		s.fifoHead++
	}
	return nccl.Request(id), nil
}

// post writes every request of the slot. On each data QP: a chain of RDMA
// WRITEs (each request's 128-byte-aligned share) ending with a signaled
// WRITE_WITH_IMM, which carries the size (single receive) or writes the
// sizes array into the receiver's completion record (grouped receive). A
// single receive carries its last data piece in the WRITE_WITH_IMM itself,
// unless adaptive routing is on and the message is above
// NCCL_IB_AR_THRESHOLD: then all data goes as plain WRITEs and a zero-length
// WRITE_WITH_IMM follows, so the immediate cannot overtake routed data.
func (s *sendComm) post(slot, nreqs int) error {
	ents := &s.cts[slot]
	nq := s.nDataQPs
	for r := 0; r < nreqs; r++ {
		req := s.req(slot, r)
		if nreqs > 1 {
			s.sizes[slot][r] = sizeRecordOf(req.size, req.truncated)
		}
	}
	first := s.req(slot, 0)
	separateImm := nreqs == 1 && s.ar && !first.truncated && first.size > s.arThreshold
	for i := 0; i < nq; i++ {
		q := &s.qps[dataQP(s.fifoHead, i, nq, len(s.qps))]
		n := 0
		for r := 0; r < nreqs; r++ {
			req := s.req(slot, r)
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
		switch {
		case nreqs == 1:
			imm := immOf(first.size, first.truncated)
			if n == 0 || separateImm {
				// Nothing to write here (0 bytes, truncated, or this QP's
				// share is empty), or AR: a zero-length WRITE_WITH_IMM that
				// still names the receiver's buffer and key; NICs may check
				// both.
				s.wrs[n] = verbs.SendWR{WRID: wrData | uint64(slot), RemoteAddr: ents[0].Addr, RKey: ents[0].RKeys[q.remDev]}
				n++
			}
			last := &s.wrs[n-1]
			last.Opcode, last.Imm, last.Flags = verbs.WrRDMAWriteWithImm, imm, verbs.SendSignaled
		default:
			s.wrs[n] = verbs.SendWR{WRID: wrData | uint64(slot), Opcode: verbs.WrRDMAWriteWithImm, Flags: verbs.SendSignaled, NumSGE: 1,
				SGE:        verbs.SGE{Addr: s.sizesMem.addr() + uint64(slot*maxRecvs*4), Length: uint32(nreqs * 4), LKey: s.sizesMem.lkeys[q.dev]},
				RemoteAddr: s.remRec + uint64(slot*maxRecvs*4), RKey: s.remRecRKeys[q.remDev], Imm: uint32(slot)}
			n++
		}
		if _, err := q.qp.PostSend(s.wrs[:n]); err != nil {
			return s.verbsFailed(nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_post_send on %s to %s: %w", s.devs[q.dev].device, s.peer, err), true)
		}
	}
	return nil
}

// notYet answers an isend that waits for the receiver's clear-to-send:
// retry later, unless the peer watch says the receiver is gone.
func (s *sendComm) notYet(size int, what string) (nccl.Request, error) {
	if s.watch.gone() {
		return nccl.NoRequest, s.peerGoneError(fmt.Sprintf("send of %d bytes (waiting for %s)", size, what))
	}
	return nccl.NoRequest, nil
}

// parseCTS reads the clear-to-send entries of the FIFO slot for message
// idx-1, which the receiver RDMA-wrote: whatever they hold, it never lets
// the sender index or write out of bounds. ready is false while some entry
// of the group has not arrived; a group that cannot be right (no buffers or
// more than maxRecvs, a buffer at address 0 or with rkey 0) is an error.
func parseCTS(ents *[maxRecvs]ctsEntry, idx uint64) (nreqs int, ready bool, err error) {
	if atomic.LoadUint64(&ents[0].Idx) != idx {
		return 0, false, nil
	}
	nreqs = int(ents[0].NReqs)
	if nreqs < 1 || nreqs > maxRecvs {
		return 0, false, fmt.Errorf("CTS entry announces %d receive buffers", nreqs)
	}
	for r := 1; r < nreqs; r++ {
		if atomic.LoadUint64(&ents[r].Idx) != idx {
			return 0, false, nil
		}
	}
	for r := 0; r < nreqs; r++ {
		if ents[r].Addr == 0 || ents[r].RKeys[0] == 0 {
			return 0, false, fmt.Errorf("CTS entry %d of %d advertises address %#x rkey %#x", r, nreqs, ents[r].Addr, ents[r].RKeys[0])
		}
	}
	return nreqs, true, nil
}

func (s *sendComm) protocolError(what string) error {
	s.failed = nccl.Errorf(nccl.InternalError, "NET/GoIB : protocol error with %s: %s", s.peer, what)
	return s.failed
}

// Test reports a send complete once every data QP's signaled write of its
// slot has completed.
func (s *sendComm) Test(r nccl.Request) (bool, int, error) {
	req := s.reqs.At(int(r))
	if req == nil {
		return false, 0, nccl.Errorf(nccl.InvalidArgument, "NET/GoIB : test of unknown send request %d", r)
	}
	if err := s.check(); err != nil {
		return false, 0, err
	}
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
	done := *req
	s.reqs.Put(int(r))
	if done.truncated {
		return true, 0, nccl.Errorf(nccl.InvalidUsage, "NET/GoIB : send of %d bytes to %s exceeded the posted receive of %d bytes", done.size, s.peer, done.posted)
	}
	return true, done.size, nil
}

// progress reaps the send completions of every member CQ.
func (s *sendComm) progress() error {
	for ci, cq := range s.cqs {
		for {
			n, err := cq.Poll(s.wcs[:])
			if err != nil {
				return s.verbsFailed(nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_poll_cq on %s: %w", s.devs[ci].device, err), true)
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
					req := s.req(slot, e)
					req.pending--
					done = done && req.pending == 0
				}
				if done {
					for e := range s.slotReq[slot] {
						s.slotReq[slot][e] = -1
					}
					s.slotMatched[slot] = 0
					s.slotPosted[slot] = false
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
	if s.commCore == nil || s.destroyed {
		return nil
	}
	s.destroy()
	if s.fifo != nil {
		s.fifo.free()
	}
	if s.sizesMem != nil {
		s.sizesMem.free()
	}
	s.release()
	s.failed = nccl.Errorf(nccl.InternalError, "NET/GoIB : send comm used after close")
	return nil
}
