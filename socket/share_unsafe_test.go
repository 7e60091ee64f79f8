package socket

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/internal/clock"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

func TestOverdue(t *testing.T) {
	const after = 100
	var s stream
	if s.overdue(1000, after) {
		t.Fatal("overdue at the first look")
	}
	if s.overdue(1099, after) {
		t.Fatal("overdue before the period passed")
	}
	if !s.overdue(1100, after) {
		t.Fatal("not overdue after a period without progress")
	}
	if s.overdue(1150, after) || !s.overdue(1200, after) {
		t.Fatal("a stuck stream must be overdue once per period, not on every look")
	}
	s.moves.Add(1) // the helper moved bytes
	if s.overdue(1300, after) || s.overdue(1399, after) || !s.overdue(1400, after) {
		t.Fatal("progress must restart the period")
	}
	s.seenAt = 0 // pump saw the ring empty
	if s.overdue(5000, after) {
		t.Fatal("a stream that just got work is overdue because of old history")
	}
}

// shared is a sending data stream over a socket pair whose helper exists
// but never runs (as on a host with no core for it), with one 4 KiB chunk
// queued: what reaches the peer was moved by NCCL's thread.
type shared struct {
	c    *core
	s    *stream
	peer int
	buf  []byte
	left atomic.Int32
}

func sharedStream(t *testing.T, shareAfter time.Duration) *shared {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	x := &shared{peer: fds[1], buf: make([]byte, 4096)}
	x.c = &core{log: nccl.DiscardLogger{}, peer: "test peer", shareAfter: int64(shareAfter)}
	x.s = &stream{fd: fds[0], send: true}
	x.s.h = &helper{c: x.c, streams: []*stream{x.s}}
	x.c.streams = []*stream{x.s}
	x.c.helpers = []*helper{x.s.h}
	x.left.Store(1)
	x.s.push(task{p: unsafe.Pointer(&x.buf[0]), n: len(x.buf), left: &x.left})
	return x
}

// arrived is how many bytes the peer can read.
func (x *shared) arrived(t *testing.T) int {
	t.Helper()
	n, err := unix.IoctlGetInt(x.peer, unix.SIOCINQ)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestNCCLThreadLeavesStreamToItsHelper(t *testing.T) {
	const after = 20 * time.Millisecond
	x := sharedStream(t, after)
	x.c.pump(true)
	first := x.s.seenAt
	if first == 0 {
		t.Fatal("pump did not note when it first saw the chunk pending")
	}
	for range 100 {
		x.c.pump(true)
		// A pump that ended within the period read a clock within it.
		if clock.Now()-first < int64(after) {
			if n := x.arrived(t); n != 0 {
				t.Fatalf("NCCL's thread moved %d bytes of a stream whose helper was still within its %v", n, after)
			}
		}
	}
	time.Sleep(after)
	x.c.pump(true)
	if n := x.arrived(t); n != len(x.buf) || x.left.Load() != 0 {
		t.Fatalf("after %v without progress NCCL's thread should have moved the chunk: peer has %d of %d bytes, %d chunks left",
			after, n, len(x.buf), x.left.Load())
	}
}

func TestNCCLThreadWaitsWhileHelperProgresses(t *testing.T) {
	const after = 5 * time.Millisecond
	x := sharedStream(t, after)
	x.c.pump(true)
	for range 5 {
		time.Sleep(after * 2)
		x.s.moves.Add(1) // what a helper at work does
		x.c.pump(true)
	}
	if n := x.arrived(t); n != 0 {
		t.Fatalf("NCCL's thread moved %d bytes while the stream's helper kept making progress", n)
	}
}

func TestEagerSharing(t *testing.T) {
	x := sharedStream(t, 0)
	x.c.pump(true)
	if n := x.arrived(t); n != len(x.buf) {
		t.Fatalf("NCCL_GO_SOCKET_SHARE_AFTER=0: NCCL's thread should move at once; peer has %d of %d bytes", n, len(x.buf))
	}
}

func TestShareAfterSetting(t *testing.T) {
	log := &captureLog{}
	withEnv(t, nil)
	if got := shareAfterNs(log); got != int64(defaultShareAfter) {
		t.Errorf("default %d ns, want %d", got, int64(defaultShareAfter))
	}
	withEnv(t, map[string]string{envShareAfter: "0"})
	if got := shareAfterNs(log); got != 0 {
		t.Errorf("%s=0 gave %d ns", envShareAfter, got)
	}
	withEnv(t, map[string]string{envShareAfter: "250"})
	if got := shareAfterNs(log); got != 250_000 {
		t.Errorf("%s=250 gave %d ns, want 250000 (microseconds)", envShareAfter, got)
	}
	withEnv(t, map[string]string{envShareAfter: "-1"})
	if got := shareAfterNs(log); got != int64(defaultShareAfter) {
		t.Errorf("%s=-1 gave %d ns, want the default", envShareAfter, got)
	}
	if want := "NCCL_GO_SOCKET_SHARE_AFTER"; !strings.Contains(log.String(), want) {
		t.Errorf("no WARN naming %s for -1: %q", want, log.String())
	}
}

// A helper has handed a striped send's last bytes to the kernel but is
// descheduled before it counts them; the receiver reads everything,
// completes and closes its comm. The sender's Test must not fail a send that
// was delivered: it waits for the helper, then reports done. The test plays
// the descheduled helper by holding the stream itself.
func TestPeerClosedWhileHelperHoldsADeliveredSend(t *testing.T) {
	withEnv(t, map[string]string{envNThreads: "1", envHelpers: "1", envInline: "0", envIdleInline: "0", envTimeout: "1"})
	log := &captureLog{}
	tr := initLoopback(t, log)
	s, r := pair(t, tr)
	st := s.streams[0]
	for !st.busy.CompareAndSwap(0, 1) { // the helper's hold: nobody else moves it
	}
	const size = 64 << 10
	src := make([]byte, size)
	pattern(src, 1)
	dst := make([]byte, size)
	sq, err := s.Isend(bufPtr(src), size, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	tk := st.ring[st.head.Load()%ringSize]
	for st.off < tk.n { // the helper's move: every byte to the kernel
		n, err := sendFrom(st.fd, unsafe.Add(tk.p, st.off), tk.n-st.off)
		if err != nil {
			t.Fatal(err)
		}
		st.off += n
	}
	rq, err := r.Irecv([]nccl.RecvBuffer{{Data: bufPtr(dst), Size: size, Tag: 1}})
	if err != nil {
		t.Fatal(err)
	}
	for done := false; !done; {
		if done, err = r.Test(rq, nil); err != nil {
			t.Fatal(err)
		}
	}
	if string(src) != string(dst) {
		t.Fatal("received data differs")
	}
	_ = r.Close()
	// Long enough for several liveness checks to see the close.
	for end := time.Now().Add(500 * time.Millisecond); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if done, _, err := s.Test(sq); err != nil || done {
			t.Fatalf("Test while the helper holds the delivered send: done %v, err %v", done, err)
		}
	}
	h := st.head.Load() // the helper resumes: counts the chunk, lets go
	st.ring[h%ringSize] = task{}
	st.off = 0
	st.head.Store(h + 1)
	tk.left.Add(-1)
	st.busy.Store(0)
	done, n, err := s.Test(sq)
	if err != nil || !done || n != size {
		t.Fatalf("after the helper let go: done %v, %d bytes, err %v; want done, %d bytes", done, n, err, size)
	}
	if s.live.checks == 0 || !s.live.closed {
		t.Fatalf("no liveness check saw the peer's close (%d checks): the test proves nothing", s.live.checks)
	}
}
