package ib

import (
	"bytes"
	"unsafe"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
	"github.com/stretchr/testify/require"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
)

func TestSingleReceiveSizes(t *testing.T) {
	setEnv(t)
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	sc, rc := connectPair(t, a, 0, b, 0)
	for _, size := range []int{0, 1, 127, 128, 4097, 1 << 20} {
		got, sizes := transfer(t, sc, rc, []int{size}, []int{size + 64})
		assert.Equal(t, []int{size}, sizes)
		assert.Equal(t, pattern(size, 0), got[0][:size], "size %d", size)
		assert.Equal(t, byte(0xee), got[0][size], "byte after the message untouched (size %d)", size)
	}
}

func TestGroupedReceive(t *testing.T) {
	setEnv(t)
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	sc, rc := connectPair(t, a, 0, b, 0)
	sendSizes := []int{100, 0, 70000, 4096, 1, 333, 8192, 5}
	caps := []int{200, 10, 70000, 8192, 1, 4096, 8192, 64}
	for round := 0; round < 3; round++ {
		got, sizes := transfer(t, sc, rc, sendSizes, caps)
		assert.Equal(t, sendSizes, sizes)
		for i, n := range sendSizes {
			assert.Equal(t, pattern(n, byte(i)), got[i][:n], "buffer %d", i)
		}
	}
}

func TestRequestsInFlight(t *testing.T) {
	setEnv(t)
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	sc, rc := connectPair(t, a, 0, b, 0)
	const n, size = maxRequests, 1024
	rb := newBuf(t, rc, n*size, 0)
	sb := newBuf(t, sc, n*size, 0)
	for i := 0; i < n; i++ {
		copy(sb.b[i*size:], pattern(size, byte(i)))
	}
	// A send before any receive has no credit.
	r, err := sc.Isend(sb.ptr(), size, 0, sb.mh)
	require.NoError(t, err)
	assert.Equal(t, nccl.NoRequest, r)
	rreqs := make([]nccl.Request, n)
	for i := range rreqs {
		rreqs[i], err = rc.Irecv([]nccl.RecvBuffer{{Data: unsafe.Add(rb.ptr(), i*size), Size: size, MH: rb.mh}})
		require.NoError(t, err)
		require.NotEqual(t, nccl.NoRequest, rreqs[i], "receive %d", i)
	}
	r, err = rc.Irecv([]nccl.RecvBuffer{{Data: rb.ptr(), Size: size, MH: rb.mh}})
	require.NoError(t, err)
	assert.Equal(t, nccl.NoRequest, r, "the 257th receive waits for a free slot")
	sreqs := make([]nccl.Request, n)
	for i := range sreqs {
		sreqs[i], err = sc.Isend(unsafe.Add(sb.ptr(), i*size), size, 0, sb.mh)
		require.NoError(t, err)
		require.NotEqual(t, nccl.NoRequest, sreqs[i], "send %d", i)
	}
	for i := range sreqs {
		within(t, "send", func() (bool, error) { d, _, err := sc.Test(sreqs[i]); return d, err })
		sizes := []int{-1}
		within(t, "recv", func() (bool, error) { return rc.Test(rreqs[i], sizes) })
		assert.Equal(t, size, sizes[0])
	}
	assert.Equal(t, sb.b, rb.b)
	// Slots recycle: a second full round works.
	got, _ := transfer(t, sc, rc, []int{777}, []int{777})
	assert.Equal(t, pattern(777, 0), got[0][:777])
}

func TestMultiQPSplitAndReassembly(t *testing.T) {
	for _, split := range []string{"0", "1"} {
		t.Run("split="+split, func(t *testing.T) {
			setEnv(t, "NCCL_IB_QPS_PER_CONNECTION", "4", "NCCL_IB_SPLIT_DATA_ON_QPS", split)
			f, a, b := twoHosts(t, softnic.DeviceConfig{})
			sc, rc := connectPair(t, a, 0, b, 0)
			assert.Len(t, sc.qps, 4)
			assert.Len(t, rc.qps, 4)
			want := 1
			if split == "1" {
				want = 4
			}
			assert.Equal(t, want, sc.nDataQPs)
			assert.Equal(t, want, rc.nDataQPs)
			for _, size := range []int{1, 129, 1000, 1 << 20, 3<<20 + 5} {
				got, sizes := transfer(t, sc, rc, []int{size, size / 3}, []int{size, size})
				assert.Equal(t, []int{size, size / 3}, sizes)
				assert.True(t, bytes.Equal(pattern(size, 0), got[0][:size]), "size %d reassembled", size)
				assert.True(t, bytes.Equal(pattern(size/3, 1), got[1][:size/3]))
			}
			_ = f
		})
	}
}

func TestTruncationFailsBothSides(t *testing.T) {
	setEnv(t)
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	sc, rc := connectPair(t, a, 0, b, 0)
	for _, grouped := range []bool{false, true} {
		n := 1
		if grouped {
			n = 3
		}
		rbufs := make([]*buf, n)
		rb := make([]nccl.RecvBuffer, n)
		for i := range rb {
			rbufs[i] = newBuf(t, rc, 256, 0xee)
			rb[i] = nccl.RecvBuffer{Data: rbufs[i].ptr(), Size: 100, Tag: i, MH: rbufs[i].mh}
		}
		rreq, err := rc.Irecv(rb)
		require.NoError(t, err)
		sb := newBuf(t, sc, 4096, 0x11)
		sreqs := make([]nccl.Request, n)
		for i := range sreqs {
			size := 50
			if i == n-1 {
				size = 101 // one byte too many
			}
			within(t, "isend", func() (bool, error) {
				r, err := sc.Isend(sb.ptr(), size, i, sb.mh)
				sreqs[i] = r
				return r != nccl.NoRequest, err
			})
		}
		var rerr error
		within(t, "recv", func() (bool, error) {
			done, err := rc.Test(rreq, make([]int, n))
			rerr = err
			return done || err != nil, nil
		})
		assert.Equal(t, nccl.InvalidUsage, nccl.ResultOf(rerr), "grouped=%v", grouped)
		var serr error
		within(t, "send", func() (bool, error) {
			done, _, err := sc.Test(sreqs[n-1])
			serr = err
			return done || err != nil, nil
		})
		assert.Equal(t, nccl.InvalidUsage, nccl.ResultOf(serr))
		assert.Equal(t, bytes.Repeat([]byte{0xee}, 256), rbufs[n-1].b, "nothing written into the too-small buffer")
		assert.True(t, a.log.has("larger than the posted receive buffer of 100 bytes"), a.log.String())
		assert.True(t, b.log.has("message truncated"), b.log.String())
		for i := 0; i < n-1; i++ {
			within(t, "send", func() (bool, error) { d, _, err := sc.Test(sreqs[i]); return d, err })
		}
		// The connection stays usable.
		got, _ := transfer(t, sc, rc, []int{64}, []int{64})
		assert.Equal(t, pattern(64, 0), got[0][:64])
	}
}

// An iflush naming a byte outside its registration is the caller's error,
// as for isend and irecv: refused with InvalidArgument, the comm still usable
// (posted, the READ would fail on the loopback QP and fail the comm).
func TestIflushOutsideRegistrationIsRefused(t *testing.T) {
	setEnv(t, "NCCL_GO_IB_FORCE_FLUSH", "1")
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	sc, rc := connectPair(t, a, 0, b, 0)
	big := mmapBytes(t, 1<<20)
	mh, err := rc.RegMr(unsafe.Pointer(&big[0]), 4096, nccl.PtrHost)
	require.NoError(t, err)
	defer rc.DeregMr(mh)
	r, err := rc.Iflush([]nccl.RecvBuffer{{Data: unsafe.Pointer(&big[512<<10]), Size: 1, MH: mh}})
	assert.Equal(t, nccl.NoRequest, r)
	require.Error(t, err)
	assert.Equal(t, nccl.InvalidArgument, nccl.ResultOf(err), "%v", err)
	assert.Contains(t, err.Error(), "outside its registration")
	got, sizes := transfer(t, sc, rc, []int{100}, []int{4096})
	assert.Equal(t, []int{100}, sizes, "the comm is still usable")
	assert.Equal(t, pattern(100, 0), got[0][:100])
}

func TestFlush(t *testing.T) {
	t.Run("forced", func(t *testing.T) {
		setEnv(t, "NCCL_GO_IB_FORCE_FLUSH", "1")
		_, a, b := twoHosts(t, softnic.DeviceConfig{})
		sc, rc := connectPair(t, a, 0, b, 0)
		require.True(t, rc.flush.enabled)
		got, sizes := transfer(t, sc, rc, []int{10, 0}, []int{64, 64})
		rb := newBuf(t, rc, 64, 0)
		copy(rb.b, got[0])
		r, err := rc.Iflush([]nccl.RecvBuffer{{Data: rb.ptr(), Size: sizes[0], MH: rb.mh}, {Data: rb.ptr(), Size: 0, MH: rb.mh}})
		require.NoError(t, err)
		require.GreaterOrEqual(t, r, nccl.Request(flushIDBase))
		within(t, "flush", func() (bool, error) { return rc.Test(r, nil) })
		assert.Equal(t, rb.b[0], rc.flush.mem.b[0], "the READ fetched the first received byte")
		r, err = rc.Iflush([]nccl.RecvBuffer{{Data: rb.ptr(), Size: 0, MH: rb.mh}})
		require.NoError(t, err)
		assert.Equal(t, nccl.NoRequest, r, "nothing received: nothing to flush")
	})
	t.Run("post fails part-way", func(t *testing.T) {
		// The READ goes out on the first member and is refused on the
		// second: the comm fails, and the request slot NCCL never sees
		// must not stay taken.
		setEnv(t, "NCCL_GO_IB_FORCE_FLUSH", "1")
		f, a, av, b, bv := fusedHosts(t, 1, 2)
		sc, rc := connectPair(t, a, av, b, bv)
		got, sizes := transfer(t, sc, rc, []int{10}, []int{64})
		rb := newBuf(t, rc, 64, 0)
		copy(rb.b, got[0])
		f.InjectFault(softnic.Fault{Device: "simB_1", Ops: []verbs.Opcode{verbs.WrRDMARead}, PostErr: verbs.ENOMEM, Count: 1})
		r, err := rc.Iflush([]nccl.RecvBuffer{{Data: rb.ptr(), Size: sizes[0], MH: rb.mh}})
		assert.Equal(t, nccl.NoRequest, r)
		assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
		assert.ErrorContains(t, err, "simB_1")
		assert.Zero(t, rc.flush.reqs.InUse(), "the failed flush's slot is released")
		// The READ posted on simB_0 completes into a free slot: progress
		// must ignore it, and later calls fail fast with the first error.
		_, err = rc.Iflush([]nccl.RecvBuffer{{Data: rb.ptr(), Size: sizes[0], MH: rb.mh}})
		assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
		assert.Zero(t, rc.flush.reqs.InUse())
		require.NoError(t, rc.Close())
	})
	t.Run("disabled", func(t *testing.T) {
		setEnv(t, "NCCL_GO_IB_FORCE_FLUSH", "1", "NCCL_GDR_FLUSH_DISABLE", "1")
		_, a, b := twoHosts(t, softnic.DeviceConfig{})
		_, rc := connectPair(t, a, 0, b, 0)
		rb := newBuf(t, rc, 64, 0)
		r, err := rc.Iflush([]nccl.RecvBuffer{{Data: rb.ptr(), Size: 8, MH: rb.mh}})
		require.NoError(t, err)
		assert.Equal(t, nccl.NoRequest, r)
	})
	t.Run("host memory only", func(t *testing.T) {
		setEnv(t)
		_, a, b := twoHosts(t, softnic.DeviceConfig{})
		_, rc := connectPair(t, a, 0, b, 0)
		assert.False(t, rc.flush.enabled, "no GPU-direct support, no forcing: no flush")
	})
}
