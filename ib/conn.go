package ib

import (
	"fmt"
	"net"
	"sync"
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
	helloTimeout = 5 * time.Second
)

// commQP is one RC QP of a connection.
type commQP struct {
	qp     verbs.QP
	dev    int // local member index
	remDev int // remote member index
}

// commCore is what send and receive comms share: devices, CQs (one per
// member device), QPs striped over the members, and failure state.
type commCore struct {
	t          *Transport
	log        nccl.Logger
	name       string
	devs       []*device
	ptrSupport nccl.PtrType
	cqs        []verbs.CQ
	qps        []commQP
	nDataQPs   int
	peer       string

	fatal      atomic.Pointer[string] // set by the async watcher
	checkAsync bool
	devFatal   [maxVDevs]uint64
	failed     error // sticky data-path failure (progress thread only)
	wcs        [64]verbs.WC
	watch      peerWatch // the kept handshake connection (progress thread only)
}

func (c *commCore) setFatal(msg string) { c.fatal.Store(&msg) }

// check fails fast once the comm or one of its devices has failed. It runs at
// the top of every data-path call: a few atomic loads, no locks.
func (c *commCore) check() error {
	if c.failed != nil {
		return c.failed
	}
	if !c.checkAsync {
		return nil
	}
	if m := c.fatal.Load(); m != nil {
		c.failed = nccl.Errorf(nccl.SystemError, "NET/GoIB : communicator with %s encountered a fatal error: %s", c.peer, *m)
		return c.failed
	}
	for i, d := range c.devs {
		if d.fatal.Load() != c.devFatal[i] {
			why := "fatal async event"
			if p := d.fatalWhy.Load(); p != nil {
				why = *p
			}
			c.failed = nccl.Errorf(nccl.SystemError, "NET/GoIB : communicator with %s encountered a fatal error: %s", c.peer, why)
			return c.failed
		}
	}
	return nil
}

// newCore creates CQs and nqps QPs (QP i on member i % ndevs) in INIT.
func newCore(t *Transport, devs []*device, nqps int, access verbs.Access, extraCQ int) (*commCore, error) {
	c := &commCore{t: t, log: t.log, devs: devs, ptrSupport: t.ptrSupport(devs),
		checkAsync: nccl.EnvBool(t.log, "NCCL_IB_RETURN_ASYNC_EVENTS", true)}
	c.name = devs[0].name
	for _, d := range devs[1:] {
		c.name += "+" + d.name
	}
	for i, d := range devs {
		c.devFatal[i] = d.fatal.Load()
	}
	qpsPerDev := (nqps + len(devs) - 1) / len(devs)
	pkey := int(nccl.EnvInt(t.log, "NCCL_IB_PKEY", 0))
	ok := false
	defer func() {
		if !ok {
			c.destroy()
		}
	}()
	for _, d := range devs {
		n := min(2*maxRequests*qpsPerDev+extraCQ, max(d.hca.attr.MaxCQE, 256))
		cq, err := d.hca.ctx.CreateCQ(n)
		if err != nil {
			return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_create_cq(%d) on %s: %w", n, d, err)
		}
		c.cqs = append(c.cqs, cq)
		d.hca.owners.Store(cq.ID(), c)
	}
	for i := 0; i < nqps; i++ {
		di := i % len(devs)
		d := devs[di]
		qp, err := d.hca.pd.CreateQP(verbs.QPInitAttr{SendCQ: c.cqs[di], RecvCQ: c.cqs[di], MaxSendWR: 2 * maxRequests,
			MaxRecvWR: maxRequests, MaxSendSGE: 1, MaxRecvSGE: 1})
		if err != nil {
			return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_create_qp on %s: %w (max_qp %d reached? NCCL_IB_QPS_PER_CONNECTION lowers the count)", d, err, d.hca.attr.MaxQP)
		}
		c.qps = append(c.qps, commQP{qp: qp, dev: di})
		d.hca.owners.Store(qp.Num(), c)
		if err := qp.ModifyToInit(verbs.InitAttr{PKeyIndex: pkey, Port: d.port, Access: access}); err != nil {
			return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_modify_qp(INIT) on %s: %w; check NCCL_IB_PKEY=%d", d, err, pkey)
		}
	}
	ok = true
	return c, nil
}

// destroy releases QPs and CQs (never waits for the peer).
func (c *commCore) destroy() {
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

// localMeta describes our side; rkeyOf gives the per-device rkey of the
// control block the peer writes into.
func (c *commCore) localMeta(addr uint64, rkeys *hostMem, tc, sl int) *connMeta {
	m := &connMeta{NDevs: uint32(len(c.devs)), NQPs: uint32(len(c.qps)), NDataQPs: uint32(c.nDataQPs), Addr: addr, TC: uint32(tc), SL: uint32(sl)}
	for i, d := range c.devs {
		m.Devs[i] = devMeta{LID: d.attr.LID, LinkLayer: uint8(d.attr.LinkLayer), MTU: uint8(d.attr.ActiveMTU), Port: uint8(d.port), GID: d.gid}
		if rkeys != nil {
			m.Devs[i].RKey = rkeys.rkeys[i]
		}
	}
	ece := c.t.feats.ECE && nccl.EnvBool(c.log, "NCCL_IB_ECE_ENABLE", true)
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

func validateMeta(m *connMeta, nqps int) error {
	if m.NDevs < 1 || m.NDevs > maxVDevs || int(m.NQPs) != nqps || m.NQPs > maxQPs {
		return fmt.Errorf("peer sent %d devices and %d QPs (expected %d QPs): mismatched plugin versions?", m.NDevs, m.NQPs, nqps)
	}
	for i := 0; i < nqps; i++ {
		if uint32(m.QPs[i].Dev) >= m.NDevs {
			return fmt.Errorf("peer QP %d names device %d of %d", i, m.QPs[i].Dev, m.NDevs)
		}
	}
	return nil
}

// connectQPs moves every QP to RTR and RTS against the peer's QP of the same
// index: path MTU is the smaller of both ports', RoCE uses a global route
// from our selected GID, IB routes by LID.
func (c *commCore) connectQPs(rm *connMeta, tc, sl int) error {
	timeout := int(nccl.EnvInt(c.log, "NCCL_IB_TIMEOUT", 20))
	retry := int(nccl.EnvInt(c.log, "NCCL_IB_RETRY_CNT", 7))
	ece := c.t.feats.ECE && nccl.EnvBool(c.log, "NCCL_IB_ECE_ENABLE", true)
	for i := range c.qps {
		q := &c.qps[i]
		d := c.devs[q.dev]
		rq := rm.QPs[i]
		rd := rm.Devs[rq.Dev]
		q.remDev = int(rq.Dev)
		if verbs.LinkLayer(rd.LinkLayer) != d.attr.LinkLayer {
			return nccl.Errorf(nccl.InvalidUsage, "NET/GoIB : attempted to connect incompatible devices: local %s is %v, remote device %d is %v; make NCCL_IB_HCA select the same link layer on every node",
				d, d.attr.LinkLayer, rq.Dev, verbs.LinkLayer(rd.LinkLayer))
		}
		if ece && rq.ECE != [3]uint32{} {
			_ = q.qp.SetECE(verbs.ECE{VendorID: rq.ECE[0], Options: rq.ECE[1], CompMask: rq.ECE[2]})
		}
		ah := verbs.AH{Port: d.port, SL: uint8(sl)}
		if d.attr.LinkLayer == verbs.LinkEthernet {
			ah.IsGlobal, ah.DGID, ah.SGIDIndex, ah.HopLimit, ah.TrafficClass = true, rd.GID, d.gidIndex, 255, uint8(tc)
		} else {
			ah.DLID = rd.LID
		}
		rtr := verbs.RTRAttr{PathMTU: min(d.attr.ActiveMTU, verbs.MTU(rd.MTU)), DestQPN: rq.QPN, MaxDestRdAtomic: 1, MinRNRTimer: 12, AH: ah}
		if err := q.qp.ModifyToRTR(rtr); err != nil {
			return nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_modify_qp(RTR) on %s to QP %#x: %w; on RoCE this usually means a bad GID (check NCCL_IB_GID_INDEX, NCCL_IB_ADDR_FAMILY, NCCL_IB_ADDR_RANGE)", d, rq.QPN, err)
		}
		if err := q.qp.ModifyToRTS(verbs.RTSAttr{Timeout: timeout, RetryCnt: retry, RNRRetry: 7, MaxRdAtom: 1}); err != nil {
			return nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_modify_qp(RTS) on %s: %w; check NCCL_IB_TIMEOUT=%d NCCL_IB_RETRY_CNT=%d", d, err, timeout, retry)
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

func trafficSettings(log nccl.Logger, opts nccl.ConnectOptions) (tc, sl int) {
	tc, sl = int(nccl.EnvInt(log, "NCCL_IB_TC", -1)), int(nccl.EnvInt(log, "NCCL_IB_SL", -1))
	if tc < 0 {
		tc = max(opts.TrafficClass, 0)
	}
	if sl < 0 {
		sl = max(opts.TrafficClass, 0)
	}
	return tc, sl
}

func setupDeadline(log nccl.Logger) time.Time {
	return time.Now().Add(nccl.EnvDuration(log, "NCCL_GO_IB_CONNECT_TIMEOUT", 120*time.Second, time.Second))
}

// Listen opens the out-of-band TCP listener on the chosen interface and
// writes the handle. It does not block: accepting and the handshake run on
// goroutines that Accept polls.
func (t *Transport) Listen(dev int, handle *nccl.Handle) (nccl.Listener, error) {
	devs, err := t.members(dev)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(t.oobAddr.String(), "0"))
	if err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : listen on %s (%v): %w; set NCCL_SOCKET_IFNAME to a usable interface", t.oobName, t.oobAddr, err)
	}
	l := &listener{t: t, dev: dev, devs: devs, ln: ln, magic: socketMagic(t.log), secret: randomU64(), done: make(chan struct{})}
	ap := ln.Addr().(*net.TCPAddr).AddrPort()
	writeHandle(handle, handleInfo{magic: l.magic, secret: l.secret, addr: ap})
	go l.acceptLoop()
	return l, nil
}

type listener struct {
	t      *Transport
	dev    int
	devs   []*device
	ln     net.Listener
	magic  uint64
	secret uint64

	claimed atomic.Bool
	mu      sync.Mutex
	closed  bool
	done    chan struct{}
	comm    *recvComm
	err     error
	taken   bool
}

func (l *listener) acceptLoop() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return // closed
		}
		go l.serve(c)
	}
}

// serve runs the listener side of one handshake. A connection with the
// wrong magic, type or secret is dropped without disturbing the listen.
func (l *listener) serve(conn net.Conn) {
	kept := false
	defer func() {
		if !kept {
			_ = conn.Close()
		}
	}()
	_ = conn.SetDeadline(time.Now().Add(helloTimeout))
	var h hello
	if err := readMsg(conn, &h); err != nil {
		l.t.log.Infof(nccl.SubsysNet, "NET/GoIB : dropping connection from %v: no hello (%v)", conn.RemoteAddr(), err)
		return
	}
	if h.Magic != l.magic || h.Type != socketTypeNetIB || h.Secret != l.secret || h.Version != protoVersion {
		l.t.log.Infof(nccl.SubsysNet, "NET/GoIB : dropping connection from %v: magic %#x type %d version %d does not match this listen (NCCL_SOCKET_MAGIC differs, or a stray connection)",
			conn.RemoteAddr(), h.Magic, h.Type, h.Version)
		return
	}
	if !l.claimed.CompareAndSwap(false, true) {
		l.t.log.Infof(nccl.SubsysNet, "NET/GoIB : dropping second connection from %v on a listen that already has one", conn.RemoteAddr())
		return
	}
	rc, err := l.handshake(conn, &h)
	if rc != nil {
		rc.watch.attach(conn, l.t.log)
		kept = true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		if rc != nil {
			_ = rc.Close()
		}
		return
	}
	l.comm, l.err = rc, err
	close(l.done)
}

func (l *listener) handshake(conn net.Conn, h *hello) (*recvComm, error) {
	t := l.t
	_ = conn.SetDeadline(setupDeadline(t.log))
	ll := linkLayerOf(l.devs)
	reply := helloReply{NDevs: uint32(len(l.devs)), LinkLayer: uint32(ll)}
	incompatible := verbs.LinkLayer(h.LinkLayer) != ll || ll == verbs.LinkUnspecified
	if incompatible {
		reply.Status = replyIncompatible
	}
	if err := writeMsg(conn, &reply); err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : handshake with %v: %w", conn.RemoteAddr(), err)
	}
	if incompatible {
		return nil, nccl.Errorf(nccl.InvalidUsage, "NET/GoIB : attempted to connect incompatible devices: local %v, remote %v link layer; make NCCL_IB_HCA select the same link layer on every node",
			ll, verbs.LinkLayer(h.LinkLayer))
	}
	var sm connMeta
	if err := readMsg(conn, &sm); err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : handshake with %v: reading QP info: %w", conn.RemoteAddr(), err)
	}
	if err := validateMeta(&sm, int(sm.NQPs)); err != nil || sm.NQPs == 0 {
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : handshake with %v: %v", conn.RemoteAddr(), err)
	}
	rc, err := newRecvComm(t, l.dev, l.devs, &sm, conn.RemoteAddr().String())
	if err != nil {
		return nil, err
	}
	if err := writeMsg(conn, rc.meta); err != nil {
		_ = rc.Close()
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : handshake with %v: %w", conn.RemoteAddr(), err)
	}
	var ready uint32
	if err := readMsg(conn, &ready); err != nil || ready != readyMagic {
		_ = rc.Close()
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : handshake with %v: peer did not confirm (ready %#x, %v)", conn.RemoteAddr(), ready, err)
	}
	return rc, nil
}

func (l *listener) Accept() (nccl.RecvComm, error) {
	select {
	case <-l.done:
	default:
		return nil, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.taken {
		return nil, nccl.Errorf(nccl.InternalError, "NET/GoIB : accept called again on a listen that already returned its connection")
	}
	l.taken = true
	if l.err != nil {
		return nil, l.err
	}
	return l.comm, nil
}

// Close stops listening. A handshake still running finishes in the
// background and releases what it built.
func (l *listener) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	select {
	case <-l.done:
		if !l.taken && l.comm != nil {
			_ = l.comm.Close()
		}
	default:
	}
	return l.ln.Close()
}

// connector is one connect in progress; its id and token live in NCCL's
// copy of the handle between calls.
type connector struct {
	token uint64
	done  chan struct{}
	comm  *sendComm
	err   error
}

// Connect starts or continues a connection; see nccl.Transport.
func (t *Transport) Connect(dev int, handle *nccl.Handle, opts nccl.ConnectOptions) (nccl.SendComm, error) {
	le := leU64{handle}
	if id := le.get(hOffConnID); id != 0 {
		t.pendMu.Lock()
		c := t.pending[id]
		if c == nil || c.token != le.get(hOffToken) {
			t.pendMu.Unlock()
			return nil, nccl.Errorf(nccl.InternalError, "NET/GoIB : connect called with a handle whose connection state is unknown (id %#x)", id)
		}
		select {
		case <-c.done:
			delete(t.pending, id)
		default:
			t.pendMu.Unlock()
			return nil, nil
		}
		t.pendMu.Unlock()
		le.put(hOffConnID, 0)
		le.put(hOffToken, 0)
		if c.err != nil {
			return nil, c.err
		}
		return c.comm, nil
	}
	devs, err := t.members(dev)
	if err != nil {
		return nil, err
	}
	hi, err := readHandle(handle)
	if err != nil {
		return nil, nccl.Errorf(nccl.InternalError, "NET/GoIB : connect: %v", err)
	}
	if magic := socketMagic(t.log); hi.magic != magic {
		return nil, nccl.Errorf(nccl.InvalidUsage, "NET/GoIB : connect: handle magic %#x differs from ours %#x: set the same NCCL_SOCKET_MAGIC on every rank", hi.magic, magic)
	}
	c := &connector{token: randomU64(), done: make(chan struct{})}
	id := randomU64()
	t.pendMu.Lock()
	t.pending[id] = c
	t.pendMu.Unlock()
	le.put(hOffConnID, id)
	le.put(hOffToken, c.token)
	go func() {
		c.comm, c.err = t.dial(dev, devs, hi, opts)
		close(c.done)
	}()
	return nil, nil
}

func (t *Transport) dial(dev int, devs []*device, hi handleInfo, opts nccl.ConnectOptions) (*sendComm, error) {
	deadline := setupDeadline(t.log)
	conn, err := dialRetry(hi.addr, deadline, t.log)
	if err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "NET/GoIB : %v", err)
	}
	kept := false
	defer func() {
		if !kept {
			_ = conn.Close()
		}
	}()
	_ = conn.SetDeadline(deadline)
	peer := conn.RemoteAddr().String()
	fail := func(what string, err error) error {
		return nccl.Errorf(nccl.SystemError, "NET/GoIB : handshake with %s: %s: %w", peer, what, err)
	}
	ll := linkLayerOf(devs)
	h := hello{Magic: hi.magic, Type: socketTypeNetIB, Version: protoVersion, Secret: hi.secret, NDevs: uint32(len(devs)), LinkLayer: uint32(ll)}
	if err := writeMsg(conn, &h); err != nil {
		return nil, fail("hello", err)
	}
	var r helloReply
	if err := readMsg(conn, &r); err != nil {
		return nil, fail("hello reply", err)
	}
	if r.Status != 0 || verbs.LinkLayer(r.LinkLayer) != ll {
		return nil, nccl.Errorf(nccl.InvalidUsage, "NET/GoIB : attempted to connect incompatible devices: local %v, remote %v link layer (%s); make NCCL_IB_HCA select the same link layer on every node",
			ll, verbs.LinkLayer(r.LinkLayer), peer)
	}
	if r.NDevs < 1 || r.NDevs > maxVDevs {
		return nil, fail("hello reply", fmt.Errorf("peer has %d devices", r.NDevs))
	}
	tc, sl := trafficSettings(t.log, opts)
	sc, err := newSendComm(t, dev, devs, int(r.NDevs), peer)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = sc.Close()
		}
	}()
	if err := writeMsg(conn, sc.localMeta(sc.fifo.addr(), sc.fifo, tc, sl)); err != nil {
		return nil, fail("sending QP info", err)
	}
	var rm connMeta
	if err := readMsg(conn, &rm); err != nil {
		return nil, fail("reading QP info", err)
	}
	if err := validateMeta(&rm, len(sc.qps)); err != nil {
		return nil, fail("QP info", err)
	}
	if err := sc.finish(&rm, tc, sl); err != nil {
		return nil, err
	}
	if err := writeMsg(conn, uint32(readyMagic)); err != nil {
		return nil, fail("ready", err)
	}
	sc.watch.attach(conn, t.log)
	ok, kept = true, true
	return sc, nil
}
