package socket

import (
	"sync/atomic"
	"unsafe"

	"github.com/libnccl-net-go/libnccl-net-go/internal/reqpool"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

type recvBuf struct {
	p    unsafe.Pointer
	size int
	tag  int
}

type recvReq struct {
	n       int
	bufs    [maxRecvs]recvBuf
	filled  [maxRecvs]bool
	sizes   [maxRecvs]int
	matched int
	// ctrlBusy: the inline payload of a message matched to this request is
	// still arriving on the control stream.
	ctrlBusy bool
	// err: a message was larger than its buffer. The request fails once
	// every message matched to it is drained (no buffer of a request is
	// touched after test reported it), and then frees its slot.
	err  error
	left atomic.Int32 // chunks the data streams have not delivered yet
}

// free is the first buffer with tag that has no message yet, or -1.
func (q *recvReq) free(tag int) int {
	for i := 0; i < q.n; i++ {
		if !q.filled[i] && q.bufs[i].tag == tag {
			return i
		}
	}
	return -1
}

// stageSize is the control stream's read buffer: headers and inline
// payloads are read in bulk (many small messages per recv syscall) and copied
// out; long payloads are read straight into the destination.
const (
	stageSize = 128 << 10
	directMin = 4096
	// bypassMin: after an inline message this large, the next header is
	// read alone (fill) so its payload is not staged and copied: one more
	// recv for one copy less. 32 KiB is where that pays on both hosts
	// measured: NCCL's 64 KiB broadcast (32 KiB per channel) took 62 us per
	// operation instead of 74 on the 16-core GPU host, medians of five
	// alternating runs, and the harness's 32 KiB ping-pong was 1.7 us
	// faster there and unchanged on the 2-core VM, where a system call
	// costs 1.2-1.5 us and 16 KiB was a little slower (docs/performance.md).
	bypassMin = 32 << 10
)

// read: every message of q has been matched and its inline payload read
// from the control stream (its data streams may still be delivering).
func (q *recvReq) read() bool { return q.matched == q.n && !q.ctrlBusy }

// done: q has all its bytes.
func (q *recvReq) done() bool { return q.read() && q.left.Load() == 0 }

// recvComm is the receiving end. Like sendComm, all of it but the helpers
// runs on NCCL's progress thread without locks.
type recvComm struct {
	core

	reqs *reqpool.Pool[recvReq]
	// postq holds posted receives that still have unmatched buffers, oldest
	// first: an incoming message goes to the first with a free buffer for
	// its tag (postq's head but for senders out of step, see match).
	postq           [nccl.MaxRequests]int8
	postHead, postN int

	stage  []byte
	sr, sw int

	// The message whose inline payload is being read.
	cur     bool
	curReq  *recvReq
	curDst  unsafe.Pointer // nil: discard (truncated)
	curOff  int
	curLeft int
	expect  uint32 // sequence number of the next header
	bigNext bool   // the last matched message had a large inline payload
	polls   uint32
	// Delayed ACKs on the control stream (setAckMode): ackReads counts reads
	// that brought data since the last decision, taken every ackEvery of
	// them (0: the kernel's rule stays, NCCL_GO_SOCKET_QUICKACK=1 or the
	// option failed); ackBulk: a message since then had more than
	// ackSmallMax bytes inline; ackDelayed: the mode was last entered, not
	// left.
	ackReads, ackEvery  uint32
	ackBulk, ackDelayed bool
	// ctrlEOF: the sender closed its end. Messages already on the wire are
	// still delivered (the sender closes once its sends are handed to the
	// kernel, not once they arrived); only a receive that needs more from
	// the control stream fails (eofWarned: and that was logged).
	ctrlEOF, eofWarned bool
}

func newRecvComm(cs conns, hi handleInfo, o sockOpts, log nccl.Logger) (*recvComm, error) {
	r := &recvComm{stage: make([]byte, stageSize), reqs: reqpool.New[recvReq](nccl.MaxRequests)}
	if err := r.core.init(cs, hi, o, log, false); err != nil {
		return nil, err
	}
	if !o.quickAck {
		r.ackEvery = ackReassert
		r.setAckMode(true)
	}
	return r, nil
}

// PeerAddr implements nccl.PeerAddresser.
func (r *recvComm) PeerAddr() string { return r.peer }

// Irecv implements nccl.RecvComm. It only records the buffers; data moves in
// Test.
func (r *recvComm) Irecv(bufs []nccl.RecvBuffer) (nccl.Request, error) {
	if err := r.failed(); err != nil {
		return nccl.NoRequest, err
	}
	id, q, ok := r.reqs.Get()
	if !ok {
		return nccl.NoRequest, nil
	}
	q.n = len(bufs)
	for i := range bufs {
		q.bufs[i] = recvBuf{p: bufs[i].Data, size: bufs[i].Size, tag: bufs[i].Tag}
	}
	r.postq[(r.postHead+r.postN)%nccl.MaxRequests] = int8(id)
	r.postN++
	return nccl.Request(id), nil
}

// fill reads what the control stream has into the staging buffer, at most
// max bytes; false when nothing came (or the connection failed).
func (r *recvComm) fill(max int) bool {
	if r.sr == r.sw {
		r.sr, r.sw = 0, 0
	} else if r.sw == len(r.stage) {
		r.sw = copy(r.stage, r.stage[r.sr:r.sw])
		r.sr = 0
	}
	if r.sw == len(r.stage) || r.ctrlEOF {
		return false
	}
	n, eof, err := recvInto(r.ctrl, unsafe.Pointer(&r.stage[r.sw]), min(max, len(r.stage)-r.sw))
	if err != nil {
		r.streamFailed(err, false)
		return false
	}
	if eof {
		r.senderClosed()
		return false
	}
	if n == 0 {
		return false
	}
	r.sw += n
	if r.ackEvery != 0 {
		if r.ackReads++; r.ackReads >= r.ackEvery {
			r.setAckMode(!r.ackBulk)
		}
	}
	return true
}

// senderClosed records the control stream's end of file. Chunks of a
// matched message may still be arriving on the data streams, from a host
// that can die before they all came: watchStreamsAfterClose bounds that wait.
// (Test arms the same watch when only the liveness stream has said so.)
func (r *recvComm) senderClosed() {
	r.ctrlEOF = true
	r.watchStreamsAfterClose()
}

// setAckMode enters the kernel's delayed-ACK mode on the control stream
// (sockopts.go, setAcks), again each time, since the kernel leaves it by
// itself; or, for a stream that carried large messages, leaves it once. A
// bulk stream wants the ACK that the kernel's own rule sends when a read
// empties the socket: it frees the sender's bounded send queue sooner
// (1 MiB messages on the 2-core VM moved about a tenth less without it). A
// failure costs only latency: the connection keeps the kernel's rule, and
// says so once.
func (r *recvComm) setAckMode(delayed bool) {
	r.ackReads, r.ackBulk = 0, false
	if !delayed && !r.ackDelayed {
		return
	}
	if err := setAcks(r.ctrl, delayed); err != nil {
		r.ackEvery = 0
		mode := "delayed ACKs"
		if delayed {
			mode = "the kernel's ACK rule"
		}
		r.log.Infof(nccl.SubsysNet, "NET/GoSocket : receive connection from %s stays with %s: setting TCP_QUICKACK failed: %v", r.peer, mode, err)
		return
	}
	r.ackDelayed = delayed
}

// progress moves what the control and data streams have for posted
// receives; the control stream is read until it is empty or the receive
// under test, q, is complete.
func (r *recvComm) progress(q *recvReq, ctrl bool) {
	if ctrl {
		r.drain(q)
	}
	if len(r.streams) > 0 {
		r.pump(false)
	}
}

// drain stops once q is complete: reading on would mostly find the socket
// empty, one more recvfrom on the round trip's critical path before NCCL
// learns that the message arrived, and a message behind it is read by the
// next call. A q still waiting for its data streams does not stop it: then
// matching the messages behind q lets their chunks be read meanwhile.
func (r *recvComm) drain(q *recvReq) {
	for r.err.Load() == nil {
		if q.done() {
			return
		}
		if r.cur {
			if avail := r.sw - r.sr; avail > 0 {
				k := min(avail, r.curLeft)
				if r.curDst != nil {
					copy(nccl.HostBytes(unsafe.Add(r.curDst, r.curOff), k), r.stage[r.sr:r.sr+k])
				}
				r.sr += k
				r.curOff += k
				r.curLeft -= k
			}
			if r.curLeft == 0 {
				r.cur = false
				r.curReq.ctrlBusy = false
				r.curReq = nil
				continue
			}
			if r.curDst != nil && r.curLeft >= directMin {
				n, eof, err := recvInto(r.ctrl, unsafe.Add(r.curDst, r.curOff), r.curLeft)
				if err != nil {
					r.streamFailed(err, false)
					return
				}
				if eof {
					r.senderClosed()
					return
				}
				if n == 0 {
					return
				}
				r.curOff += n
				r.curLeft -= n
				continue
			}
			if !r.fill(len(r.stage)) {
				return
			}
			continue
		}
		if r.sw-r.sr < hdrLen {
			// After a large inline message the next is likely large too:
			// read just its header, so that its payload goes straight into
			// the destination instead of through the staging buffer.
			want := len(r.stage)
			if r.bigNext {
				want = hdrLen - (r.sw - r.sr)
			}
			if !r.fill(want) || r.sw-r.sr < hdrLen {
				return
			}
		}
		if r.postN == 0 {
			return // the message waits for its receive
		}
		if !r.match() {
			return
		}
	}
}

// match takes the header at the front of the staging buffer and gives its
// message a buffer of the oldest posted receive: the first unfilled one with
// the sender's tag.
func (r *recvComm) match() bool {
	h := r.stage[r.sr : r.sr+hdrLen]
	m, err := parseHeader(h, r.expect, len(r.streams))
	if err != nil {
		r.fail(nccl.SystemError, "protocol error on the control stream from %s (message %d: %v; header %x); the connection is unusable",
			r.peer, r.expect, err, h)
		return false
	}
	size, ctrlLen, tag := m.size, m.ctrlLen, m.tag
	r.bigNext = ctrlLen >= bypassMin
	r.ackBulk = r.ackBulk || ctrlLen > ackSmallMax
	if size > ctrlLen && !r.canStripe() {
		return false // a stream queue is full: match once it drained
	}
	// The oldest posted receive with a free buffer for the tag takes the
	// message (nearly always the oldest of all): per-tag order, as NCCL's IB
	// transport matches a send to the first clear-to-send whose buffer with
	// its tag is free, so that the senders of a grouped receive with
	// distinct tags need not keep in step.
	var q *recvReq
	at, slot := 0, -1
	for ; at < r.postN; at++ {
		q = r.reqs.At(int(r.postq[(r.postHead+at)%nccl.MaxRequests]))
		if slot = q.free(tag); slot >= 0 {
			break
		}
	}
	if slot < 0 {
		// Not waiting for a later receive, as an IB send would: this is one
		// ordered stream, and every message behind this one would wait
		// with it, those the posted receives lack included.
		q = r.reqs.At(int(r.postq[r.postHead]))
		tags := make([]int, q.n)
		for i := range tags {
			tags[i] = q.bufs[i].tag
		}
		r.fail(nccl.InvalidUsage, "a message from %s with tag %d matches no free buffer of the posted receives (the oldest has tags %v): "+
			"the sender's tags and the receiver's disagree, or the sender is further ahead than the receives posted", r.peer, tag, tags)
		return false
	}
	r.sr += hdrLen
	r.expect++
	q.filled[slot] = true
	q.matched++
	if q.matched == q.n {
		// It leaves postq now, wherever it is: Test may free it once it
		// completes, and its id come back in a new receive.
		if at == 0 {
			r.postHead = (r.postHead + 1) % nccl.MaxRequests
		} else {
			for k := at; k < r.postN-1; k++ {
				r.postq[(r.postHead+k)%nccl.MaxRequests] = r.postq[(r.postHead+k+1)%nccl.MaxRequests]
			}
		}
		r.postN--
	}
	dst := q.bufs[slot].p
	if size > q.bufs[slot].size {
		if q.err == nil {
			e := nccl.Errorf(nccl.InvalidUsage, "message truncated: peer %s sent %d bytes, the posted receive holds %d; "+
				"the ranks disagree on the message size (a mismatch in collective sizes or in settings such as NCCL_PROTO "+
				"or NCCL_ALGO between ranks); the message is discarded, the connection stays usable",
				r.peer, size, q.bufs[slot].size)
			r.log.Warnf("NET/GoSocket : %v", e)
			q.err = e
		}
		dst = nil
	} else {
		q.sizes[slot] = size
	}
	if ctrlLen > 0 {
		r.cur, r.curReq, r.curDst, r.curOff, r.curLeft = true, q, dst, 0, ctrlLen
		q.ctrlBusy = true
	}
	r.stripe(dst, ctrlLen, size, &q.left)
	r.stats.count(size, ctrlLen, false) // why it went inline is the sender's to know
	return true
}

// Test implements nccl.RecvComm.
func (r *recvComm) Test(req nccl.Request, sizes []int) (bool, error) {
	q := r.reqs.At(int(req))
	if q == nil {
		return false, nccl.Errorf(nccl.InvalidArgument, "test of receive request %d that is not in flight", req)
	}
	// A receive that only waits for its data streams needs nothing from the
	// control stream; it still reads it now and then so later messages get
	// matched (and their chunks queued) while this one drains.
	r.polls++
	r.progress(q, !q.read() || r.polls&7 == 0)
	if q.done() {
		err := q.err
		if err == nil {
			copy(sizes, q.sizes[:q.n])
		}
		r.reqs.Put(int(req))
		r.live.requestDone(r.reqs.InUse())
		return err == nil, err
	}
	if err := r.failed(); err != nil {
		return false, err
	}
	// Only a receive that still needs the control stream (its header or
	// inline bytes; progress has just read all there was) fails on the
	// sender's close, and only it: one already matched keeps waiting, since
	// its chunks were handed to the kernel before the close and are still
	// arriving on the data streams, whose own end of file tells if they stop
	// short. Failing the connection instead would fail those too, whichever
	// request NCCL happened to test first.
	if r.ctrlEOF && !q.read() {
		e := nccl.Errorf(nccl.SystemError, "the peer %s closed the connection (process exited or comm closed) while receives were still posted", r.peer)
		if !r.eofWarned {
			r.eofWarned = true
			r.log.Warnf("NET/GoSocket : %v", e)
		}
		return false, e
	}
	// A receive waits for its message however long the sender takes, as
	// long as the sender is alive (live.go). A sender that closed is seen
	// on the control and data streams themselves (end of file after the
	// last byte it sent), so the liveness stream's end of file is no
	// verdict here. It does say that the sender closed, though, also when
	// the control stream's own end of file is not read yet (a later header
	// waits for its receive, or a data-stream queue is full): the bytes
	// still owed on the control and data streams need their keepalive as
	// much.
	if r.checkLive() == livePeerClosed {
		r.watchStreamsAfterClose()
	}
	if err := r.failed(); err != nil {
		return false, err
	}
	return false, nil
}

// Iflush implements nccl.RecvComm: host memory needs no flush.
func (r *recvComm) Iflush([]nccl.RecvBuffer) (nccl.Request, error) { return nccl.NoRequest, nil }

// RegMr implements nccl.Comm.
func (r *recvComm) RegMr(data unsafe.Pointer, size int, t nccl.PtrType) (nccl.MemHandle, error) {
	return r.regMr(data, size, t)
}

// DeregMr implements nccl.Comm: a fence for the helpers (core.deregMr).
func (r *recvComm) DeregMr(mh nccl.MemHandle) error { return r.deregMr(mh) }

// Close implements nccl.Comm.
func (r *recvComm) Close() error { return r.close(false) }
