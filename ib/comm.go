package ib

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Protocol sizes (NCCL's): 256 request slots per comm (32 requests x 8
// receives), up to 8 buffers per grouped receive, 64-byte CTS entries.
const (
	maxRequests  = 256
	maxRecvs     = 8
	ctsEntrySize = 64
	fifoBytes    = maxRequests * maxRecvs * ctsEntrySize
	recordBytes  = maxRequests * maxRecvs * 4

	// Work-request ids carry a kind in the top byte.
	wrData  = 1 << 56
	wrCTS   = 2 << 56
	wrRecv  = 3 << 56
	wrFlush = 4 << 56
	wrKind  = 0xff << 56

	flushIDBase = maxRequests // flush request ids follow receive ids

	maxSL = 15 // an IB service level is 4 bits

	// fatalGrace bounds how long a failed data-path verbs call waits for
	// the async watcher to read the fatal event that explains it (see
	// verbsFailed).
	fatalGrace = 100 * time.Millisecond
)

// commQP is one RC QP of a connection.
type commQP struct {
	qp     verbs.QP
	dev    int // local member index
	remDev int // remote member index
}

// commDev is what a connection uses of one member device: the GID it
// resolved when the connection was made (so a RoCE address that changed
// during a long job is picked up by the next connection).
type commDev struct {
	*device
	gidIndex int
	gid      verbs.GID
}

// commCore is what send and receive comms share: devices, CQs (one per
// member device), QPs striped over the members, and failure state.
type commCore struct {
	t          *Transport
	cfg        *config
	log        nccl.Logger
	name       string
	devs       []commDev
	ptrSupport nccl.PtrType
	cqs        []verbs.CQ
	qps        []commQP
	nDataQPs   int
	peer       string
	setup      setupBound // what ends a QP transition's retries (set-up only)

	fatal     atomic.Pointer[string] // set by the async watcher: this comm's or its devices' fatal event
	failed    error                  // sticky data-path failure (progress thread only)
	wcs       [64]verbs.WC
	watch     peerWatch // the kept handshake connection (progress thread only)
	destroyed bool
	released  bool
}

// setFatal keeps the first fatal event: later ones are its consequences.
func (c *commCore) setFatal(msg string) { c.fatal.CompareAndSwap(nil, &msg) }

// check fails fast once the comm or one of its devices has failed. It runs at
// the top of every data-path call: one atomic load, no locks. The watcher
// marks every comm of a device that dies (NCCL_IB_RETURN_ASYNC_EVENTS=0 keeps
// it from marking any), so the devices need no look here.
func (c *commCore) check() error {
	if c.failed != nil {
		return c.failed
	}
	if m := c.fatal.Load(); m != nil {
		c.failed = c.fatalError(*m, "")
		return c.failed
	}
	return nil
}

// fatalError is the comm's error for the fatal event the watcher recorded,
// with the verbs call it explains, if one failed first.
func (c *commCore) fatalError(event, failedCall string) error {
	if failedCall != "" {
		return nccl.Errorf(nccl.SystemError, "NET/GoIB : communicator with %s encountered a fatal error: %s (the call that failed: %s)", c.peer, event, failedCall)
	}
	return nccl.Errorf(nccl.SystemError, "NET/GoIB : communicator with %s encountered a fatal error: %s", c.peer, event)
}

// verbsFailed records err, the failure of a data-path verbs call, as the
// comm's sticky failure. A device or QP that dies makes verbs calls fail
// before the async watcher, on another thread, has read the event that says
// why: rxe's post and poll return EIO, and a QP the device moved to the
// error state flushes its work requests. Reporting that errno would hide the
// cause (and, for a flushed completion, blame the peer), so when wait is set
// the call waits up to fatalGrace for the event and reports it instead; a
// failure with no fatal event behind it (or NCCL_IB_RETURN_ASYNC_EVENTS=0,
// which keeps the watcher from marking comms) is reported as it is, after
// the grace. Only error paths wait, once per comm: the failure is sticky.
func (c *commCore) verbsFailed(err error, wait bool) error {
	if m := c.awaitFatal(wait); m != nil {
		err = c.fatalError(*m, err.Error())
	}
	c.failed = err
	return err
}

// awaitFatal is the comm's fatal event, waited for up to fatalGrace when
// wait is set; nil when the watcher does not mark comms.
func (c *commCore) awaitFatal(wait bool) *string {
	m := c.fatal.Load()
	if !c.cfg.returnAsync || m != nil || !wait {
		return m
	}
	for deadline := time.Now().Add(fatalGrace); m == nil && time.Now().Before(deadline); m = c.fatal.Load() {
		time.Sleep(time.Millisecond)
	}
	return m
}

// deviceFatal is the error for setting up a comm over devices one of which
// reported a device-fatal event: what its context would answer now is some
// unrelated verbs error (EIO), which would hide the cause.
func (t *Transport) deviceFatal(devs []*device) error {
	if !t.cfg.returnAsync {
		return nil
	}
	for _, d := range devs {
		if m := d.hca.fatal.Load(); m != nil {
			return nccl.Errorf(nccl.SystemError, "NET/GoIB : cannot use %s: %s", d, *m)
		}
	}
	return nil
}

// newCore creates CQs and nqps QPs (QP i on member i % ndevs) in INIT, and
// resolves each member's GID for this connection.
func newCore(t *Transport, devs []*device, nqps int, access verbs.Access, extraCQ, maxRecv, maxInline int, setup setupBound) (_ *commCore, err error) {
	c := &commCore{t: t, cfg: &t.cfg, log: t.log, ptrSupport: t.ptrSupport(devs), setup: setup}
	t.commBuilt()
	c.name = devs[0].name
	for _, d := range devs[1:] {
		c.name += "+" + d.name
	}
	ok := false
	defer func() {
		if !ok {
			c.destroy()
			c.release()
			// A verbs call failed because the device died while the
			// watcher had the event: report the cause, not the EIO.
			if ferr := t.deviceFatal(devs); ferr != nil {
				err = ferr
			}
		}
	}()
	if err := t.deviceFatal(devs); err != nil {
		return nil, err
	}
	for _, d := range devs {
		cd := commDev{device: d}
		var err error
		if cd.gidIndex, cd.gid, err = d.resolveGID(t); err != nil {
			return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : %s: %v", d, err)
		}
		c.devs = append(c.devs, cd)
	}
	qpsPerDev := (nqps + len(devs) - 1) / len(devs)
	for _, d := range devs {
		n := min(2*maxRequests*qpsPerDev+extraCQ, max(d.hca.attr.MaxCQE, 256))
		cq, err := d.hca.ctx.CreateCQ(n)
		if err != nil {
			return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_create_cq(%d) on %s: %w; %s", n, d, err, createHint(err, ""))
		}
		c.cqs = append(c.cqs, cq)
		d.hca.owners.Store(cq.ID(), c)
	}
	for i := 0; i < nqps; i++ {
		di := i % len(devs)
		d := devs[di]
		qp, err := d.hca.pd.CreateQP(verbs.QPInitAttr{SendCQ: c.cqs[di], RecvCQ: c.cqs[di], MaxSendWR: 2 * maxRequests,
			MaxRecvWR: maxRecv, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: maxInline})
		if err != nil {
			return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_create_qp on %s: %w; %s", d, err,
				createHint(err, fmt.Sprintf("or the device's max_qp (%d) is reached: NCCL_IB_QPS_PER_CONNECTION lowers the count per connection", d.hca.attr.MaxQP)))
		}
		c.qps = append(c.qps, commQP{qp: qp, dev: di})
		d.hca.owners.Store(qp.Num(), c)
		init := verbs.InitAttr{PKeyIndex: t.cfg.pkey, Port: d.port, Access: access}
		if err := c.modifyQP("ibv_modify_qp(INIT) on "+d.String(), func() error { return qp.ModifyToInit(init) }); err != nil {
			return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_modify_qp(INIT) on %s: %w; check NCCL_IB_PKEY=%d", d, err, t.cfg.pkey)
		}
	}
	// Registered in owners above, so a device that died since the first
	// check either marked this comm or is seen here.
	if err := t.deviceFatal(devs); err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

// destroy releases QPs and CQs (never waits for the peer). It runs once; the
// comm's own memory registrations go next, then release.
func (c *commCore) destroy() {
	if c.destroyed {
		return
	}
	c.destroyed = true
	c.watch.close()
	for _, q := range c.qps {
		c.devs[q.dev].hca.owners.Delete(q.qp.Num())
		if err := q.qp.Destroy(); err != nil {
			c.log.Warnf("NET/GoIB : ibv_destroy_qp: %v", err)
		}
	}
	c.qps = nil
	for i, cq := range c.cqs {
		c.devs[i].hca.owners.Delete(cq.ID())
		if err := cq.Destroy(); err != nil {
			c.log.Warnf("NET/GoIB : ibv_destroy_cq: %v", err)
		}
	}
	c.cqs = nil
}

// release tells the transport this comm no longer needs its devices: the
// last verbs call on them is done. It runs once.
func (c *commCore) release() {
	if c.released {
		return
	}
	c.released = true
	c.t.commGone()
}

// localMeta describes our side; keys are the per-device rkeys of the
// control block the peer writes into.
func (c *commCore) localMeta(addr uint64, keys *hostMem, tc, sl int) *connMeta {
	m := &connMeta{NDevs: uint32(len(c.devs)), NQPs: uint32(len(c.qps)), NDataQPs: uint32(c.nDataQPs), Addr: addr, TC: uint32(tc), SL: uint32(sl)}
	for i, d := range c.devs {
		m.Devs[i] = devMeta{LID: d.attr.LID, LinkLayer: uint8(d.attr.LinkLayer), MTU: uint8(d.attr.ActiveMTU), Port: uint8(d.port), GID: d.gid}
		if keys != nil {
			m.Devs[i].RKey = keys.rkeys[i]
		}
	}
	ece := c.t.feats.ECE && c.cfg.ece
	for i, q := range c.qps {
		m.QPs[i] = qpMeta{QPN: q.qp.Num(), Dev: uint8(q.dev)}
		if ece {
			if e, err := q.qp.QueryECE(); err == nil {
				m.QPs[i].ECE = [3]uint32{e.VendorID, e.Options, e.CompMask}
			}
		}
	}
	return m
}

// connectQPs moves every QP to RTR and RTS against the peer's QP of the same
// index: path MTU is the smaller of both ports', RoCE uses a global route
// from this connection's GID, IB routes by LID.
func (c *commCore) connectQPs(rm *connMeta, qs qos) error {
	tc, sl := qs.tc, qs.sl
	ece := c.t.feats.ECE && c.cfg.ece
	for i := range c.qps {
		q := &c.qps[i]
		d := &c.devs[q.dev]
		rq := rm.QPs[i]
		rd := rm.Devs[rq.Dev]
		q.remDev = int(rq.Dev)
		if verbs.LinkLayer(rd.LinkLayer) != d.attr.LinkLayer {
			return nccl.Errorf(nccl.InvalidUsage, "NET/GoIB : attempted to connect incompatible devices: local %s is %v, remote device %d is %v; make NCCL_IB_HCA select the same link layer on every node",
				d.device, d.attr.LinkLayer, rq.Dev, verbs.LinkLayer(rd.LinkLayer))
		}
		if ece && rq.ECE != [3]uint32{} {
			_ = q.qp.SetECE(verbs.ECE{VendorID: rq.ECE[0], Options: rq.ECE[1], CompMask: rq.ECE[2]})
		}
		ah := verbs.AH{Port: d.port, SL: uint8(sl)}
		if d.attr.LinkLayer == verbs.LinkEthernet {
			ah.IsGlobal, ah.DGID, ah.SGIDIndex, ah.HopLimit, ah.TrafficClass = true, rd.GID, d.gidIndex, 255, uint8(tc)
		} else {
			ah.DLID = rd.LID
			// As NCCL's ncclIbRtrQp: LID routing inside a subnet; across
			// subnets a GRH, with the peer's FLID as DLID when it has one. A
			// port that requires a GRH gets one either way (the kernel
			// refuses RTR without it).
			rg := verbs.GID(rd.GID)
			same := d.gid.Subnet() == rg.Subnet()
			if !same || d.attr.Flags&verbs.PortGRHRequired != 0 {
				ah.IsGlobal, ah.DGID, ah.SGIDIndex, ah.HopLimit = true, rd.GID, d.gidIndex, 255
			}
			if !same {
				if f := rg.FLID(); f != 0 {
					ah.DLID = f
				} else if c.t.flidWarned.CompareAndSwap(false, true) {
					c.log.Warnf("NET/GoIB : %s and the peer's device %d are in different subnets (%#04x, %#04x) but the peer's GID %v has no FLID; routing by its LID %d, which only reaches a port of this subnet (check the subnet manager's FLID configuration, or NCCL_IB_ROUTABLE_FLID_GID_INDEX)",
						d.device, rq.Dev, d.gid.Subnet(), rg.Subnet(), rg, rd.LID)
				}
			}
		}
		rtr := verbs.RTRAttr{PathMTU: min(d.attr.ActiveMTU, verbs.MTU(rd.MTU)), DestQPN: rq.QPN, MaxDestRdAtomic: 1, MinRNRTimer: 12, AH: ah}
		if err := c.modifyQP(fmt.Sprintf("ibv_modify_qp(RTR) on %s to QP %#x", d.device, rq.QPN), func() error { return q.qp.ModifyToRTR(rtr) }); err != nil {
			return nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_modify_qp(RTR) on %s to QP %#x: %w; %s", d.device, rq.QPN, err, rtrHint(d.attr.LinkLayer, qs))
		}
		rts := verbs.RTSAttr{Timeout: c.cfg.ackTimeout, RetryCnt: c.cfg.retryCnt, RNRRetry: 7, MaxRdAtom: 1}
		if err := c.modifyQP("ibv_modify_qp(RTS) on "+d.device.String(), func() error { return q.qp.ModifyToRTS(rts) }); err != nil {
			return nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_modify_qp(RTS) on %s: %w (with NCCL_IB_TIMEOUT=%d NCCL_IB_RETRY_CNT=%d)", d.device, err, c.cfg.ackTimeout, c.cfg.retryCnt)
		}
	}
	return nil
}

// rtrHint names what an RTR transition that the HCA refused most likely
// got wrong. The address vector carries the service level and, on RoCE, the
// GID and traffic class; the HCA does not say which it rejected, so the hint
// names each in the order they usually are the cause, with the setting each
// came from. IB has no GID in the path: naming NCCL_IB_GID_INDEX there sent
// users after the wrong variable.
func rtrHint(ll verbs.LinkLayer, qs qos) string {
	sl := fmt.Sprintf("service level %d, from %s", qs.sl, qs.slFrom)
	if qs.sl > maxSL {
		sl = fmt.Sprintf("service level %d is out of range (0-%d); it comes from %s", qs.sl, maxSL, qs.slFrom)
	}
	if ll != verbs.LinkEthernet {
		if qs.sl > maxSL {
			return sl
		}
		return "check the " + sl + ": the subnet manager must map it to a virtual lane of this port"
	}
	tc := fmt.Sprintf("traffic class %d, from %s", qs.tc, qs.tcFrom)
	if qs.sl > maxSL {
		return sl + "; otherwise check the " + tc + ", then the GID (NCCL_IB_GID_INDEX, NCCL_IB_ADDR_FAMILY, NCCL_IB_ADDR_RANGE)"
	}
	return "on RoCE this usually means a bad GID (check NCCL_IB_GID_INDEX, NCCL_IB_ADDR_FAMILY, NCCL_IB_ADDR_RANGE); otherwise check the " + tc + ", and the " + sl
}

func validateMeta(m *connMeta, nqps int) error {
	if m.NDevs < 1 || m.NDevs > maxVDevs || int(m.NQPs) != nqps || m.NQPs > maxQPs || m.NQPs < 1 {
		return fmt.Errorf("peer sent %d devices and %d QPs (expected %d QPs): mismatched plugin versions?", m.NDevs, m.NQPs, nqps)
	}
	if m.NDataQPs < 1 || m.NDataQPs > m.NQPs {
		return fmt.Errorf("peer uses %d data QPs of %d", m.NDataQPs, m.NQPs)
	}
	for i := 0; i < nqps; i++ {
		if uint32(m.QPs[i].Dev) >= m.NDevs {
			return fmt.Errorf("peer QP %d names device %d of %d", i, m.QPs[i].Dev, m.NDevs)
		}
	}
	return nil
}

func linkLayerOf(devs []*device) verbs.LinkLayer {
	ll := devs[0].attr.LinkLayer
	for _, d := range devs[1:] {
		if d.attr.LinkLayer != ll {
			return verbs.LinkUnspecified
		}
	}
	return ll
}

// wcFailed turns an error completion into RemoteError with a WARN naming the
// status, the WR kind, the QP, peer, device and what to check.
func (c *commCore) wcFailed(wc *verbs.WC, ci int) error {
	var hint string
	switch wc.Status {
	case verbs.WCRetryExcErr:
		hint = fmt.Sprintf("the peer stopped acknowledging: it died, the link is down, or NCCL_IB_TIMEOUT (now %d) is too short for this fabric", c.cfg.ackTimeout)
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
		return c.flushFailed(wc, ci)
	}
	// Of an error completion only wr_id, status, qp_num and vendor_err are
	// valid (ibv_poll_cq(3); mlx5 fills no more), so the kind comes from
	// the wr_id and the opcode and length are not printed.
	c.log.Warnf("NET/GoIB : got completion from peer %s with status=%v(%d) (%s) qp=%d vendor_err=%d on %s: %s",
		c.peer, wc.Status, int(wc.Status), kind, wc.QPNum, wc.VendorErr, c.devs[ci].device, hint)
	// A flushed completion is what a QP in the error state returns, which a
	// dying device causes as well as an earlier failure: wait for the event.
	return c.verbsFailed(nccl.Errorf(nccl.RemoteError, "NET/GoIB : completion with status %v on %s from %s", wc.Status, c.devs[ci].device, c.peer),
		wc.Status == verbs.WCWRFlushErr)
}

// flushFailed is wcFailed for the flush's RDMA READ. That READ goes through
// a QP connected to itself, from this rank's receive buffer to this rank's
// flush word: the peer takes no part in it, so the hints that blame the peer
// (it died, it deregistered its buffer) would send the user to the wrong
// host. The result stays RemoteError, as NCCL's for every error completion.
func (c *commCore) flushFailed(wc *verbs.WC, ci int) error {
	var hint string
	switch wc.Status {
	case verbs.WCRetryExcErr:
		hint = "the READ through the port's loopback was not answered: the port lost its link or its path (check ibstat, the cable, the switch)"
	case verbs.WCRemAccessErr:
		hint = "the NIC refused to read the receive buffer through its own registration: the buffer's memory handle was deregistered while the receive or flush was in flight (a caller bug), or its GPU memory was freed"
	case verbs.WCLocProtErr:
		hint = "the NIC could not write the flush word: local protection error; PCI ACS is probably breaking GPU-direct; try NCCL_NET_GDR_LEVEL=0 or disable ACS"
	case verbs.WCWRFlushErr:
		hint = "the flush QP had already failed (see the first error)"
	default:
		hint = "check the fabric (ibv_devinfo, dmesg, port counters)"
	}
	c.log.Warnf("NET/GoIB : GPU-direct flush of a receive from %s failed: the loopback RDMA READ on %s completed with status=%v(%d) qp=%d vendor_err=%d; this rank's own NIC failed it, not the peer: %s",
		c.peer, c.devs[ci].device, wc.Status, int(wc.Status), wc.QPNum, wc.VendorErr, hint)
	return c.verbsFailed(nccl.Errorf(nccl.RemoteError, "NET/GoIB : flush (loopback RDMA READ) on %s failed with status %v", c.devs[ci].device, wc.Status),
		wc.Status == verbs.WCWRFlushErr)
}

// createHint says what a failed ibv_create_qp or ibv_create_cq most likely
// means. Their queues are memory the provider allocates in this process and
// the kernel pins, charged to the locked-memory limit like a registration,
// so ENOMEM is that limit far more often than the device's own maximum
// (more names the latter for QPs).
func createHint(err error, more string) string {
	h := "check dmesg and the device (ibv_devinfo)"
	if memlockErr(err) {
		h = memlockHint + ": queues are pinned memory"
	}
	if more != "" {
		h += "; " + more
	}
	return h
}

// ptrSupport is what NCCL may register on a comm over devs.
func (t *Transport) ptrSupport(devs []*device) nccl.PtrType {
	pt := nccl.PtrHost
	if ok, _ := t.fs.PeerMemory(); ok {
		pt |= nccl.PtrCUDA
	}
	dmabuf := true
	for _, d := range devs {
		dmabuf = dmabuf && d.hca.dmabuf
	}
	if dmabuf {
		pt |= nccl.PtrDMABuf
	}
	return pt
}
