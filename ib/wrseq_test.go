package ib

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// The exact work requests each mode posts, as the software NIC records
// them. A WR is written as OPCODE/length/SGEs plus flags: "W" RDMA WRITE,
// "WI" WRITE_WITH_IMM, "R" receive; "s" signaled, "i" inline.

// wrString renders one record compactly for sequence assertions.
func wrString(r softnic.WRRecord) string {
	if r.Recv {
		return fmt.Sprintf("R/%d", r.NumSGE)
	}
	op := map[verbs.Opcode]string{verbs.WrRDMAWrite: "W", verbs.WrRDMAWriteWithImm: "WI", verbs.WrRDMARead: "RD", verbs.WrSend: "S"}[r.Opcode]
	s := fmt.Sprintf("%s/%d/%d", op, r.Length, r.NumSGE)
	if r.Signaled() {
		s += "s"
	}
	if r.Inline() {
		s += "i"
	}
	return s
}

// sequence runs one transfer of the given sizes (one grouped receive) and
// returns the WRs the receiver and the sender posted, in order.
func sequence(t *testing.T, f *softnic.Fabric, sc *sendComm, rc *recvComm, send, caps []int) (recv, sent []string, all []softnic.WRRecord) {
	t.Helper()
	f.Record(true)
	transfer(t, sc, rc, send, caps)
	all = f.Records()
	f.Record(false)
	for _, r := range all {
		if r.Device == rc.devs[0].name {
			recv = append(recv, wrString(r))
		} else {
			sent = append(sent, wrString(r))
		}
	}
	return recv, sent, all
}

// checkKeys: no RDMA WR ever names rkey 0 or remote address 0, whatever it
// moves (a ConnectX may check both even for zero-length writes).
func checkKeys(t *testing.T, recs []softnic.WRRecord) {
	t.Helper()
	for _, r := range recs {
		if !r.Recv {
			assert.NotZero(t, r.RKey, "rkey of %v", r)
			assert.NotZero(t, r.RemoteAddr, "remote address of %v", r)
		}
	}
}

func roceHosts(t *testing.T) (*softnic.Fabric, *host, *host) {
	return twoHosts(t, softnic.DeviceConfig{LinkLayer: verbs.LinkEthernet})
}

func TestWRSequenceDefault(t *testing.T) {
	setEnv(t)
	f, a, b := roceHosts(t) // RoCE: adaptive routing off by default
	sc, rc := connectPair(t, a, 0, b, 0)
	recv, sent, all := sequence(t, f, sc, rc, []int{65536}, []int{65536})
	// Slot 0 is the first member's own slot: its CTS is the signaled one.
	assert.Equal(t, []string{"R/0", "W/64/1s"}, recv)
	assert.Equal(t, []string{"WI/65536/1s"}, sent, "the data rides in the WRITE_WITH_IMM")
	checkKeys(t, all)
	recv, sent, all = sequence(t, f, sc, rc, []int{100}, []int{128})
	assert.Equal(t, []string{"R/0", "W/64/1"}, recv, "CTS unsignaled outside its member's slot")
	assert.Equal(t, []string{"WI/100/1s"}, sent)
	checkKeys(t, all)
	recv, sent, all = sequence(t, f, sc, rc, []int{10, 20}, []int{64, 64})
	assert.Equal(t, []string{"R/0", "W/128/1"}, recv, "one CTS write carries both entries")
	assert.Equal(t, []string{"W/10/1", "W/20/1", "WI/8/1s"}, sent, "grouped: data writes, then the sizes record with the immediate")
	checkKeys(t, all)
}

func TestWRSequenceZeroByteAndTruncatedUseRealKeys(t *testing.T) {
	setEnv(t)
	f, a, b := roceHosts(t)
	sc, rc := connectPair(t, a, 0, b, 0)
	_, sent, all := sequence(t, f, sc, rc, []int{0}, []int{4096})
	assert.Equal(t, []string{"WI/0/0s"}, sent)
	checkKeys(t, all)
	// A 0-byte buffer without a registration (as the conformance suite
	// passes it) still advertises a real address and key.
	f.Record(true)
	rr, err := rc.Irecv([]nccl.RecvBuffer{{Size: 0}})
	require.NoError(t, err)
	var sr nccl.Request
	within(t, "isend", func() (bool, error) {
		var err error
		sr, err = sc.Isend(nil, 0, 0, 0)
		return sr != nccl.NoRequest, err
	})
	within(t, "recv", func() (bool, error) { return rc.Test(rr, make([]int, 1)) })
	within(t, "send", func() (bool, error) { d, _, err := sc.Test(sr); return d, err })
	checkKeys(t, f.Records())
	// Truncated: no data, a zero-length WRITE_WITH_IMM with the buffer's key.
	f.Record(true)
	rb := newBuf(t, rc, 64, 0)
	sb := newBuf(t, sc, 128, 1)
	rr, err = rc.Irecv([]nccl.RecvBuffer{{Data: rb.ptr(), Size: 64, MH: rb.mh}})
	require.NoError(t, err)
	within(t, "isend", func() (bool, error) {
		var err error
		sr, err = sc.Isend(sb.ptr(), 128, 0, sb.mh)
		return sr != nccl.NoRequest, err
	})
	within(t, "recv fails", func() (bool, error) { _, err := rc.Test(rr, make([]int, 1)); return err != nil, nil })
	within(t, "send fails", func() (bool, error) { _, _, err := sc.Test(sr); return err != nil, nil })
	recs := f.Records()
	checkKeys(t, recs)
	assert.Equal(t, "WI/0/0s", wrString(recs[len(recs)-1]))
}

func TestWRSequenceAdaptiveRouting(t *testing.T) {
	t.Run("IB default: on above 8192 bytes", func(t *testing.T) {
		setEnv(t)
		f, a, b := twoHosts(t, softnic.DeviceConfig{}) // InfiniBand link layer
		sc, rc := connectPair(t, a, 0, b, 0)
		_, sent, all := sequence(t, f, sc, rc, []int{65536}, []int{65536})
		assert.Equal(t, []string{"W/65536/1", "WI/0/0s"}, sent, "data as a plain WRITE, then a zero-length WRITE_WITH_IMM")
		checkKeys(t, all)
		_, sent, _ = sequence(t, f, sc, rc, []int{8192}, []int{8192})
		assert.Equal(t, []string{"WI/8192/1s"}, sent, "at the threshold the data still carries the immediate")
		_, sent, _ = sequence(t, f, sc, rc, []int{10000, 10000}, []int{10000, 10000})
		assert.Equal(t, []string{"W/10000/1", "W/10000/1", "WI/8/1s"}, sent, "grouped receives already end with a separate record write")
	})
	t.Run("forced on RoCE, threshold 0", func(t *testing.T) {
		setEnv(t, "NCCL_IB_ADAPTIVE_ROUTING", "1", "NCCL_IB_AR_THRESHOLD", "0")
		f, a, b := roceHosts(t)
		sc, rc := connectPair(t, a, 0, b, 0)
		_, sent, all := sequence(t, f, sc, rc, []int{1}, []int{1})
		assert.Equal(t, []string{"W/1/1", "WI/0/0s"}, sent)
		checkKeys(t, all)
		_, sent, _ = sequence(t, f, sc, rc, []int{0}, []int{1})
		assert.Equal(t, []string{"WI/0/0s"}, sent, "nothing to write: only the immediate")
	})
	t.Run("forced off on IB", func(t *testing.T) {
		setEnv(t, "NCCL_IB_ADAPTIVE_ROUTING", "0")
		f, a, b := twoHosts(t, softnic.DeviceConfig{})
		sc, rc := connectPair(t, a, 0, b, 0)
		_, sent, _ := sequence(t, f, sc, rc, []int{65536}, []int{65536})
		assert.Equal(t, []string{"WI/65536/1s"}, sent)
	})
}

func TestWRSequenceInlineCTS(t *testing.T) {
	setEnv(t, "NCCL_IB_USE_INLINE", "1")
	f, a, b := roceHosts(t)
	sc, rc := connectPair(t, a, 0, b, 0)
	recv, _, _ := sequence(t, f, sc, rc, []int{100}, []int{100})
	assert.Equal(t, []string{"R/0", "W/64/1si"}, recv, "a single entry fits the 64-byte max_inline_data NCCL asks for")
	recv, _, _ = sequence(t, f, sc, rc, []int{100, 100}, []int{100, 100})
	assert.Equal(t, []string{"R/0", "W/128/1"}, recv, "two entries do not: posted from the registered shadow")

	setEnv(t)
	f, a, b = roceHosts(t)
	sc, rc = connectPair(t, a, 0, b, 0)
	recv, _, _ = sequence(t, f, sc, rc, []int{100}, []int{100})
	assert.Equal(t, []string{"R/0", "W/64/1s"}, recv, "NCCL_IB_USE_INLINE=0 (default): never inline")
}

func TestWRSequenceQPsPerConnection(t *testing.T) {
	t.Run("4 QPs, one per message", func(t *testing.T) {
		setEnv(t, "NCCL_IB_QPS_PER_CONNECTION", "4")
		f, a, b := roceHosts(t)
		sc, rc := connectPair(t, a, 0, b, 0)
		var sendQPs, recvQPs []uint32
		for i := 0; i < 5; i++ {
			_, sent, all := sequence(t, f, sc, rc, []int{4096}, []int{4096})
			assert.Equal(t, []string{"WI/4096/1s"}, sent)
			for _, r := range all {
				if r.Recv {
					recvQPs = append(recvQPs, r.QPNum)
				} else if r.Opcode == verbs.WrRDMAWriteWithImm {
					sendQPs = append(sendQPs, r.QPNum)
				}
			}
		}
		num := func(qs []commQP) []uint32 {
			var out []uint32
			for _, q := range qs {
				out = append(out, q.qp.Num())
			}
			return out
		}
		s, r := num(sc.qps), num(rc.qps)
		assert.Equal(t, []uint32{s[0], s[1], s[2], s[3], s[0]}, sendQPs, "messages rotate over the 4 QPs")
		assert.Equal(t, []uint32{r[0], r[1], r[2], r[3], r[0]}, recvQPs, "each receive is posted on the QP its data arrives on")
	})
	t.Run("4 QPs, split", func(t *testing.T) {
		setEnv(t, "NCCL_IB_QPS_PER_CONNECTION", "4", "NCCL_IB_SPLIT_DATA_ON_QPS", "1")
		f, a, b := roceHosts(t)
		sc, rc := connectPair(t, a, 0, b, 0)
		recv, sent, all := sequence(t, f, sc, rc, []int{1000}, []int{1000})
		assert.Equal(t, []string{"R/0", "R/0", "R/0", "R/0", "W/64/1s"}, recv)
		assert.Equal(t, []string{"WI/256/1s", "WI/256/1s", "WI/256/1s", "WI/232/1s"}, sent, "128-byte aligned chunks")
		checkKeys(t, all)
		_, sent, all = sequence(t, f, sc, rc, []int{200}, []int{200})
		assert.Equal(t, []string{"WI/128/1s", "WI/72/1s", "WI/0/0s", "WI/0/0s"}, sent, "QPs with no share still deliver the immediate")
		checkKeys(t, all)
	})
}

// Relaxed ordering is requested on every data registration, host and
// dma-buf, when NCCL_IB_PCI_RELAXED_ORDERING allows it and ibv_reg_mr_iova2
// exists; never on the control blocks' own memory (which only we touch).
func TestRelaxedOrderingRequested(t *testing.T) {
	for _, c := range []struct {
		name  string
		env   []string
		iova2 bool
		want  bool
	}{
		{"default with iova2", nil, true, true},
		{"forced with iova2", []string{"NCCL_IB_PCI_RELAXED_ORDERING", "1"}, true, true},
		{"off", []string{"NCCL_IB_PCI_RELAXED_ORDERING", "0"}, true, false},
		{"3 is off, as in NCCL", []string{"NCCL_IB_PCI_RELAXED_ORDERING", "3"}, true, false},
		{"no ibv_reg_mr_iova2", nil, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			setEnv(t, c.env...)
			f := softnic.NewFabric()
			dev := f.AddDevice(softnic.DeviceConfig{Name: "simA_0"})
			f.AddDevice(softnic.DeviceConfig{Name: "simB_0"})
			feat := verbs.Features{RegIova2: c.iova2, DMABuf: true}
			a, b := newHost(t, f, feat, "simA_0"), newHost(t, f, feat, "simB_0")
			sc, _ := connectPair(t, a, 0, b, 0)
			before := dev.MRs()
			x := newBuf(t, sc, 4096, 0)
			mh, err := sc.RegMrDMABuf(fakeGPU(0x7f0000000000), 8192, nccl.PtrCUDA, 0, memfd(t, 8192))
			require.NoError(t, err)
			defer sc.DeregMr(mh)
			_ = x
			var data []softnic.MRInfo
			for _, m := range dev.MRs() {
				if !containsMR(before, m) {
					data = append(data, m)
				}
			}
			require.Len(t, data, 2, "the host buffer and the dma-buf")
			for _, m := range data {
				assert.Equal(t, c.want, m.Access&verbs.AccessRelaxedOrdering != 0, "%+v", m)
			}
			for _, m := range before {
				assert.Zero(t, m.Access&verbs.AccessRelaxedOrdering, "control blocks: %+v", m)
			}
		})
	}
}

func containsMR(ms []softnic.MRInfo, m softnic.MRInfo) bool {
	for _, x := range ms {
		if x.LKey == m.LKey {
			return true
		}
	}
	return false
}

func TestWRStringsReadable(t *testing.T) {
	// The notation above, spelled out once for a reader of failures.
	r := softnic.WRRecord{Opcode: verbs.WrRDMAWriteWithImm, Flags: verbs.SendSignaled | verbs.SendInline, NumSGE: 1, Length: 64}
	assert.Equal(t, "WI/64/1si", wrString(r))
	assert.True(t, strings.Contains(r.String(), "RDMA_WRITE_WITH_IMM"))
}

// The signaled CTS write's completion belongs to its receive, as in NCCL:
// the unsignaled CTS writes before it keep their send-queue entries until
// that completion is polled, so the receive (and its FIFO slot) is not done
// before. With the ACK late, the data has arrived but the receive waits;
// until 2026-11-28 it completed, and 512 receives later, with that ACK still
// missing, the CTS post would have found the send queue full.
func TestReceiveWaitsForItsSignaledCTS(t *testing.T) {
	setEnv(t)
	f, a, b := roceHosts(t)
	sc, rc := connectPair(t, a, 0, b, 0)
	f.LagCompletions(softnic.CompletionLag{Device: rc.devs[0].name, Ops: []verbs.Opcode{verbs.WrRDMAWrite}})
	const size = 4096
	rb := newBuf(t, rc, size, 0xee)
	sb := newBuf(t, sc, size, 0)
	copy(sb.b, pattern(size, 3))
	rreq, err := rc.Irecv([]nccl.RecvBuffer{{Data: rb.ptr(), Size: size, MH: rb.mh}})
	require.NoError(t, err)
	var sreq nccl.Request
	within(t, "isend", func() (bool, error) {
		sreq, err = sc.Isend(sb.ptr(), size, 0, sb.mh)
		return sreq != nccl.NoRequest, err
	})
	within(t, "send test", func() (bool, error) { done, _, err := sc.Test(sreq); return done, err })
	assert.Equal(t, pattern(size, 3), rb.b, "the data arrived")
	sizes := []int{-1}
	for i := 0; i < 100; i++ {
		done, err := rc.Test(rreq, sizes)
		require.NoError(t, err)
		require.False(t, done, "the receive completed before its signaled CTS write's completion was polled")
	}
	f.ReleaseCompletions()
	within(t, "recv test", func() (bool, error) { return rc.Test(rreq, sizes) })
	assert.Equal(t, []int{size}, sizes)
	for i := 0; i < 3; i++ { // and the FIFO goes on as before
		got, sz := transfer(t, sc, rc, []int{100}, []int{128})
		assert.Equal(t, []int{100}, sz)
		assert.Equal(t, pattern(100, 0), got[0][:100])
	}
}
