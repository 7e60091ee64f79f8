package shm

import (
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

func TestMessagesOfEverySizeWrapTheRing(t *testing.T) {
	shmDir(t)
	t.Setenv(envRing, fmt.Sprint(minRing)) // small ring: every size below wraps it
	s, r := connectPair(t, newTransport(t))
	require.EqualValues(t, minRing, s.r.ringSize)
	sizes := []int{0, 1, 7, 4096, minRing - 1, minRing, minRing + 1, 3*minRing + 13, 1 << 20, 5<<20 + 3}
	for i, n := range sizes {
		src := pattern(n, byte(i))
		dst := make([]byte, n+64)
		for j := range dst {
			dst[j] = 0xEE
		}
		rid, err := r.Irecv([]nccl.RecvBuffer{{Data: ptr(dst), Size: n + 16, Tag: 3, MH: 1}})
		require.NoError(t, err)
		sid := isendRetry(t, s, r, src, 3)
		got := []int{-1}
		sent := waitBoth(t, s, sid, r, rid, got)
		assert.Equal(t, n, sent, "size %d: sender's count", n)
		assert.Equal(t, n, got[0], "size %d: receiver's count", n)
		require.Equal(t, src, dst[:n], "size %d: payload", n)
		for j := n; j < len(dst); j++ {
			require.EqualValues(t, 0xEE, dst[j], "size %d: byte %d past the message was written", n, j)
		}
	}
}

func TestOneGiBMessageStreamsThroughABoundedRing(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 1 GiB; skipped in -short mode")
	}
	shmDir(t)
	s, r := connectPair(t, newTransport(t))
	n := nccl.MaxNetSize
	src := make([]byte, n)
	dst := make([]byte, n)
	for i := 0; i < n; i += 4096 {
		src[i] = byte(i >> 12)
	}
	src[n-1] = 0x5A
	rid, err := r.Irecv([]nccl.RecvBuffer{{Data: ptr(dst), Size: n, Tag: 0}})
	require.NoError(t, err)
	sid := isendRetry(t, s, r, src, 0)
	got := []int{0}
	assert.Equal(t, n, waitBoth(t, s, sid, r, rid, got))
	assert.Equal(t, n, got[0])
	for i := 0; i < n; i += 4096 {
		if src[i] != dst[i] {
			t.Fatalf("byte %d differs", i)
		}
	}
	assert.EqualValues(t, 0x5A, dst[n-1])
	assert.LessOrEqual(t, s.r.ringSize, uint64(maxRing), "the ring is sized by the setting, not by the message")
}

func TestGroupedReceiveSelectsBuffersByTag(t *testing.T) {
	shmDir(t)
	s, r := connectPair(t, newTransport(t))
	bufs := make([]nccl.RecvBuffer, maxRecvs)
	dst := make([][]byte, maxRecvs)
	for i := range bufs {
		dst[i] = make([]byte, 1000)
		bufs[i] = nccl.RecvBuffer{Data: ptr(dst[i]), Size: 1000, Tag: 100 + i}
	}
	rid, err := r.Irecv(bufs)
	require.NoError(t, err)
	// Sends arrive in reverse tag order, each with its own size.
	srcs := make([][]byte, maxRecvs)
	var sids []nccl.Request
	for i := maxRecvs - 1; i >= 0; i-- {
		srcs[i] = pattern(10*i+1, byte(i))
		sids = append(sids, isendRetry(t, s, r, srcs[i], 100+i))
	}
	sizes := make([]int, maxRecvs)
	done := false
	drive(t, "grouped receive", func() bool {
		done, err = r.Test(rid, sizes)
		require.NoError(t, err)
		return done
	})
	for i := range bufs {
		assert.Equal(t, 10*i+1, sizes[i], "buffer %d size", i)
		assert.Equal(t, srcs[i], dst[i][:sizes[i]], "buffer %d payload", i)
	}
	for _, id := range sids {
		ok, _, err := s.Test(id)
		require.NoError(t, err)
		assert.True(t, ok)
	}
}

func TestSameTagWaitsForTheNextReceive(t *testing.T) {
	shmDir(t)
	s, r := connectPair(t, newTransport(t))
	a, b := make([]byte, 8), make([]byte, 8)
	r1, err := r.Irecv([]nccl.RecvBuffer{{Data: ptr(a), Size: 8, Tag: 1}, {Data: ptr(b), Size: 8, Tag: 2}})
	require.NoError(t, err)
	first := isendRetry(t, s, r, []byte("tag1-one"), 1)
	// Tag 1's buffer of the oldest receive is taken: the next tag-1 send must
	// wait (NoRequest) until the receive completes and a new one is posted.
	id, err := s.Isend(ptr([]byte("tag1-two")), 8, 1, 1)
	require.NoError(t, err)
	assert.Equal(t, nccl.NoRequest, id)
	// A tag the oldest receive does not have at all is a usage error.
	_, err = s.Isend(ptr(a), 1, 9, 1)
	assert.Equal(t, nccl.InvalidUsage, nccl.ResultOf(err))
	second := isendRetry(t, s, r, []byte("tag2-one"), 2)
	sizes := []int{0, 0}
	waitBoth(t, s, first, r, r1, sizes)
	ok, _, err := s.Test(second)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, "tag1-one", string(a))
	assert.Equal(t, "tag2-one", string(b))
	c := make([]byte, 8)
	r2, err := r.Irecv([]nccl.RecvBuffer{{Data: ptr(c), Size: 8, Tag: 1}})
	require.NoError(t, err)
	third := isendRetry(t, s, r, []byte("tag1-two"), 1)
	waitBoth(t, s, third, r, r2, sizes[:1])
	assert.Equal(t, "tag1-two", string(c))
}

func TestRequestLimitsAndFIFOOrder(t *testing.T) {
	shmDir(t)
	s, r := connectPair(t, newTransport(t))
	// 32 grouped receives of maxRecvs buffers each, all in flight at once.
	dst := make([][]byte, ctsSlots*maxRecvs)
	rids := make([]nccl.Request, ctsSlots)
	for k := 0; k < ctsSlots; k++ {
		bufs := make([]nccl.RecvBuffer, maxRecvs)
		for e := range bufs {
			dst[k*maxRecvs+e] = make([]byte, 16)
			bufs[e] = nccl.RecvBuffer{Data: ptr(dst[k*maxRecvs+e]), Size: 16, Tag: e}
		}
		id, err := r.Irecv(bufs)
		require.NoError(t, err)
		require.NotEqual(t, nccl.NoRequest, id, "receive %d of %d refused", k, ctsSlots)
		rids[k] = id
	}
	extra, err := r.Irecv([]nccl.RecvBuffer{{Data: ptr(make([]byte, 1)), Size: 1}})
	require.NoError(t, err)
	assert.Equal(t, nccl.NoRequest, extra, "a 33rd receive must wait")
	// 32*maxRecvs sends in flight without testing any of them.
	sids := make([]nccl.Request, 0, descCap)
	for i := 0; i < descCap; i++ {
		msg := []byte(fmt.Sprintf("msg-%04d-%07d", i, i*31)) // 16 bytes
		id, err := s.Isend(ptr(msg), len(msg), i%maxRecvs, 1)
		require.NoError(t, err)
		require.NotEqual(t, nccl.NoRequest, id, "send %d of %d refused", i, descCap)
		sids = append(sids, id)
	}
	id, err := s.Isend(ptr(make([]byte, 16)), 16, 0, 1)
	require.NoError(t, err, "exhaustion is not an error")
	assert.Equal(t, nccl.NoRequest, id, "every request in use: NULL, NCCL retries")
	for i, id := range sids {
		ok, n, err := s.Test(id)
		require.NoError(t, err)
		require.True(t, ok, "send %d", i)
		require.Equal(t, 16, n)
	}
	sizes := make([]int, maxRecvs)
	for k, id := range rids {
		drive(t, "receive", func() bool {
			ok, err := r.Test(id, sizes)
			require.NoError(t, err)
			return ok
		})
		for e := 0; e < maxRecvs; e++ {
			i := k*maxRecvs + e
			assert.Equal(t, fmt.Sprintf("msg-%04d-%07d", i, i*31), string(dst[i]), "FIFO order: receive %d buffer %d", k, e)
		}
	}
}

func TestTruncationFailsBothSidesAndWritesNothing(t *testing.T) {
	shmDir(t)
	s, r := connectPair(t, newTransport(t))
	dst := make([]byte, 128)
	for i := range dst {
		dst[i] = 0xAB
	}
	rid, err := r.Irecv([]nccl.RecvBuffer{{Data: ptr(dst), Size: 64, Tag: 0}})
	require.NoError(t, err)
	sid := isendRetry(t, s, r, pattern(100, 1), 0)
	done, _, sendErr := s.Test(sid)
	assert.False(t, done)
	require.Error(t, sendErr)
	assert.Equal(t, nccl.InvalidUsage, nccl.ResultOf(sendErr))
	assert.Contains(t, sendErr.Error(), "truncated")
	_, err = r.Test(rid, []int{0})
	require.Error(t, err)
	assert.Equal(t, nccl.InvalidUsage, nccl.ResultOf(err))
	for i, b := range dst {
		require.EqualValues(t, 0xAB, b, "byte %d written", i)
	}
	// The connection stays usable for well-formed messages.
	ok := make([]byte, 64)
	rid, err = r.Irecv([]nccl.RecvBuffer{{Data: ptr(ok), Size: 64, Tag: 0}})
	require.NoError(t, err)
	sid = isendRetry(t, s, r, pattern(64, 2), 0)
	waitBoth(t, s, sid, r, rid, []int{0})
	assert.Equal(t, pattern(64, 2), ok)
}

func TestPeerCloseFailsOutstandingReceive(t *testing.T) {
	shmDir(t)
	s, r := connectPair(t, newTransport(t))
	dst := make([]byte, 1<<20)
	rid, err := r.Irecv([]nccl.RecvBuffer{{Data: ptr(dst), Size: len(dst), Tag: 0}})
	require.NoError(t, err)
	// Data the sender left in the ring before closing is still delivered...
	src := pattern(1000, 9)
	sid := isendRetry(t, s, r, src, 0)
	ok, _, err := s.Test(sid)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, s.Close())
	sizes := []int{0}
	drive(t, "receive after close", func() bool {
		done, err := r.Test(rid, sizes)
		require.NoError(t, err)
		return done
	})
	assert.Equal(t, src, dst[:1000])
	// ...and a receive nobody will ever fill fails instead of hanging.
	rid, err = r.Irecv([]nccl.RecvBuffer{{Data: ptr(dst), Size: 10, Tag: 0}})
	require.NoError(t, err)
	var testErr error
	drive(t, "receive from a closed peer", func() bool {
		_, testErr = r.Test(rid, sizes)
		return testErr != nil
	})
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(testErr))
	assert.Contains(t, testErr.Error(), "closed")
}

func TestCloseWithRequestsOutstandingUnmapsAndUnlinks(t *testing.T) {
	dir := shmDir(t)
	tr := newTransport(t)
	s, r := connectPair(t, tr)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries, "the connection file is unlinked once accepted")
	for i := 0; i < 4; i++ {
		_, err := r.Irecv([]nccl.RecvBuffer{{Data: ptr(make([]byte, 4*minRing)), Size: 4 * minRing, Tag: 0}})
		require.NoError(t, err)
	}
	_ = isendRetry(t, s, r, make([]byte, 3*minRing), 0)
	require.NoError(t, s.Close())
	require.NoError(t, r.Close())
	assert.Nil(t, s.r)
	assert.Nil(t, r.r)
	_, err = r.Irecv([]nccl.RecvBuffer{{Data: ptr(make([]byte, 8)), Size: 8}})
	assert.Equal(t, nccl.InternalError, nccl.ResultOf(err), "use after close is an error, not a crash")
}

func TestDataPathDoesNotAllocate(t *testing.T) {
	shmDir(t)
	s, r := connectPair(t, newTransport(t))
	src, dst := pattern(4096, 3), make([]byte, 4096)
	bufs := []nccl.RecvBuffer{{Data: ptr(dst), Size: len(dst), Tag: 0}}
	sizes := []int{0}
	allocs := testing.AllocsPerRun(200, func() {
		rid, err := r.Irecv(bufs)
		if err != nil || rid == nccl.NoRequest {
			t.Fatalf("irecv: %v %v", rid, err)
		}
		sid, err := s.Isend(ptr(src), len(src), 0, 1)
		if err != nil || sid == nccl.NoRequest {
			t.Fatalf("isend: %v %v", sid, err)
		}
		for {
			ok, _, err := s.Test(sid)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				break
			}
		}
		for {
			ok, err := r.Test(rid, sizes)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				break
			}
		}
	})
	assert.Zero(t, allocs)
	// Idle polling (nothing posted by the peer) must not allocate either.
	rid, err := r.Irecv(bufs)
	require.NoError(t, err)
	allocs = testing.AllocsPerRun(1000, func() {
		if ok, err := r.Test(rid, sizes); ok || err != nil {
			t.Fatalf("unexpected completion %v %v", ok, err)
		}
	})
	assert.Zero(t, allocs)
}
