package socket

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// TestGroupedTagsInterleaved: two grouped receives {tag 1, tag 2} are
// posted; the sender's tag-1 stream runs one step ahead of its tag-2 stream
// (A1, A2, B1, B2). NCCL's IB transport (per-tag FIFO through its CTS slots)
// delivers A1,B1 to the first receive and A2,B2 to the second. Only reachable
// in NCCL with PXN shared comms, which needs GDR (not the socket transport).
func TestGroupedTagsInterleaved(t *testing.T) {
	withEnv(t, map[string]string{envNThreads: "0"})
	tr := initLoopback(t, &captureLog{})
	s, r := pair(t, tr)
	bufs := make([][]byte, 4)
	for i := range bufs {
		bufs[i] = make([]byte, 64)
	}
	var rq [2]nccl.Request
	for g := 0; g < 2; g++ {
		var err error
		rq[g], err = r.Irecv([]nccl.RecvBuffer{{Data: bufPtr(bufs[2*g]), Size: 64, Tag: 1}, {Data: bufPtr(bufs[2*g+1]), Size: 64, Tag: 2}})
		require.NoError(t, err)
	}
	src := []byte("A1A2B1B2")
	var sq []nccl.Request
	for i, tag := range []int{1, 1, 2, 2} {
		q, err := s.Isend(bufPtr(src[2*i:]), 2, tag, 0)
		require.NoError(t, err)
		sq = append(sq, q)
	}
	deadline := time.Now().Add(5 * time.Second)
	done := [2]bool{}
	for !done[0] || !done[1] {
		for _, q := range sq {
			s.Test(q)
		}
		for g := range rq {
			if done[g] {
				continue
			}
			sizes := make([]int, 2)
			d, err := r.Test(rq[g], sizes)
			require.NoError(t, err)
			done[g] = d
		}
		require.True(t, time.Now().Before(deadline))
	}
	require.Equal(t, "A1", string(bufs[0][:2]))
	require.Equal(t, "B1", string(bufs[1][:2]))
	require.Equal(t, "A2", string(bufs[2][:2]))
	require.Equal(t, "B2", string(bufs[3][:2]))
}

// TestGroupedTagAheadOfItsReceiveFails: with only the first grouped receive
// posted, a second message for the tag whose buffer already has one fails
// the connection with InvalidUsage, as a tag no posted receive carries does.
// It cannot wait for a later receive as an IB send does: the control stream
// is ordered, and the message the first receive lacks (B1) is behind it
// (FuzzControlStream found the receive that then never completes).
func TestGroupedTagAheadOfItsReceiveFails(t *testing.T) {
	withEnv(t, map[string]string{envNThreads: "0"})
	tr := initLoopback(t, &captureLog{})
	s, r := pair(t, tr)
	bufs := [][]byte{make([]byte, 64), make([]byte, 64)}
	first, err := r.Irecv([]nccl.RecvBuffer{{Data: bufPtr(bufs[0]), Size: 64, Tag: 1}, {Data: bufPtr(bufs[1]), Size: 64, Tag: 2}})
	require.NoError(t, err)
	src := []byte("A1A2B1")
	var sends []nccl.Request
	for i, tag := range []int{1, 1, 2} {
		q, err := s.Isend(bufPtr(src[2*i:]), 2, tag, 0)
		require.NoError(t, err)
		sends = append(sends, q)
	}
	sizes := make([]int, 2)
	for end := time.Now().Add(5 * time.Second); err == nil && time.Now().Before(end); {
		for _, q := range sends {
			s.Test(q)
		}
		var done bool
		done, err = r.Test(first, sizes)
		require.False(t, done, "B1 is behind A2 on the stream")
	}
	require.Error(t, err, "the receive neither completed nor failed")
	assert.Equal(t, nccl.InvalidUsage, nccl.ResultOf(err))
	assert.Contains(t, err.Error(), "tag 1 matches no free buffer of the posted receives")
}
