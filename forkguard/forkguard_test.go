package forkguard

import (
	"fmt"
	"net"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func socketPair(t *testing.T) (int, int) {
	t.Helper()
	p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
	return p[0], p[1]
}

func fdOf(t *testing.T, c syscall.Conn) int {
	t.Helper()
	raw, err := c.SyscallConn()
	require.NoError(t, err)
	fd := -1
	require.NoError(t, raw.Control(func(u uintptr) { fd = int(u) }))
	return fd
}

// The child loses exactly the tracked sockets; the parent keeps all of them.
func TestForkedChildClosesTrackedSockets(t *testing.T) {
	a, b := socketPair(t)
	var pipe [2]int
	require.NoError(t, unix.Pipe2(pipe[:], unix.O_CLOEXEC))
	defer unix.Close(pipe[0])
	defer unix.Close(pipe[1])
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	tl := Listener(ln)
	dialed, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer dialed.Close()
	accepted, err := tl.Accept()
	require.NoError(t, err)
	defer accepted.Close()

	require.NoError(t, Track(a))
	require.NoError(t, Track(pipe[0]), "a descriptor that is not a socket is ignored, not an error")
	require.False(t, tracked(pipe[0]))
	require.NoError(t, TrackConn(dialed.(syscall.Conn)))

	lnfd, accfd, dialfd := fdOf(t, ln.(syscall.Conn)), fdOf(t, accepted.(syscall.Conn)), fdOf(t, dialed.(syscall.Conn))
	fds := []int{a, b, pipe[0], lnfd, accfd, dialfd}
	open, err := OpenInChild(fds)
	require.NoError(t, err)
	require.Equal(t, []bool{false, true, true, false, false, false}, open,
		"in the child: tracked socket, untracked socket, pipe, tracked listener, accepted and dialed connections")

	for _, fd := range fds {
		var st unix.Stat_t
		require.NoError(t, unix.Fstat(fd, &st), "the parent still has descriptor %d", fd)
	}
	// The parent's connection still works after the child closed its copy.
	_, err = dialed.Write([]byte("x"))
	require.NoError(t, err)
	buf := make([]byte, 1)
	_, err = accepted.Read(buf)
	require.NoError(t, err)
	require.Equal(t, byte('x'), buf[0])
}

// A tracked number that the parent closed without Untrack and reused for
// another file is left alone in the child: the inode no longer matches.
func TestForkedChildLeavesReusedNumbers(t *testing.T) {
	a, b := socketPair(t)
	require.NoError(t, Track(a))
	require.NoError(t, unix.Dup2(b, a), "a now names b's socket, as a reused number would")
	open, err := OpenInChild([]int{a})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, open)
}

func TestUntrackedSocketStaysOpenInChild(t *testing.T) {
	a, _ := socketPair(t)
	require.NoError(t, Track(a))
	Untrack(a)
	open, err := OpenInChild([]int{a})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, open)
}

func TestCloseUntracksFirst(t *testing.T) {
	p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(p[1])
	require.NoError(t, Track(p[0]))
	require.NoError(t, Close(p[0]))
	require.False(t, tracked(p[0]))
}

// What a fork pays for the handler: one fstat and one close per tracked
// socket, in the child.
func BenchmarkForkWithTrackedSockets(b *testing.B) {
	for _, n := range []int{0, 1000} {
		b.Run(fmt.Sprintf("sockets=%d", n), func(b *testing.B) {
			fds := make([]int, 0, n)
			for i := 0; i < n/2; i++ {
				p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
				require.NoError(b, err)
				require.NoError(b, Track(p[0]))
				require.NoError(b, Track(p[1]))
				fds = append(fds, p[0], p[1])
			}
			defer func() {
				for _, fd := range fds {
					_ = Close(fd)
				}
			}()
			probe := []int{0}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := OpenInChild(probe); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
