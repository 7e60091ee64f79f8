package softnic

import (
	"errors"
	"fmt"

	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
)

// cqe is a completion plus the bookkeeping the model needs when it is polled.
type cqe struct {
	wc     verbs.WC
	q      *qp
	retire int // send-queue slots this completion frees
}

// cq is a completion queue: a fixed ring, so polling never allocates.
type cq struct {
	ctx     *context
	id      uint64
	ring    []cqe
	head, n int
	overrun bool
	gone    bool
}

var errOverrun = errors.New("softnic: completion queue overrun")

func (c *cq) ID() uint64 { return c.id }

func (c *cq) pushLocked(e cqe) {
	if c.n == len(c.ring) {
		if !c.overrun {
			c.overrun = true
			c.ctx.dev.deliverLocked(verbs.AsyncEvent{Type: verbs.EventCQErr, CQID: c.id})
		}
		return
	}
	c.ring[(c.head+c.n)%len(c.ring)] = e
	c.n++
}

func (c *cq) aliveLocked(call string) error {
	if err := c.ctx.aliveLocked(call); err != nil {
		return err
	}
	if c.gone {
		return c.ctx.dev.fabric.violationLocked("%s on a destroyed CQ of %s", call, c.ctx.dev.cfg.Name)
	}
	return nil
}

func (c *cq) Poll(wcs []verbs.WC) (int, error) {
	f := c.ctx.dev.fabric
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := c.aliveLocked("ibv_poll_cq"); err != nil {
		return 0, err
	}
	if c.overrun {
		return 0, fmt.Errorf("%w (%d entries): %w", errOverrun, len(c.ring), verbs.Errno(5))
	}
	k := 0
	for k < len(wcs) && c.n > 0 {
		e := &c.ring[c.head]
		wcs[k] = e.wc
		if e.retire > 0 {
			e.q.sqOut -= e.retire
		}
		*e = cqe{}
		c.head = (c.head + 1) % len(c.ring)
		c.n--
		k++
	}
	return k, nil
}

func (c *cq) Destroy() error {
	f := c.ctx.dev.fabric
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := c.aliveLocked("ibv_destroy_cq"); err != nil {
		return err
	}
	for _, q := range c.ctx.dev.qps {
		if q.sendCQ == c || q.recvCQ == c {
			return fmt.Errorf("softnic: CQ still used by QP %#x: %w", q.num, verbs.Errno(16)) // EBUSY
		}
	}
	c.gone = true
	delete(c.ctx.cqs, c.id)
	return nil
}

type qpState int

const (
	qpsReset qpState = iota
	qpsInit
	qpsRTR
	qpsRTS
	qpsErr
	qpsDestroyed
)

// maxInline is the largest max_inline_data a QP may ask for (rxe allows a
// few hundred bytes, ConnectX about 1 KiB).
const maxInline = 1024

// blockedWR is a send WR waiting for the responder (RNR). Inline data is
// copied at post time, as the NIC does: the caller may reuse the source
// buffer as soon as ibv_post_send returns.
type blockedWR struct {
	wr     verbs.SendWR
	inline []byte // capacity maxInline of the QP; wr.SGE.Length bytes valid
}

// qp is an RC queue pair.
type qp struct {
	num       uint32
	pd        *pd
	dev       *Device
	sendCQ    *cq
	recvCQ    *cq
	maxSend   int
	maxInline int
	state     qpState
	access    verbs.Access
	port      int
	rtr       verbs.RTRAttr
	rts       verbs.RTSAttr
	ece       verbs.ECE

	rq          []verbs.RecvWR // ring of posted receives
	rqHead, rqN int
	sqOut       int // posted send WRs whose slot has not been released yet
	sinceSignal int // executed WRs not covered by a completion yet
	blocked     []blockedWR
	blHead, blN int // ring of WRs waiting for the responder (RNR)
	waiters     []*qp
	spare       []*qp
	waitingOn   *qp
	held        []cqe // send completions a CompletionLag holds back, in order
}

func (q *qp) Num() uint32 { return q.num }

// lock takes the fabric mutex; callers defer q.unlock() (a plain method
// call: returning the unlock func would allocate on every post).
func (q *qp) lock()   { q.dev.fabric.mu.Lock() }
func (q *qp) unlock() { q.dev.fabric.mu.Unlock() }

// aliveLocked refuses calls on a destroyed QP or one whose context closed.
func (q *qp) aliveLocked(call string) error {
	if err := q.pd.ctx.aliveLocked(call); err != nil {
		return err
	}
	if q.state == qpsDestroyed {
		return q.dev.fabric.violationLocked("%s on destroyed QP %#x of %s", call, q.num, q.dev.cfg.Name)
	}
	return nil
}

func (q *qp) ModifyToInit(a verbs.InitAttr) error {
	q.lock()
	defer q.unlock()
	if err := q.aliveLocked("ibv_modify_qp(INIT)"); err != nil {
		return err
	}
	if err := q.dev.fabric.modifyFaultLocked(q.dev.cfg.Name, "INIT"); err != nil {
		return fmt.Errorf("softnic: QP %#x RESET->INIT (injected): %w", q.num, err)
	}
	if q.state != qpsReset || a.Port < 1 || a.Port > len(q.dev.ports) {
		return fmt.Errorf("softnic: QP %#x RESET->INIT (state %d, port %d): %w", q.num, q.state, a.Port, verbs.EINVAL)
	}
	q.state, q.access, q.port = qpsInit, a.Access, a.Port
	return nil
}

func (q *qp) ModifyToRTR(a verbs.RTRAttr) error {
	q.lock()
	defer q.unlock()
	if err := q.aliveLocked("ibv_modify_qp(RTR)"); err != nil {
		return err
	}
	if err := q.dev.fabric.modifyFaultLocked(q.dev.cfg.Name, "RTR"); err != nil {
		return fmt.Errorf("softnic: QP %#x INIT->RTR (injected): %w", q.num, err)
	}
	if q.state != qpsInit {
		return fmt.Errorf("softnic: QP %#x INIT->RTR from state %d: %w", q.num, q.state, verbs.EINVAL)
	}
	p := q.dev.ports[q.port-1]
	switch {
	case a.PathMTU < 1 || a.PathMTU > p.attr.ActiveMTU:
		return fmt.Errorf("softnic: QP %#x path MTU %d above the port's %d: %w", q.num, a.PathMTU, p.attr.ActiveMTU, verbs.EINVAL)
	case a.AH.IsGlobal && (a.AH.SGIDIndex < 0 || a.AH.SGIDIndex >= len(p.gids) || p.gids[a.AH.SGIDIndex].GID.IsZero()):
		return fmt.Errorf("softnic: QP %#x source GID index %d invalid: %w", q.num, a.AH.SGIDIndex, verbs.EINVAL)
	case !a.AH.IsGlobal && q.dev.cfg.LinkLayer == verbs.LinkEthernet:
		return fmt.Errorf("softnic: QP %#x: RoCE needs a global address: %w", q.num, verbs.EINVAL)
	case !a.AH.IsGlobal && p.attr.Flags&verbs.PortGRHRequired != 0:
		return fmt.Errorf("softnic: QP %#x: port %d requires a GRH (rdma_check_ah_attr): %w", q.num, q.port, verbs.EINVAL)
	case q.dev.cfg.RefuseSL && q.dev.cfg.LinkLayer != verbs.LinkEthernet && a.AH.SL > 15:
		return fmt.Errorf("softnic: QP %#x service level %d out of range: %w", q.num, a.AH.SL, verbs.EINVAL)
	}
	q.state, q.rtr = qpsRTR, a
	return nil
}

func (q *qp) ModifyToRTS(a verbs.RTSAttr) error {
	q.lock()
	defer q.unlock()
	if err := q.aliveLocked("ibv_modify_qp(RTS)"); err != nil {
		return err
	}
	if err := q.dev.fabric.modifyFaultLocked(q.dev.cfg.Name, "RTS"); err != nil {
		return fmt.Errorf("softnic: QP %#x RTR->RTS (injected): %w", q.num, err)
	}
	if q.state != qpsRTR {
		return fmt.Errorf("softnic: QP %#x RTR->RTS from state %d: %w", q.num, q.state, verbs.EINVAL)
	}
	q.state, q.rts = qpsRTS, a
	return nil
}

func (q *qp) QueryECE() (verbs.ECE, error) {
	q.lock()
	defer q.unlock()
	if err := q.aliveLocked("ibv_query_ece"); err != nil {
		return verbs.ECE{}, err
	}
	return q.ece, nil
}

func (q *qp) SetECE(e verbs.ECE) error {
	q.lock()
	defer q.unlock()
	if err := q.aliveLocked("ibv_set_ece"); err != nil {
		return err
	}
	q.ece = e
	return nil
}

func (q *qp) Destroy() error {
	q.lock()
	defer q.unlock()
	if err := q.aliveLocked("ibv_destroy_qp"); err != nil {
		return err
	}
	q.state = qpsDestroyed
	delete(q.dev.qps, q.num)
	if q.waitingOn != nil {
		r := q.waitingOn
		for i, w := range r.waiters {
			if w == q {
				r.waiters = append(r.waiters[:i], r.waiters[i+1:]...)
				break
			}
		}
		q.waitingOn = nil
	}
	return nil
}

func (q *qp) PostRecv(wrs []verbs.RecvWR) (int, error) {
	q.lock()
	defer q.unlock()
	if err := q.aliveLocked("ibv_post_recv"); err != nil {
		return 0, err
	}
	for i := range wrs {
		wr := &wrs[i]
		// Stricter than mlx5, whose provider drops a 0-length SGE (the
		// hardware's data segment would read a byte count of 0 as 2 GiB;
		// other providers may pass it on). Receive WRs that only catch
		// immediates have no SGE.
		if q.state == qpsReset || wr.NumSGE > 1 || wr.NumSGE == 1 && wr.SGE.Length == 0 {
			return i, fmt.Errorf("softnic: post_recv on QP %#x (state %d, %d SGEs of %d bytes): %w", q.num, q.state, wr.NumSGE, wr.SGE.Length, verbs.EINVAL)
		}
		if q.state == qpsErr {
			q.recordRecvLocked(wr)
			q.recvCQ.pushLocked(cqe{wc: verbs.WC{WRID: wr.WRID, Status: verbs.WCWRFlushErr, Opcode: verbs.WCRecv, QPNum: q.num}})
			continue
		}
		if q.rqN == len(q.rq) {
			return i, fmt.Errorf("softnic: receive queue of QP %#x full: %w", q.num, verbs.ENOMEM)
		}
		q.recordRecvLocked(wr)
		q.rq[(q.rqHead+q.rqN)%len(q.rq)] = *wr
		q.rqN++
	}
	// Requesters that hit RNR on this QP retry now, in order.
	if len(q.waiters) > 0 {
		// Swap in the spare slice: a requester that blocks again re-registers
		// on q.waiters while we iterate the old list.
		ws := q.waiters
		q.waiters, q.spare = q.spare[:0], nil
		for _, w := range ws {
			w.waitingOn = nil
			w.runBlockedLocked()
		}
		q.spare = ws[:0]
	}
	return len(wrs), nil
}

func (q *qp) PostSend(wrs []verbs.SendWR) (int, error) {
	q.lock()
	defer q.unlock()
	if err := q.aliveLocked("ibv_post_send"); err != nil {
		return 0, err
	}
	for i := range wrs {
		wr := &wrs[i]
		inline := wr.Flags&verbs.SendInline != 0
		switch {
		case q.state != qpsRTS && q.state != qpsErr:
			return i, fmt.Errorf("softnic: post_send on QP %#x that is not RTS: %w", q.num, verbs.EINVAL)
		case wr.NumSGE > 1 || inline && (wr.NumSGE == 0 || int(wr.SGE.Length) > q.maxInline):
			return i, fmt.Errorf("softnic: post_send on QP %#x: %d SGEs, inline %v of %d bytes (max_inline_data %d): %w",
				q.num, wr.NumSGE, inline, wr.SGE.Length, q.maxInline, verbs.EINVAL)
		case q.sqOut >= q.maxSend:
			return i, fmt.Errorf("softnic: send queue of QP %#x full (%d WRs not retired; signal more often): %w", q.num, q.sqOut, verbs.ENOMEM)
		}
		if err := q.dev.fabric.matchPostFaultLocked(q.dev.cfg.Name, q.num, wr.Opcode); err != nil {
			return i, fmt.Errorf("softnic: post_send on QP %#x (injected): %w", q.num, err)
		}
		q.recordSendLocked(wr)
		q.sqOut++
		var data []byte
		if inline {
			// The data is copied now: the WR no longer refers to memory
			// (its lkey is not even looked at).
			m := q.dev.containingLocked(q.pd, wr.SGE.Addr, wr.SGE.Length)
			if m == nil {
				q.completeLocked(wr, verbs.WCLocProtErr, 0)
				continue
			}
			data = m.bytes(wr.SGE.Addr, wr.SGE.Length)
		}
		switch {
		case q.state == qpsErr:
			q.flushSendLocked(*wr)
		case q.blN > 0:
			q.pushBlocked(wr, data)
		case !q.execLocked(wr, data):
			q.pushBlocked(wr, data)
			q.waitOnResponder()
		}
	}
	return len(wrs), nil
}

func (q *qp) pushBlocked(wr *verbs.SendWR, inline []byte) {
	b := &q.blocked[(q.blHead+q.blN)%len(q.blocked)]
	b.wr = *wr
	if inline != nil {
		copy(b.inline, inline)
	}
	q.blN++
}

func (q *qp) waitOnResponder() {
	if q.waitingOn != nil {
		return
	}
	if r := q.responderLocked(); r != nil {
		q.waitingOn = r
		r.waiters = append(r.waiters, q)
	}
}

func (q *qp) runBlockedLocked() {
	for q.blN > 0 && q.state == qpsRTS {
		b := &q.blocked[q.blHead]
		var inline []byte
		if b.wr.Flags&verbs.SendInline != 0 {
			inline = b.inline[:b.wr.SGE.Length]
		}
		if !q.execLocked(&b.wr, inline) {
			q.waitOnResponder()
			return
		}
		b.wr = verbs.SendWR{}
		q.blHead = (q.blHead + 1) % len(q.blocked)
		q.blN--
	}
}

func (q *qp) responderLocked() *qp {
	var from verbs.GID
	if gids := q.dev.ports[q.port-1].gids; len(gids) > 0 {
		from = gids[0].GID
	}
	d := q.dev.fabric.resolveLocked(q.rtr.AH, from)
	if d == nil {
		return nil
	}
	return d.qps[q.rtr.DestQPN]
}

func wcOpcode(op verbs.Opcode) verbs.WCOpcode {
	switch op {
	case verbs.WrRDMARead:
		return verbs.WCRDMARead
	case verbs.WrSend:
		return verbs.WCSend
	}
	return verbs.WCRDMAWrite
}

func (q *qp) completeLocked(wr *verbs.SendWR, st verbs.WCStatus, n uint32) {
	q.sinceSignal++
	if st == verbs.WCSuccess && wr.Flags&verbs.SendSignaled == 0 {
		return
	}
	q.pushSendLocked(cqe{wc: verbs.WC{WRID: wr.WRID, Status: st, Opcode: wcOpcode(wr.Opcode), ByteLen: n, QPNum: q.num}, q: q, retire: q.sinceSignal}, wr.Opcode)
	q.sinceSignal = 0
	if st != verbs.WCSuccess {
		q.toErrorLocked()
	}
}

func (q *qp) flushSendLocked(wr verbs.SendWR) {
	q.pushSendLocked(cqe{wc: verbs.WC{WRID: wr.WRID, Status: verbs.WCWRFlushErr, Opcode: wcOpcode(wr.Opcode), QPNum: q.num}, q: q, retire: 1}, wr.Opcode)
}

// pushSendLocked queues a send completion, or holds it back while a
// CompletionLag matches it or an earlier one of this QP is held (a QP's
// completions come in posting order).
func (q *qp) pushSendLocked(e cqe, op verbs.Opcode) {
	if len(q.held) > 0 || q.dev.fabric.lagLocked(q.dev.cfg.Name, op) {
		q.held = append(q.held, e)
		return
	}
	q.sendCQ.pushLocked(e)
}

// toErrorLocked moves the QP to the error state: queued sends and posted
// receives complete with IBV_WC_WR_FLUSH_ERR.
func (q *qp) toErrorLocked() {
	if q.state == qpsErr || q.state == qpsDestroyed {
		return
	}
	q.state = qpsErr
	for ; q.blN > 0; q.blN-- {
		q.flushSendLocked(q.blocked[q.blHead].wr)
		q.blHead = (q.blHead + 1) % len(q.blocked)
	}
	for ; q.rqN > 0; q.rqN-- {
		q.recvCQ.pushLocked(cqe{wc: verbs.WC{WRID: q.rq[q.rqHead].WRID, Status: verbs.WCWRFlushErr, Opcode: verbs.WCRecv, QPNum: q.num}})
		q.rqHead = (q.rqHead + 1) % len(q.rq)
	}
}

// execLocked runs one WR (inline holds its data when it was posted inline).
// It returns false when the responder has no receive posted and the
// requester keeps retrying (rnr_retry 7 = forever).
//
// The checks are the ones a ConnectX makes: a local SGE needs a live lkey of
// this PD covering it (local write access for READ targets) and must not be
// 0 bytes long (stricter than mlx5's provider, which drops such an SGE: the
// hardware would read a byte count of 0 as 2 GiB); an RDMA operation
// needs a non-zero rkey and remote address even when it moves no data, and,
// when it moves data, a live MR of the responder's PD covering the range
// with the access the operation needs, on a QP that grants it too.
func (q *qp) execLocked(wr *verbs.SendWR, inline []byte) bool {
	if st, ok := q.dev.fabric.matchFaultLocked(q.dev.cfg.Name, q.num, wr.Opcode); ok {
		q.completeLocked(wr, st, 0)
		return true
	}
	var local []byte
	n := uint32(0)
	if wr.NumSGE == 1 {
		n = wr.SGE.Length
		if n == 0 {
			q.completeLocked(wr, verbs.WCLocLenErr, 0)
			return true
		}
	}
	switch {
	case inline != nil:
		local = inline
	case n > 0:
		m := q.dev.mrs[wr.SGE.LKey]
		if m == nil || m.pd != q.pd || !m.contains(wr.SGE.Addr, n) ||
			wr.Opcode == verbs.WrRDMARead && m.access&verbs.AccessLocalWrite == 0 {
			q.completeLocked(wr, verbs.WCLocProtErr, 0)
			return true
		}
		local = m.bytes(wr.SGE.Addr, n)
	}
	r := q.responderLocked()
	if r == nil || r.state < qpsRTR || r.state >= qpsErr {
		// Nobody answers: the requester retries until retry_cnt runs out.
		q.completeLocked(wr, verbs.WCRetryExcErr, 0)
		return true
	}
	remote := func(need verbs.Access) []byte {
		if wr.RKey == 0 || wr.RemoteAddr == 0 || r.access&need == 0 {
			return nil
		}
		if n == 0 {
			return []byte{}
		}
		m := r.dev.mrs[wr.RKey]
		if m == nil || m.pd != r.pd || !m.contains(wr.RemoteAddr, n) || m.access&need == 0 {
			return nil
		}
		return m.bytes(wr.RemoteAddr, n)
	}
	accessErr := func() bool {
		q.completeLocked(wr, verbs.WCRemAccessErr, 0)
		r.toErrorLocked()
		r.dev.deliverLocked(verbs.AsyncEvent{Type: verbs.EventQPAccessErr, QPNum: r.num})
		return true
	}
	switch wr.Opcode {
	case verbs.WrRDMAWrite, verbs.WrRDMAWriteWithImm:
		dst := remote(verbs.AccessRemoteWrite)
		if dst == nil {
			return accessErr()
		}
		if wr.Opcode == verbs.WrRDMAWriteWithImm && r.rqN == 0 {
			return q.rnrLocked(wr)
		}
		copy(dst, local)
		if wr.Opcode == verbs.WrRDMAWriteWithImm {
			rw := r.popRecv()
			r.recvCQ.pushLocked(cqe{wc: verbs.WC{WRID: rw.WRID, Opcode: verbs.WCRecvRDMAWithImm, ByteLen: n, Imm: wr.Imm, WithImm: 1, QPNum: r.num}})
		}
	case verbs.WrRDMARead:
		if inline != nil {
			q.completeLocked(wr, verbs.WCLocQPOpErr, 0) // READ cannot be inline
			return true
		}
		src := remote(verbs.AccessRemoteRead)
		if src == nil {
			return accessErr()
		}
		copy(local, src)
	case verbs.WrSend:
		if r.rqN == 0 {
			return q.rnrLocked(wr)
		}
		rw := r.popRecv()
		var dst []byte
		if n > 0 {
			m := r.dev.mrs[rw.SGE.LKey]
			if rw.NumSGE == 0 || n > rw.SGE.Length || m == nil || m.pd != r.pd || !m.contains(rw.SGE.Addr, n) || m.access&verbs.AccessLocalWrite == 0 {
				r.recvCQ.pushLocked(cqe{wc: verbs.WC{WRID: rw.WRID, Status: verbs.WCLocLenErr, Opcode: verbs.WCRecv, QPNum: r.num}})
				r.toErrorLocked()
				q.completeLocked(wr, verbs.WCRemInvReqErr, 0)
				return true
			}
			dst = m.bytes(rw.SGE.Addr, n)
		}
		copy(dst, local)
		r.recvCQ.pushLocked(cqe{wc: verbs.WC{WRID: rw.WRID, Opcode: verbs.WCRecv, ByteLen: n, QPNum: r.num}})
	default:
		q.completeLocked(wr, verbs.WCLocQPOpErr, 0)
		return true
	}
	q.completeLocked(wr, verbs.WCSuccess, n)
	return true
}

func (q *qp) rnrLocked(wr *verbs.SendWR) bool {
	if q.rts.RNRRetry < 7 {
		q.completeLocked(wr, verbs.WCRNRRetryExcErr, 0)
		return true
	}
	return false
}

func (q *qp) popRecv() verbs.RecvWR {
	rw := q.rq[q.rqHead]
	q.rqHead = (q.rqHead + 1) % len(q.rq)
	q.rqN--
	return rw
}
