package socket

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// fenceEnv: two data streams, each with its helper, nothing inline, so that
// every byte of a message is a chunk a helper may move.
var fenceEnv = map[string]string{envNThreads: "2", envHelpers: "2", envInline: "0", envIdleInline: "0"}

// holdStreams takes every data stream of c as its busy holder would, so that
// neither NCCL's thread nor a helper moves them, until the returned func.
func holdStreams(t *testing.T, c *core) func() {
	t.Helper()
	for _, s := range c.streams {
		require.True(t, s.busy.CompareAndSwap(0, 1), "a stream was busy")
	}
	return func() {
		for _, s := range c.streams {
			s.busy.Store(0)
		}
	}
}

// postHeld posts a receive of dst (registered as mh) and a send of src
// while the sender's streams are held, and drives both ends until the
// receive's chunks are queued; release lets the sender's bytes go.
func postHeld(t *testing.T, s *sendComm, r *recvComm, src, dst []byte, mh nccl.MemHandle) (sq, rq nccl.Request, release func()) {
	t.Helper()
	release = holdStreams(t, &s.core)
	rq, err := r.Irecv([]nccl.RecvBuffer{{Data: bufPtr(dst), Size: len(dst), Tag: 1, MH: mh}})
	require.NoError(t, err)
	sq, err = s.Isend(bufPtr(src), len(src), 1, 0)
	require.NoError(t, err)
	untilMatched(t, s, r, sq, rq)
	return sq, rq, release
}

// untilMatched drives both ends until the receive has its chunks queued.
func untilMatched(t *testing.T, s *sendComm, r *recvComm, sq, rq nccl.Request) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !r.streams[0].pending() {
		s.Test(sq)
		r.Test(rq, nil)
		require.True(t, time.Now().Before(deadline), "the receive never matched")
	}
}

// finish drives both ends until the transfer completed, and checks its bytes.
func finish(t *testing.T, s *sendComm, r *recvComm, sq, rq nccl.Request, src, dst []byte) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for sdone, rdone := false, false; !sdone || !rdone; {
		var err error
		if !sdone {
			sdone, _, err = s.Test(sq)
			require.NoError(t, err)
		}
		if !rdone {
			rdone, err = r.Test(rq, nil)
			require.NoError(t, err)
		}
		require.True(t, time.Now().Before(deadline), "the transfer did not finish")
	}
	assert.True(t, bytes.Equal(src, dst))
}

// NCCL deregisters and frees a comm's buffers before it closes the comm
// (net.cc's recvProxyFree: deregMr, free, then closeRecv), after an abort
// with transfers still queued. Once DeregMr returned, no helper may write
// into the buffer: here the sender's bytes arrive only after it, and the
// buffer must stay as the test left it.
func TestDeregMrFencesTheReceivingHelpers(t *testing.T) {
	withEnv(t, fenceEnv)
	tr := initLoopback(t, &captureLog{})
	s, r := pair(t, tr)
	require.Len(t, r.helpers, 2)
	const size = 8 << 20
	src, dst := bytes.Repeat([]byte{0x5a}, size), make([]byte, size)
	rmh, err := r.RegMr(bufPtr(dst), size, nccl.PtrHost)
	require.NoError(t, err)

	release := holdStreams(t, &s.core) // the data stays with the sender for now
	rq, err := r.Irecv([]nccl.RecvBuffer{{Data: bufPtr(dst), Size: size, Tag: 1, MH: rmh}})
	require.NoError(t, err)
	sq, err := s.Isend(bufPtr(src), size, 1, 0)
	require.NoError(t, err)
	// The receive matches once its header arrived: its chunks are queued on
	// the receiving streams, waiting for bytes.
	deadline := time.Now().Add(5 * time.Second)
	for !r.streams[0].pending() || !r.streams[1].pending() {
		_, _, err = s.Test(sq)
		require.NoError(t, err)
		done, err := r.Test(rq, nil)
		require.NoError(t, err)
		require.False(t, done)
		require.True(t, time.Now().Before(deadline), "the receive never matched")
	}

	require.NoError(t, r.DeregMr(rmh))
	// NCCL frees the buffer now; whatever a helper wrote would land here.
	for i := range dst {
		dst[i] = 0xee
	}
	release()
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); time.Sleep(time.Millisecond) {
		s.Test(sq)
	}
	written := 0
	for _, b := range dst {
		if b != 0xee {
			written++
		}
	}
	assert.Zero(t, written, "bytes written into the buffer after DeregMr")
	_, err = r.Test(rq, nil)
	require.Error(t, err, "the receive whose buffer went away fails")
	assert.Contains(t, err.Error(), "was deregistered while a transfer in it was still queued")
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
}

// The sending side: after DeregMr no helper reads the buffer. Unmapped, a
// read would be EFAULT from the kernel; the connection must have failed by
// the fence instead, before anything touched the unmapped range.
func TestDeregMrFencesTheSendingHelpers(t *testing.T) {
	withEnv(t, fenceEnv)
	tr := initLoopback(t, &captureLog{})
	s, r := pair(t, tr)
	const size = 64 << 20 // more than the socket buffers hold: chunks stay queued
	src, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	unmapped := false
	t.Cleanup(func() {
		if !unmapped {
			unix.Munmap(src)
		}
	})
	smh, err := s.RegMr(bufPtr(src), size, nccl.PtrHost)
	require.NoError(t, err)
	dst := make([]byte, size)
	release := holdStreams(t, &r.core) // the receiver reads nothing yet
	rq, err := r.Irecv([]nccl.RecvBuffer{{Data: bufPtr(dst), Size: size, Tag: 1}})
	require.NoError(t, err)
	sq, err := s.Isend(bufPtr(src), size, 1, smh)
	require.NoError(t, err)
	for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end); time.Sleep(time.Millisecond) {
		done, _, err := s.Test(sq)
		require.NoError(t, err)
		require.False(t, done, "64 MiB went into socket buffers that nobody read")
		r.Test(rq, nil)
	}

	require.NoError(t, s.DeregMr(smh))
	require.NoError(t, unix.Munmap(src))
	unmapped = true
	release()
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); time.Sleep(time.Millisecond) {
		r.Test(rq, nil)
	}
	_, _, err = s.Test(sq)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "was deregistered while a transfer in it was still queued")
	assert.False(t, strings.Contains(err.Error(), "bad address"), "a helper read the unmapped buffer: %v", err)
}

// Deregistering memory no queued chunk lies in (the usual case: NCCL drops a
// buffer it no longer uses) leaves the connection and its transfers alone.
func TestDeregMrOfIdleMemoryChangesNothing(t *testing.T) {
	withEnv(t, fenceEnv)
	tr := initLoopback(t, &captureLog{})
	s, r := pair(t, tr)
	const size = 4 << 20
	idle := make([]byte, 4096)
	imh, err := r.RegMr(bufPtr(idle), len(idle), nccl.PtrHost)
	require.NoError(t, err)
	src, dst := bytes.Repeat([]byte{0x3c}, size), make([]byte, size)
	sq, rq, release := postHeld(t, s, r, src, dst, 0)
	require.NoError(t, r.DeregMr(imh), "chunks are queued, but none in this range")
	release()
	finish(t, s, r, sq, rq, src, dst)
}

// A connection whose streams all arrived but that the listening end cannot
// set up (here: no eventfd for its helpers) is Accept's error in its turn.
// The connector already holds its comm; dropping the connection silently
// left NCCL calling accept for it forever.
func TestAcceptReportsAConnectionItCouldNotSetUp(t *testing.T) {
	withEnv(t, fenceEnv)
	tr := initLoopback(t, &captureLog{})
	var h nccl.Handle
	l, err := tr.Listen(0, &h)
	require.NoError(t, err)
	defer l.Close()
	var sc nccl.SendComm
	deadline := time.Now().Add(10 * time.Second)
	for sc == nil {
		sc, err = tr.Connect(0, &h, nccl.ConnectOptions{})
		require.NoError(t, err)
		require.True(t, time.Now().Before(deadline), "connect did not finish")
	}
	defer sc.Close()
	helperEventfd.Set(t, func() (int, error) { return -1, unix.EMFILE })
	var rc nccl.RecvComm
	for err == nil {
		rc, err = l.Accept()
		require.Nil(t, rc, "a comm without its helpers")
		require.True(t, time.Now().Before(deadline), "accept neither returned the comm nor failed")
	}
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
	assert.Contains(t, err.Error(), "setting up the connection from 127.0.0.1")
	assert.Contains(t, err.Error(), "too many open files")
	rc, err = l.Accept()
	assert.NoError(t, err, "the failure is reported once")
	assert.Nil(t, rc)
}

// Memory another registration of the comm still covers is not freed by
// NCCL when one handle goes (ib's MR cache keeps it registered, too): the
// fence leaves such a transfer alone, also when the coverage is pieced
// together from two registrations.
func TestDeregMrOfMemoryStillRegisteredChangesNothing(t *testing.T) {
	withEnv(t, fenceEnv)
	tr := initLoopback(t, &captureLog{})
	s, r := pair(t, tr)
	const size = 4 << 20
	src, dst := bytes.Repeat([]byte{0x77}, size), make([]byte, size)
	whole, err := r.RegMr(bufPtr(dst), size, nccl.PtrHost)
	require.NoError(t, err)
	_, err = r.RegMr(bufPtr(dst), size/2, nccl.PtrHost)
	require.NoError(t, err)
	_, err = r.RegMr(bufPtr(dst[size/2:]), size/2, nccl.PtrHost)
	require.NoError(t, err)
	sq, rq, release := postHeld(t, s, r, src, dst, whole)
	require.NoError(t, r.DeregMr(whole), "the two halves still cover the buffer")
	release()
	finish(t, s, r, sq, rq, src, dst)
}

func TestCovered(t *testing.T) {
	rs := []memRange{{100, 200}, {150, 300}, {400, 500}}
	assert.True(t, covered(100, 300, rs), "pieced together")
	assert.True(t, covered(120, 130, rs))
	assert.False(t, covered(250, 450, rs), "a gap at [300, 400)")
	assert.False(t, covered(50, 150, rs))
	assert.False(t, covered(10, 20, nil))
	assert.True(t, covered(10, 10, nil), "nothing to cover")
}

// A stream whose busy lock is never given back (a panic recovered at the C
// boundary inside a move) must not hang NCCL's teardown in DeregMr: after
// fenceWait the fence fails safe, as if the range were queued there.
func TestDeregMrIsBoundedWhenAStreamStaysBusy(t *testing.T) {
	withEnv(t, fenceEnv)
	tr := initLoopback(t, &captureLog{})
	_, r := pair(t, tr)
	buf := make([]byte, 1<<20)
	mh, err := r.RegMr(bufPtr(buf), len(buf), nccl.PtrHost)
	require.NoError(t, err)
	require.True(t, r.streams[1].busy.CompareAndSwap(0, 1))
	defer r.streams[1].busy.Store(0)
	start := time.Now()
	require.NoError(t, r.DeregMr(mh))
	took := time.Since(start)
	assert.GreaterOrEqual(t, took, fenceWait)
	assert.Less(t, took, 30*fenceWait, "bounded")
	require.Error(t, r.failed(), "failed safe")
}
