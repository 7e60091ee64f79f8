package socket

import (
	"sync/atomic"
	"unsafe"

	"github.com/libnccl-net-go/libnccl-net-go/internal/reqpool"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// maxRecvs is the largest grouped receive (NCCL_NET_IB_MAX_RECVS too).
const maxRecvs = 8

// maxSends is NCCL's bound on sends in flight per comm.
const maxSends = nccl.MaxRequests * maxRecvs

type sendReq struct {
	hdr     [hdrLen]byte
	data    unsafe.Pointer
	size    int
	ctrlLen int
	off     int // bytes of header + inline payload written
	seq     uint32
	striped bool
	left    atomic.Int32 // chunks not yet written to the data streams
}

// sendComm is the sending end. Everything but the helpers runs on NCCL's
// progress thread; its state needs no lock.
type sendComm struct {
	core
	inline int
	// idleInline: a message up to this size also goes inline when nothing
	// else is in flight on the connection (see Isend).
	idleInline int

	reqs *reqpool.Pool[sendReq]

	// txq holds requests whose header (and inline payload) is not fully
	// written yet, in message order.
	txq         [maxSends]int16
	txHead, txN int
	seq         uint32
	iw          iovWriter
}

func newSendComm(cs conns, hi handleInfo, o sockOpts, log nccl.Logger, d *drainer) (*sendComm, error) {
	s := &sendComm{inline: o.inline, reqs: reqpool.New[sendReq](maxSends)}
	s.drain = d
	s.idleInline = max(s.inline, o.idleInline)
	boundLocalSndBuf(append([]int{cs.ctrl}, cs.data...), o, log)
	if err := s.core.init(cs, hi, o, log, true); err != nil {
		return nil, err
	}
	return s, nil
}

// PeerAddr implements nccl.PeerAddresser.
func (s *sendComm) PeerAddr() string { return s.peer }

// Isend implements nccl.SendComm. It queues the header (and small payloads)
// on the control stream and the rest on the data streams, and starts writing
// at once, on this thread.
func (s *sendComm) Isend(data unsafe.Pointer, size int, tag int, _ nccl.MemHandle) (nccl.Request, error) {
	if err := s.failed(); err != nil {
		return nccl.NoRequest, err
	}
	if s.reqs.InUse() == maxSends {
		return nccl.NoRequest, nil
	}
	// Striping pays when messages queue up; a lone message below
	// idleInline is latency-bound, and splitting it over streams costs
	// more syscalls on each side than writing it in one piece.
	idle := s.reqs.InUse() == 0
	stripable := size > s.inline && len(s.streams) > 0
	striped := stripable && (size > s.idleInline || !idle)
	if striped && !s.canStripe() {
		return nccl.NoRequest, nil
	}
	id, r, _ := s.reqs.Get()
	r.data, r.size, r.striped = data, size, striped
	r.seq = s.seq
	s.seq++
	r.ctrlLen = size
	if striped {
		r.ctrlLen = 0
	}
	putHeader(r.hdr[:], size, r.ctrlLen, tag, r.seq)
	if striped {
		s.stripe(data, 0, size, &r.left)
	}
	s.stats.count(size, r.ctrlLen, stripable && !striped)
	s.txq[(s.txHead+s.txN)%maxSends] = int16(id)
	s.txN++
	s.progress()
	return nccl.Request(id), nil
}

// progress writes what the control and data streams take now.
func (s *sendComm) progress() {
	if s.txN > 0 {
		s.flushCtrl()
	}
	if len(s.streams) > 0 {
		s.pump(true)
	}
}

// flushCtrl writes queued headers and inline payloads, several messages per
// sendmsg, until the socket would block.
func (s *sendComm) flushCtrl() {
	for s.txN > 0 && s.err.Load() == nil {
		s.iw.reset()
		for i := 0; i < s.txN && s.iw.n+2 <= maxIov; i++ {
			r := s.reqs.At(int(s.txq[(s.txHead+i)%maxSends]))
			if r.off < hdrLen {
				s.iw.add(unsafe.Pointer(&r.hdr[r.off]), hdrLen-r.off)
				s.iw.add(r.data, r.ctrlLen)
			} else {
				p := r.off - hdrLen
				s.iw.add(unsafe.Add(r.data, p), r.ctrlLen-p)
			}
		}
		n, err := s.iw.flush(s.ctrl)
		if err != nil {
			s.fail(nccl.SystemError, "sending to %s failed: %v", s.peer, err)
			return
		}
		if n == 0 {
			return
		}
		for n > 0 {
			r := s.reqs.At(int(s.txq[s.txHead]))
			k := min(n, hdrLen+r.ctrlLen-r.off)
			r.off += k
			n -= k
			if r.off == hdrLen+r.ctrlLen {
				s.txHead = (s.txHead + 1) % maxSends
				s.txN--
			}
		}
	}
}

// Test implements nccl.SendComm.
func (s *sendComm) Test(req nccl.Request) (bool, int, error) {
	r := s.reqs.At(int(req))
	if r == nil {
		return false, 0, nccl.Errorf(nccl.InvalidArgument, "test of send request %d that is not in flight", req)
	}
	if r.off < hdrLen+r.ctrlLen || r.left.Load() != 0 {
		s.progress()
	}
	if r.off == hdrLen+r.ctrlLen && r.left.Load() == 0 {
		size := r.size
		s.complete(int(req))
		return true, size, nil
	}
	if err := s.failed(); err != nil {
		return false, 0, err
	}
	// A send waits for the receiver to read, however long that takes, as
	// long as the receiver is alive (live.go). A receiver that closed its
	// end will never read what is still queued here.
	// A helper holding a stream may have handed the rest to the kernel and
	// be descheduled before counting it: the peer then closed after reading
	// everything. Ask again on a later call, once the helper let go (it only
	// holds a stream for non-blocking sends).
	if s.checkLive() == livePeerClosed && !s.streamHeld() {
		// A helper counts its last chunk before it lets go of the stream, so
		// a request it finished between the check above and this one is
		// done here, not failed.
		if r.off == hdrLen+r.ctrlLen && r.left.Load() == 0 {
			size := r.size
			s.complete(int(req))
			return true, size, nil
		}
		s.fail(nccl.SystemError, "the peer %s closed the connection (process exited or comm closed) before receiving everything sent", s.peer)
	}
	if err := s.failed(); err != nil {
		return false, 0, err
	}
	return false, 0, nil
}

// RegMr implements nccl.Comm.
func (s *sendComm) RegMr(data unsafe.Pointer, size int, t nccl.PtrType) (nccl.MemHandle, error) {
	return s.regMr(data, size, t)
}

// DeregMr implements nccl.Comm: a fence for the helpers (core.deregMr).
func (s *sendComm) DeregMr(mh nccl.MemHandle) error { return s.deregMr(mh) }

// Close implements nccl.Comm.
// With a send pending it is an abort: a message cut short fails at the
// receiver however its bytes end, so no stream is worth keeping.
func (s *sendComm) Close() error { return s.close(s.reqs.InUse() == 0) }

// complete returns a finished send's request.
func (s *sendComm) complete(id int) {
	s.reqs.Put(id)
	s.live.requestDone(s.reqs.InUse())
}
