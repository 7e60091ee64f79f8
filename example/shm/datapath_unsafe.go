package shm

import (
	"unsafe"

	"github.com/libnccl-net-go/libnccl-net-go/internal/reqpool"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// The data path. Only NCCL's progress thread for a comm calls into it, so the
// local state needs no lock; the peer is reached only through atomics on the
// header and copies into or out of the ring.

// copyChunk bounds one contiguous copy, so the peer can start draining early
// on large messages (the ring is published after every chunk).
const copyChunk = 256 << 10

type sendReq struct {
	data   unsafe.Pointer
	size   int
	copied int
	err    error // the send failed before any byte moved (truncation)
}

type sendComm struct {
	endpoint
	ctsHead  uint64 // CTS index of the oldest receive with unmatched buffers
	used     uint32 // buffers of that receive already matched (bit per entry)
	descHead uint64
	ringHead uint64                 // bytes produced
	ringTail uint64                 // last consumer position seen
	reqs     *reqpool.Pool[sendReq] // descCap requests, handed out as nccl.Request ids
	q        [descCap]int16         // requests with bytes still to copy, in ring order
	qHead    int
	qLen     int
}

// Isend implements nccl.SendComm. It matches the oldest posted receive, like
// NCCL's IB transport: NoRequest until the receiver posted a buffer with this
// tag, then a descriptor and as much payload as the ring takes right now.
func (s *sendComm) Isend(data unsafe.Pointer, size int, tag int, _ nccl.MemHandle) (nccl.Request, error) {
	if s.r == nil {
		return nccl.NoRequest, s.closedErr()
	}
	if s.err != nil {
		return nccl.NoRequest, s.err
	}
	h := s.r.h
	slot := int(s.ctsHead % ctsSlots)
	if h.u64(ctsOff(slot, ctsSeq)).Load() != s.ctsHead+1 {
		return nccl.NoRequest, s.idle(s.progress())
	}
	n := int(h.u32(ctsOff(slot, ctsN)).Load())
	if n < 1 || n > maxRecvs {
		s.err = nccl.Errorf(nccl.SystemError, "NET/GoShm : corrupt receive slot %d (n=%d) from %s", s.ctsHead, n, s.peer)
		return nccl.NoRequest, s.err
	}
	entry, seen := -1, false
	for i := 0; i < n; i++ {
		if int(int32(h.u32(ctsOff(slot, ctsTags+4*i)).Load())) != tag {
			continue
		}
		seen = true
		if s.used&(1<<i) == 0 {
			entry = i
			break
		}
	}
	if entry < 0 {
		if !seen {
			return nccl.NoRequest, nccl.Errorf(nccl.InvalidUsage, "NET/GoShm : isend with tag %d, but the oldest posted receive (%d buffers) has no buffer with that tag; sends must match receives in order", tag, n)
		}
		// This tag's buffer is taken; the receive's other buffers come first.
		return nccl.NoRequest, s.idle(s.progress())
	}
	if s.reqs.InUse() == descCap || s.descHead-h.u64(offRecvLine).Load() >= descCap {
		return nccl.NoRequest, s.idle(s.progress())
	}
	capacity := h.u64(ctsOff(slot, ctsSizes+8*entry)).Load()
	d := int(s.descHead % descCap)
	h.u64(descOff(d, descIdx)).Store(s.ctsHead)
	h.u32(descOff(d, descEntry)).Store(uint32(entry))
	h.u64(descOff(d, descBytes)).Store(uint64(size))
	trunc := uint64(size) > capacity
	if trunc {
		h.u32(descOff(d, descFlags)).Store(flagTrunc)
	} else {
		h.u32(descOff(d, descFlags)).Store(0)
	}
	s.descHead++
	h.u64(offSendLine).Store(s.descHead)
	s.used |= 1 << entry
	if s.used == 1<<n-1 {
		s.ctsHead++
		s.used = 0
	}
	id, rq, _ := s.reqs.Get() // cannot fail: checked above
	if trunc {
		// Nothing is copied. The receiver's Test fails with the same code; the
		// sender learns it from its own Test, which NCCL polls like any other.
		rq.err = nccl.Errorf(nccl.InvalidUsage, "%s : message truncated: sending %d bytes, but the matching receive buffer (tag %d) holds only %d; nothing was sent", logPrefix, size, tag, capacity)
		return nccl.Request(id), nil
	}
	rq.data, rq.size = data, size
	if size > 0 {
		s.q[(s.qHead+s.qLen)%descCap] = int16(id)
		s.qLen++
		s.progress()
	}
	return nccl.Request(id), nil
}

// progress copies queued payload into the ring, at most one ring's worth per
// call. It reports whether anything moved.
func (s *sendComm) progress() bool {
	if s.qLen == 0 {
		return false
	}
	h := s.r.h
	moved := false
	budget := s.r.ringSize
	s.ringTail = h.u64(offRecvLine + 8).Load()
	for s.qLen > 0 {
		rq := s.reqs.At(int(s.q[s.qHead]))
		for rq.copied < rq.size {
			free := s.r.ringSize - (s.ringHead - s.ringTail)
			pos := s.ringHead & s.mask
			n := min(uint64(rq.size-rq.copied), free, s.r.ringSize-pos, budget, copyChunk)
			if n == 0 {
				return moved
			}
			copy(s.r.ring[pos:pos+n], userBytes(rq.data, rq.copied, int(n)))
			rq.copied += int(n)
			s.ringHead += n
			budget -= n
			h.u64(offSendLine + 8).Store(s.ringHead)
			moved = true
		}
		s.qHead = (s.qHead + 1) % descCap
		s.qLen--
	}
	return moved
}

// idle runs when a call could not move anything: a closed or dead receiver
// ends the comm.
func (s *sendComm) idle(moved bool) error {
	if moved {
		return nil
	}
	err := s.w.idleCheck()
	if err == nil && s.w.closed() {
		err = nccl.Errorf(nccl.SystemError, "NET/GoShm : the receiver %s closed the connection", s.peer)
	}
	if err != nil {
		s.err = err
	}
	return err
}

// Test implements nccl.SendComm. A send is done once all its bytes are in the
// ring: NCCL may then reuse the buffer.
func (s *sendComm) Test(r nccl.Request) (bool, int, error) {
	if s.r == nil {
		return false, 0, s.closedErr()
	}
	rq := s.reqs.At(int(r))
	if rq == nil {
		return false, 0, nccl.Errorf(nccl.InternalError, "%s : test of send request %d, which is not in flight", logPrefix, r)
	}
	if s.err != nil {
		return false, 0, s.err
	}
	moved := s.progress()
	if rq.err != nil || rq.copied == rq.size {
		err, size := rq.err, rq.size
		s.reqs.Put(int(r))
		if err != nil {
			return false, 0, err
		}
		return true, size, nil
	}
	if err := s.idle(moved); err != nil {
		return false, 0, err
	}
	return false, 0, nil
}

type recvSlot struct {
	idx      uint64 // CTS index posted in this slot
	busy     bool   // posted, and not yet fully settled
	reported bool   // Test already returned its error
	n, left  int
	data     [maxRecvs]unsafe.Pointer
	caps     [maxRecvs]int
	tags     [maxRecvs]int
	got      [maxRecvs]int
	err      error
}

type recvComm struct {
	endpoint
	posted   uint64 // next CTS index
	slots    [ctsSlots]recvSlot
	descTail uint64
	ringTail uint64
	ringHead uint64 // last producer position seen
	// the message being copied out
	cur     bool
	curSlot *recvSlot
	curE    int
	curSize int
	curDone int
	discard bool
}

// Irecv implements nccl.RecvComm: publish the buffers in the next CTS slot.
func (c *recvComm) Irecv(bufs []nccl.RecvBuffer) (nccl.Request, error) {
	if c.r == nil {
		return nccl.NoRequest, c.closedErr()
	}
	if c.err != nil {
		return nccl.NoRequest, c.err
	}
	n := len(bufs)
	si := int(c.posted % ctsSlots)
	sl := &c.slots[si]
	if sl.busy {
		if !sl.reported || sl.left > 0 {
			return nccl.NoRequest, c.idle(c.progress())
		}
		sl.busy = false // an errored receive whose messages all went by
	}
	h := c.r.h
	*sl = recvSlot{idx: c.posted, busy: true, n: n, left: n}
	for i, b := range bufs {
		sl.data[i], sl.caps[i], sl.tags[i] = b.Data, b.Size, b.Tag
		h.u64(ctsOff(si, ctsSizes+8*i)).Store(uint64(b.Size))
		h.u32(ctsOff(si, ctsTags+4*i)).Store(uint32(int32(b.Tag)))
	}
	h.u32(ctsOff(si, ctsN)).Store(uint32(n))
	c.posted++
	h.u64(ctsOff(si, ctsSeq)).Store(c.posted) // publish: seq = index+1
	c.progress()
	return nccl.Request(si), nil
}

// progress drains descriptors and payload into the posted buffers, at most one
// ring's worth per call. It reports whether anything moved.
func (c *recvComm) progress() bool {
	h := c.r.h
	moved := false
	budget := c.r.ringSize
	for c.err == nil {
		if !c.cur {
			if c.descTail == h.u64(offSendLine).Load() {
				return moved
			}
			if !c.startMessage() {
				return moved
			}
			moved = true
			if !c.cur {
				continue // a truncated message: no payload follows
			}
		}
		for c.curDone < c.curSize {
			avail := c.ringHead - c.ringTail
			if avail == 0 {
				c.ringHead = h.u64(offSendLine + 8).Load()
				avail = c.ringHead - c.ringTail
			}
			pos := c.ringTail & c.mask
			n := min(uint64(c.curSize-c.curDone), avail, c.r.ringSize-pos, budget, copyChunk)
			if n == 0 {
				return moved
			}
			if !c.discard {
				copy(userBytes(c.curSlot.data[c.curE], c.curDone, int(n)), c.r.ring[pos:pos+n])
			}
			c.curDone += int(n)
			c.ringTail += n
			budget -= n
			h.u64(offRecvLine + 8).Store(c.ringTail)
			moved = true
		}
		c.finish(c.curSlot, c.curE, c.curSize)
		c.cur = false
	}
	return moved
}

// startMessage reads the descriptor at descTail. Everything in it is checked:
// a peer's bug must not make us write outside a posted buffer.
func (c *recvComm) startMessage() bool {
	h := c.r.h
	d := int(c.descTail % descCap)
	idx := h.u64(descOff(d, descIdx)).Load()
	e := int(h.u32(descOff(d, descEntry)).Load())
	flags := h.u32(descOff(d, descFlags)).Load()
	size := h.u64(descOff(d, descBytes)).Load()
	sl := &c.slots[idx%ctsSlots]
	if idx >= c.posted || c.posted-idx > ctsSlots || !sl.busy || sl.idx != idx || e >= sl.n || size > nccl.MaxNetSize {
		c.err = nccl.Errorf(nccl.SystemError, "NET/GoShm : corrupt message descriptor from %s (receive %d, buffer %d, %d bytes; %d receives posted)", c.peer, idx, e, size, c.posted)
		return false
	}
	c.descTail++
	h.u64(offRecvLine).Store(c.descTail)
	if (flags&flagTrunc != 0 || size > uint64(sl.caps[e])) && sl.err == nil {
		sl.err = nccl.Errorf(nccl.InvalidUsage, "NET/GoShm : message truncated: the sender has %d bytes for the %d-byte receive buffer with tag %d; nothing was written", size, sl.caps[e], sl.tags[e])
	}
	if flags&flagTrunc != 0 || size == 0 { // no payload follows
		c.finish(sl, e, 0)
		return true
	}
	// An oversized payload (a sender that skipped the check) or one for a
	// receive that already failed is read and dropped to keep the ring in step.
	c.cur, c.curSlot, c.curE, c.curSize, c.curDone, c.discard = true, sl, e, int(size), 0, sl.err != nil
	return true
}

func (c *recvComm) finish(sl *recvSlot, e, size int) {
	sl.got[e] = size
	sl.left--
}

// idle runs when a call could not move anything: a dead sender, or one that
// closed and left nothing more in the ring, ends the comm.
func (c *recvComm) idle(moved bool) error {
	if moved || c.err != nil {
		return c.err
	}
	err := c.w.idleCheck()
	if err == nil && c.w.closed() && !c.progress() {
		err = nccl.Errorf(nccl.SystemError, "NET/GoShm : the sender %s closed the connection with receives outstanding", c.peer)
	}
	if err != nil {
		c.err = err
	}
	return err
}

// Test implements nccl.RecvComm.
func (c *recvComm) Test(r nccl.Request, sizes []int) (bool, error) {
	if c.r == nil {
		return false, c.closedErr()
	}
	if r < 0 || int(r) >= ctsSlots || !c.slots[r].busy || c.slots[r].reported {
		return false, nccl.Errorf(nccl.InternalError, "NET/GoShm : test of receive request %d, which is not in flight", r)
	}
	if c.err != nil {
		return false, c.err
	}
	moved := c.progress()
	sl := &c.slots[r]
	if sl.err != nil {
		sl.reported = true
		return false, sl.err
	}
	if sl.left == 0 {
		for i := 0; i < sl.n && i < len(sizes); i++ {
			sizes[i] = sl.got[i]
		}
		sl.busy = false
		sl.data = [maxRecvs]unsafe.Pointer{}
		return true, nil
	}
	if err := c.idle(moved); err != nil {
		return false, err
	}
	return false, nil
}
