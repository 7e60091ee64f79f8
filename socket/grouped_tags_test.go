package socket

import (
	"testing"
	"time"

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

// TestGroupedTagAheadWaitsForItsReceive: with only the first grouped receive
// posted, a second message for a tag whose buffer already has one waits for
// the next receive (as an IB send waits for its clear-to-send) instead of
// failing the connection, and lands there once it is posted; a tag that no
// posted receive carries still fails.
func TestGroupedTagAheadWaitsForItsReceive(t *testing.T) {
	withEnv(t, map[string]string{envNThreads: "0"})
	tr := initLoopback(t, &captureLog{})
	s, r := pair(t, tr)
	bufs := make([][]byte, 4)
	for i := range bufs {
		bufs[i] = make([]byte, 64)
	}
	post := func(g int) nccl.Request {
		q, err := r.Irecv([]nccl.RecvBuffer{{Data: bufPtr(bufs[2*g]), Size: 64, Tag: 1}, {Data: bufPtr(bufs[2*g+1]), Size: 64, Tag: 2}})
		require.NoError(t, err)
		return q
	}
	src := []byte("A1A2B1B2")
	var sends []nccl.Request
	send := func(i, tag int) {
		q, err := s.Isend(bufPtr(src[2*i:]), 2, tag, 0)
		require.NoError(t, err)
		sends = append(sends, q)
	}
	sizes := make([]int, 2)
	poll := func(q nccl.Request) bool {
		for _, sq := range sends {
			s.Test(sq)
		}
		d, err := r.Test(q, sizes)
		require.NoError(t, err, "a message ahead of its receive must wait, not fail the connection")
		return d
	}
	first := post(0)
	send(0, 1)
	send(1, 1) // A2: the first receive's tag-1 buffer is A1's
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
		require.False(t, poll(first), "the first receive lacks its tag-2 message")
	}
	second := post(1)
	send(2, 2)
	send(3, 2)
	deadline := time.Now().Add(5 * time.Second)
	for _, q := range []nccl.Request{first, second} {
		for !poll(q) {
			require.True(t, time.Now().Before(deadline), "a receive never completed")
		}
		require.Equal(t, []int{2, 2}, sizes)
	}
	require.Equal(t, "A1", string(bufs[0][:2]))
	require.Equal(t, "B1", string(bufs[1][:2]))
	require.Equal(t, "A2", string(bufs[2][:2]))
	require.Equal(t, "B2", string(bufs[3][:2]))

	third := post(0)
	send(0, 7)
	var err error
	for end := time.Now().Add(5 * time.Second); err == nil && time.Now().Before(end); {
		_, err = r.Test(third, sizes)
	}
	require.Error(t, err, "a tag no posted receive carries")
	require.Equal(t, nccl.InvalidUsage, nccl.ResultOf(err))
	require.Contains(t, err.Error(), "tag 7 matches no buffer of the posted receives")
}
