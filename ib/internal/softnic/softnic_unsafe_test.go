package softnic

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
)

const rw = verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead

type end struct {
	ctx verbs.Context
	pd  verbs.PD
	cq  verbs.CQ
	qp  verbs.QP
	buf []byte
	mr  verbs.MR
}

func open(t *testing.T, p verbs.Provider, dev string, sq int) *end {
	t.Helper()
	c, err := p.Open(dev)
	require.NoError(t, err)
	pd, err := c.AllocPD()
	require.NoError(t, err)
	cq, err := c.CreateCQ(64)
	require.NoError(t, err)
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, MaxSendWR: sq, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1})
	require.NoError(t, err)
	e := &end{ctx: c, pd: pd, cq: cq, qp: qp, buf: make([]byte, 4096)}
	e.mr, err = pd.RegMR(unsafe.Pointer(&e.buf[0]), e.addr(0), len(e.buf), rw)
	require.NoError(t, err)
	return e
}

func (e *end) addr(off int) uint64 { return uint64(uintptr(unsafe.Pointer(&e.buf[off]))) }

func connect(t *testing.T, a, b *end) {
	t.Helper()
	pa, err := a.ctx.QueryPort(1)
	require.NoError(t, err)
	pb, err := b.ctx.QueryPort(1)
	require.NoError(t, err)
	for _, x := range []struct {
		e   *end
		lid uint16
		dst uint32
	}{{a, pb.LID, b.qp.Num()}, {b, pa.LID, a.qp.Num()}} {
		require.NoError(t, x.e.qp.ModifyToInit(verbs.InitAttr{Port: 1, Access: rw}))
		require.NoError(t, x.e.qp.ModifyToRTR(verbs.RTRAttr{PathMTU: 5, DestQPN: x.dst, AH: verbs.AH{DLID: x.lid, Port: 1}}))
		require.NoError(t, x.e.qp.ModifyToRTS(verbs.RTSAttr{Timeout: 20, RetryCnt: 7, RNRRetry: 7}))
	}
}

func poll(t *testing.T, cq verbs.CQ, want int) []verbs.WC {
	t.Helper()
	wcs := make([]verbs.WC, 16)
	n, err := cq.Poll(wcs)
	require.NoError(t, err)
	require.Equal(t, want, n, "completions: %+v", wcs[:n])
	return wcs[:n]
}

func pair(t *testing.T) (*Fabric, *end, *end) {
	f := NewFabric()
	f.AddDevice(DeviceConfig{Name: "sim0"})
	f.AddDevice(DeviceConfig{Name: "sim1"})
	p := f.Provider(verbs.Features{})
	a, b := open(t, p, "sim0", 8), open(t, p, "sim1", 8)
	connect(t, a, b)
	return f, a, b
}

func TestWriteWithImmAndRead(t *testing.T) {
	_, a, b := pair(t)
	copy(a.buf, "hello world")
	_, err := b.qp.PostRecv([]verbs.RecvWR{{WRID: 77}})
	require.NoError(t, err)
	_, err = a.qp.PostSend([]verbs.SendWR{
		{WRID: 1, Opcode: verbs.WrRDMAWrite, NumSGE: 1, SGE: verbs.SGE{Addr: a.addr(0), Length: 5, LKey: a.mr.LKey()}, RemoteAddr: b.addr(100), RKey: b.mr.RKey()},
		{WRID: 2, Opcode: verbs.WrRDMAWriteWithImm, Flags: verbs.SendSignaled, NumSGE: 1, SGE: verbs.SGE{Addr: a.addr(6), Length: 5, LKey: a.mr.LKey()}, RemoteAddr: b.addr(105), RKey: b.mr.RKey(), Imm: 0xdeadbeef},
	})
	require.NoError(t, err)
	wc := poll(t, a.cq, 1) // the unsignaled write has no completion
	assert.Equal(t, uint64(2), wc[0].WRID)
	assert.Equal(t, verbs.WCRDMAWrite, wc[0].Opcode)
	wc = poll(t, b.cq, 1)
	assert.Equal(t, verbs.WC{WRID: 77, Opcode: verbs.WCRecvRDMAWithImm, ByteLen: 5, Imm: 0xdeadbeef, WithImm: 1, QPNum: b.qp.Num()}, wc[0])
	assert.Equal(t, "helloworld", string(b.buf[100:110]))

	_, err = a.qp.PostSend([]verbs.SendWR{{WRID: 3, Opcode: verbs.WrRDMARead, Flags: verbs.SendSignaled, NumSGE: 1,
		SGE: verbs.SGE{Addr: a.addr(200), Length: 10, LKey: a.mr.LKey()}, RemoteAddr: b.addr(100), RKey: b.mr.RKey()}})
	require.NoError(t, err)
	wc = poll(t, a.cq, 1)
	assert.Equal(t, verbs.WCRDMARead, wc[0].Opcode)
	assert.Equal(t, uint32(10), wc[0].ByteLen)
	assert.Equal(t, "helloworld", string(a.buf[200:210]))
}

func TestRemoteAccessErrorFlushesLaterWRs(t *testing.T) {
	_, a, b := pair(t)
	_, err := a.qp.PostSend([]verbs.SendWR{
		// One byte past the end of b's region: bounds check fails.
		{WRID: 1, Opcode: verbs.WrRDMAWrite, NumSGE: 1, SGE: verbs.SGE{Addr: a.addr(0), Length: 2, LKey: a.mr.LKey()}, RemoteAddr: b.addr(4095), RKey: b.mr.RKey()},
		{WRID: 2, Opcode: verbs.WrRDMAWrite, Flags: verbs.SendSignaled, NumSGE: 1, SGE: verbs.SGE{Addr: a.addr(0), Length: 2, LKey: a.mr.LKey()}, RemoteAddr: b.addr(0), RKey: b.mr.RKey()},
	})
	require.NoError(t, err)
	wc := poll(t, a.cq, 2)
	assert.Equal(t, verbs.WCRemAccessErr, wc[0].Status, "even an unsignaled WR reports its error")
	assert.Equal(t, verbs.WCWRFlushErr, wc[1].Status)
	// The responder saw an access violation: its QP is in error with an event.
	ev, err := b.ctx.NextAsyncEvent(nil)
	require.NoError(t, err)
	assert.Equal(t, verbs.AsyncEvent{Type: verbs.EventQPAccessErr, QPNum: b.qp.Num()}, ev)

	// Wrong rkey is an access error too.
	_, a, b = pair(t)
	_, err = a.qp.PostSend([]verbs.SendWR{{WRID: 9, Opcode: verbs.WrRDMAWrite, NumSGE: 1, SGE: verbs.SGE{Addr: a.addr(0), Length: 1, LKey: a.mr.LKey()}, RemoteAddr: b.addr(0), RKey: b.mr.RKey() + 1}})
	require.NoError(t, err)
	assert.Equal(t, verbs.WCRemAccessErr, poll(t, a.cq, 1)[0].Status)
}

func TestInjectedRetryExceeded(t *testing.T) {
	f, a, b := pair(t)
	f.InjectFault(Fault{Device: "sim0", Status: verbs.WCRetryExcErr, Count: 1})
	_, err := b.qp.PostRecv([]verbs.RecvWR{{WRID: 5}})
	require.NoError(t, err)
	_, err = a.qp.PostSend([]verbs.SendWR{
		{WRID: 1, Opcode: verbs.WrRDMAWriteWithImm},
		{WRID: 2, Opcode: verbs.WrRDMAWriteWithImm, Flags: verbs.SendSignaled},
	})
	require.NoError(t, err)
	wc := poll(t, a.cq, 2)
	assert.Equal(t, verbs.WCRetryExcErr, wc[0].Status)
	assert.Equal(t, verbs.WCWRFlushErr, wc[1].Status)
	poll(t, b.cq, 0) // nothing arrived
	// Posting on an errored QP completes at once with a flush error.
	_, err = a.qp.PostSend([]verbs.SendWR{{WRID: 3, Opcode: verbs.WrRDMAWrite}})
	require.NoError(t, err)
	assert.Equal(t, verbs.WCWRFlushErr, poll(t, a.cq, 1)[0].Status)
}

func TestRNRWaitsForReceiveInOrder(t *testing.T) {
	_, a, b := pair(t)
	copy(a.buf, "ab")
	_, err := a.qp.PostSend([]verbs.SendWR{
		{WRID: 1, Opcode: verbs.WrRDMAWriteWithImm, Flags: verbs.SendSignaled, Imm: 1, RemoteAddr: b.addr(0), RKey: b.mr.RKey()},
		{WRID: 2, Opcode: verbs.WrRDMAWrite, Flags: verbs.SendSignaled, NumSGE: 1, SGE: verbs.SGE{Addr: a.addr(0), Length: 2, LKey: a.mr.LKey()}, RemoteAddr: b.addr(0), RKey: b.mr.RKey()},
	})
	require.NoError(t, err)
	poll(t, a.cq, 0)
	assert.Equal(t, byte(0), b.buf[0], "a WR behind an RNR-blocked one must not execute early")
	_, err = b.qp.PostRecv([]verbs.RecvWR{{WRID: 8}})
	require.NoError(t, err)
	wc := poll(t, a.cq, 2)
	assert.Equal(t, []uint64{1, 2}, []uint64{wc[0].WRID, wc[1].WRID})
	assert.Equal(t, "ab", string(b.buf[:2]))
	assert.Equal(t, uint32(1), poll(t, b.cq, 1)[0].Imm)
}

func TestUnsignaledWRsFillTheSendQueue(t *testing.T) {
	_, a, b := pair(t) // 8 send slots
	wr := verbs.SendWR{Opcode: verbs.WrRDMAWrite, RemoteAddr: b.addr(0), RKey: b.mr.RKey()}
	for i := 0; i < 8; i++ {
		_, err := a.qp.PostSend([]verbs.SendWR{wr})
		require.NoError(t, err)
	}
	_, err := a.qp.PostSend([]verbs.SendWR{wr})
	require.ErrorIs(t, err, verbs.ENOMEM)

	// A signaled WR releases everything before it once its completion is polled.
	_, a, b = pair(t)
	wr = verbs.SendWR{Opcode: verbs.WrRDMAWrite, RemoteAddr: b.addr(0), RKey: b.mr.RKey()}
	for i := 0; i < 7; i++ {
		_, err := a.qp.PostSend([]verbs.SendWR{wr})
		require.NoError(t, err)
	}
	sig := wr
	sig.Flags = verbs.SendSignaled
	_, err = a.qp.PostSend([]verbs.SendWR{sig})
	require.NoError(t, err)
	_, err = a.qp.PostSend([]verbs.SendWR{wr})
	require.ErrorIs(t, err, verbs.ENOMEM, "slots are released by polling, not by completion generation")
	poll(t, a.cq, 1)
	_, err = a.qp.PostSend([]verbs.SendWR{wr})
	require.NoError(t, err)
}

// A lagged completion has executed (the data is there) but is not polled,
// so it frees no send-queue slot, and later completions of the QP wait
// behind it; released, they come in posting order.
func TestCompletionLagHoldsSlotsAndOrder(t *testing.T) {
	f, a, b := pair(t) // 8 send slots
	f.LagCompletions(CompletionLag{Ops: []verbs.Opcode{verbs.WrRDMAWrite}})
	copy(a.buf, "xy")
	w := verbs.SendWR{WRID: 1, Opcode: verbs.WrRDMAWrite, Flags: verbs.SendSignaled, NumSGE: 1,
		SGE: verbs.SGE{Addr: a.addr(0), Length: 2, LKey: a.mr.LKey()}, RemoteAddr: b.addr(0), RKey: b.mr.RKey()}
	_, err := a.qp.PostSend([]verbs.SendWR{w})
	require.NoError(t, err)
	assert.Equal(t, "xy", string(b.buf[:2]), "the write executed")
	poll(t, a.cq, 0)
	imm := verbs.SendWR{WRID: 2, Opcode: verbs.WrRDMAWriteWithImm, Flags: verbs.SendSignaled, Imm: 5, RemoteAddr: b.addr(0), RKey: b.mr.RKey()}
	_, err = b.qp.PostRecv([]verbs.RecvWR{{WRID: 9}})
	require.NoError(t, err)
	_, err = a.qp.PostSend([]verbs.SendWR{imm})
	require.NoError(t, err)
	poll(t, a.cq, 0) // not lagged itself, but behind a held one
	assert.Equal(t, uint32(5), poll(t, b.cq, 1)[0].Imm, "the responder saw it")
	for i := 0; i < 6; i++ {
		_, err = a.qp.PostSend([]verbs.SendWR{{Opcode: verbs.WrRDMAWrite, RemoteAddr: b.addr(0), RKey: b.mr.RKey()}})
		require.NoError(t, err)
	}
	_, err = a.qp.PostSend([]verbs.SendWR{{Opcode: verbs.WrRDMAWrite, RemoteAddr: b.addr(0), RKey: b.mr.RKey()}})
	require.ErrorIs(t, err, verbs.ENOMEM, "held completions free no slot")
	f.ReleaseCompletions()
	wc := poll(t, a.cq, 2)
	assert.Equal(t, []uint64{1, 2}, []uint64{wc[0].WRID, wc[1].WRID})
	_, err = a.qp.PostSend([]verbs.SendWR{{Opcode: verbs.WrRDMAWrite, RemoteAddr: b.addr(0), RKey: b.mr.RKey()}})
	require.NoError(t, err, "polled, they free their slots")
}

func TestLoopbackQPAndStateChecks(t *testing.T) {
	f := NewFabric()
	f.AddDevice(DeviceConfig{Name: "sim0", LinkLayer: verbs.LinkEthernet})
	p := f.Provider(verbs.Features{})
	a := open(t, p, "sim0", 4)
	_, err := a.qp.PostSend([]verbs.SendWR{{Opcode: verbs.WrRDMAWrite}})
	require.ErrorIs(t, err, verbs.EINVAL, "posting before RTS fails")
	gid, err := a.ctx.QueryGID(1, 3)
	require.NoError(t, err)
	assert.Equal(t, "192.0.2.10", gid.Addr().String())
	require.NoError(t, a.qp.ModifyToInit(verbs.InitAttr{Port: 1, Access: rw}))
	require.ErrorIs(t, a.qp.ModifyToRTR(verbs.RTRAttr{PathMTU: 5, DestQPN: a.qp.Num(), AH: verbs.AH{Port: 1}}), verbs.EINVAL, "RoCE needs a GRH")
	require.NoError(t, a.qp.ModifyToRTR(verbs.RTRAttr{PathMTU: 5, DestQPN: a.qp.Num(), AH: verbs.AH{IsGlobal: true, DGID: gid, SGIDIndex: 3, Port: 1}}))
	require.NoError(t, a.qp.ModifyToRTS(verbs.RTSAttr{RetryCnt: 7, RNRRetry: 7}))
	copy(a.buf[10:], "x")
	_, err = a.qp.PostSend([]verbs.SendWR{{WRID: 4, Opcode: verbs.WrRDMARead, Flags: verbs.SendSignaled, NumSGE: 1,
		SGE: verbs.SGE{Addr: a.addr(0), Length: 1, LKey: a.mr.LKey()}, RemoteAddr: a.addr(10), RKey: a.mr.RKey()}})
	require.NoError(t, err)
	assert.Equal(t, verbs.WCSuccess, poll(t, a.cq, 1)[0].Status)
	assert.Equal(t, byte('x'), a.buf[0])
}

func TestDMABufAndAsyncEvents(t *testing.T) {
	f := NewFabric()
	d := f.AddDevice(DeviceConfig{Name: "sim0"})
	c, err := f.Provider(verbs.Features{}).Open("sim0")
	require.NoError(t, err)
	pd, err := c.AllocPD()
	require.NoError(t, err)
	_, err = pd.RegDMABufMR(0, 4096, 0x1000, -1, rw)
	require.ErrorIs(t, err, verbs.EOPNOTSUPP, "a provider without dma-buf says EOPNOTSUPP")
	c2, err := f.Provider(verbs.Features{DMABuf: true}).Open("sim0")
	require.NoError(t, err)
	pd2, err := c2.AllocPD()
	require.NoError(t, err)
	_, err = pd2.RegDMABufMR(0, 4096, 0x1000, -1, rw)
	require.ErrorIs(t, err, verbs.EBADF, "the probe NCCL uses: fd -1 fails with EBADF when supported")

	d.InjectAsyncEvent(verbs.AsyncEvent{Type: verbs.EventDeviceFatal})
	for _, ctx := range []verbs.Context{c, c2} {
		ev, err := ctx.NextAsyncEvent(nil)
		require.NoError(t, err)
		assert.True(t, ev.Type.Fatal())
	}
	require.NoError(t, c.Close())
	_, err = c.NextAsyncEvent(nil)
	assert.ErrorIs(t, err, verbs.ErrClosed)
}

// Every call on a destroyed object (or one whose context closed) is refused
// with ErrUseAfterFree and recorded, as libibverbs would fault there.
func TestDestroyedObjectsAreRefused(t *testing.T) {
	f, a, b := pair(t)
	require.Empty(t, f.Violations())

	require.NoError(t, a.qp.Destroy())
	_, err := a.qp.PostSend([]verbs.SendWR{{Opcode: verbs.WrRDMAWrite}})
	assert.ErrorIs(t, err, ErrUseAfterFree)
	_, err = a.qp.PostRecv([]verbs.RecvWR{{}})
	assert.ErrorIs(t, err, ErrUseAfterFree)
	assert.ErrorIs(t, a.qp.Destroy(), ErrUseAfterFree)
	assert.ErrorIs(t, a.qp.SetECE(verbs.ECE{}), ErrUseAfterFree)

	require.NoError(t, a.mr.Dereg())
	assert.ErrorIs(t, a.mr.Dereg(), ErrUseAfterFree)
	_ = a.mr.LKey()

	require.NoError(t, a.cq.Destroy())
	_, err = a.cq.Poll(make([]verbs.WC, 4))
	assert.ErrorIs(t, err, ErrUseAfterFree)

	require.NoError(t, a.pd.Dealloc())
	_, err = a.pd.CreateQP(verbs.QPInitAttr{SendCQ: b.cq, RecvCQ: b.cq, MaxSendWR: 1})
	assert.ErrorIs(t, err, ErrUseAfterFree)
	_, err = a.pd.RegMR(unsafe.Pointer(&a.buf[0]), a.addr(0), 64, rw)
	assert.ErrorIs(t, err, ErrUseAfterFree)

	require.NoError(t, a.ctx.Close())
	_, err = a.ctx.CreateCQ(4)
	assert.ErrorIs(t, err, ErrUseAfterFree)
	_, err = a.ctx.AllocPD()
	assert.ErrorIs(t, err, ErrUseAfterFree)
	_, err = a.ctx.QueryPort(1)
	assert.ErrorIs(t, err, ErrUseAfterFree)
	assert.ErrorIs(t, a.ctx.Close(), ErrUseAfterFree)
	assert.Len(t, f.Violations(), 13, "%q", f.Violations())

	// Closing a context whose objects are alive leaks them: a violation too,
	// and so is a PD deallocated under its QPs (EBUSY).
	assert.ErrorIs(t, b.pd.Dealloc(), verbs.Errno(16))
	require.NoError(t, b.ctx.Close())
	v := f.Violations()
	assert.Contains(t, v[len(v)-2], "ibv_dealloc_pd on sim1 with 1 MR(s) and 1 QP(s) still alive")
	assert.Contains(t, v[len(v)-1], "ibv_close_device on sim1 with 1 PD(s) and 1 CQ(s) still allocated")
	// Any use of b's objects now is a use-after-free.
	_, err = b.cq.Poll(make([]verbs.WC, 1))
	assert.ErrorIs(t, err, ErrUseAfterFree)
}

// The checks a ConnectX makes that rxe does not: rkey 0 and remote address
// 0 are refused even for zero-length writes, and an SGE of 0 bytes is an
// error (a byte count of 0 means 2 GiB on mlx5).
func TestStrictRemoteKeyAndLengthRules(t *testing.T) {
	for _, c := range []struct {
		name string
		wr   func(a, b *end) verbs.SendWR
		want verbs.WCStatus
	}{
		{"zero-length write, rkey 0", func(a, b *end) verbs.SendWR {
			return verbs.SendWR{Opcode: verbs.WrRDMAWriteWithImm, Flags: verbs.SendSignaled, RemoteAddr: b.addr(0)}
		}, verbs.WCRemAccessErr},
		{"zero-length write, address 0", func(a, b *end) verbs.SendWR {
			return verbs.SendWR{Opcode: verbs.WrRDMAWriteWithImm, Flags: verbs.SendSignaled, RKey: b.mr.RKey()}
		}, verbs.WCRemAccessErr},
		{"0-byte SGE", func(a, b *end) verbs.SendWR {
			return verbs.SendWR{Opcode: verbs.WrRDMAWrite, Flags: verbs.SendSignaled, NumSGE: 1, SGE: verbs.SGE{Addr: a.addr(0), LKey: a.mr.LKey()},
				RemoteAddr: b.addr(0), RKey: b.mr.RKey()}
		}, verbs.WCLocLenErr},
		{"zero-length write with keys", func(a, b *end) verbs.SendWR {
			return verbs.SendWR{Opcode: verbs.WrRDMAWriteWithImm, Flags: verbs.SendSignaled, RemoteAddr: b.addr(0), RKey: b.mr.RKey()}
		}, verbs.WCSuccess},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, a, b := pair(t)
			_, err := b.qp.PostRecv([]verbs.RecvWR{{WRID: 1}})
			require.NoError(t, err)
			_, err = a.qp.PostSend([]verbs.SendWR{c.wr(a, b)})
			require.NoError(t, err)
			assert.Equal(t, c.want, poll(t, a.cq, 1)[0].Status)
		})
	}
	_, a, _ := pair(t)
	_, err := a.qp.PostRecv([]verbs.RecvWR{{NumSGE: 1, SGE: verbs.SGE{Addr: a.addr(0), LKey: a.mr.LKey()}}})
	assert.ErrorIs(t, err, verbs.EINVAL, "a receive SGE of 0 bytes is refused at post time")
}

// Inline data is copied when the WR is posted (the lkey is not looked at),
// and may not exceed the QP's max_inline_data.
func TestInlineSendsCopyAtPostTime(t *testing.T) {
	f := NewFabric()
	f.AddDevice(DeviceConfig{Name: "sim0"})
	f.AddDevice(DeviceConfig{Name: "sim1"})
	p := f.Provider(verbs.Features{})
	a, b := open(t, p, "sim0", 8), open(t, p, "sim1", 8)
	// Recreate a's QP with inline support.
	require.NoError(t, a.qp.Destroy())
	var err error
	a.qp, err = a.pd.CreateQP(verbs.QPInitAttr{SendCQ: a.cq, RecvCQ: a.cq, MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: 64})
	require.NoError(t, err)
	connect(t, a, b)
	f.Record(true)
	// Block the QP behind an RNR-waiting WRITE_WITH_IMM so the inline WR is
	// queued, then overwrite its source: the queued WR must carry the old bytes.
	copy(a.buf, "inline!!")
	_, err = a.qp.PostSend([]verbs.SendWR{
		{WRID: 1, Opcode: verbs.WrRDMAWriteWithImm, Flags: verbs.SendSignaled, RemoteAddr: b.addr(0), RKey: b.mr.RKey()},
		{WRID: 2, Opcode: verbs.WrRDMAWrite, Flags: verbs.SendSignaled | verbs.SendInline, NumSGE: 1,
			SGE: verbs.SGE{Addr: a.addr(0), Length: 8}, RemoteAddr: b.addr(64), RKey: b.mr.RKey()},
	})
	require.NoError(t, err)
	copy(a.buf, "changed!")
	_, err = b.qp.PostRecv([]verbs.RecvWR{{WRID: 9}})
	require.NoError(t, err)
	wc := poll(t, a.cq, 2)
	assert.Equal(t, verbs.WCSuccess, wc[1].Status)
	assert.Equal(t, "inline!!", string(b.buf[64:72]))
	_, err = a.qp.PostSend([]verbs.SendWR{{Opcode: verbs.WrRDMAWrite, Flags: verbs.SendInline, NumSGE: 1,
		SGE: verbs.SGE{Addr: a.addr(0), Length: 65}, RemoteAddr: b.addr(0), RKey: b.mr.RKey()}})
	assert.ErrorIs(t, err, verbs.EINVAL, "more than max_inline_data")
	rec := f.Records()
	require.Len(t, rec, 3)
	assert.Equal(t, verbs.WrRDMAWriteWithImm, rec[0].Opcode)
	assert.True(t, rec[1].Inline() && rec[1].Signaled())
	assert.Equal(t, uint32(8), rec[1].Length)
	assert.True(t, rec[2].Recv)
}
