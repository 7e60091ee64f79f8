package socket

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestSameHostAddrs(t *testing.T) {
	for _, c := range []struct {
		local, peer string
		want        bool
	}{
		{"127.0.0.1", "127.0.0.1", true},
		{"127.0.0.1", "127.0.0.2", true},
		{"10.1.2.3", "10.1.2.3", true},
		{"::ffff:10.1.2.3", "10.1.2.3", true},
		{"::1", "::1", true},
		{"fe80::1%eth0", "fe80::1%eth0", true},
		{"10.1.2.3", "10.1.2.4", false},
		{"fd00::1", "fd00::2", false},
		{"fe80::1%eth0", "fe80::2%eth0", false},
	} {
		got := sameHostAddrs(netip.MustParseAddr(c.local), netip.MustParseAddr(c.peer))
		assert.Equal(t, c.want, got, "local %s peer %s", c.local, c.peer)
	}
	assert.False(t, sameHostAddrs(netip.Addr{}, netip.Addr{}), "no peer address")
}

func sndBufOf(t *testing.T, fd int) int {
	t.Helper()
	n, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF)
	require.NoError(t, err)
	return n
}

// sendFds are a send comm's sockets that carry data.
func sendFds(s *sendComm) []int {
	fds := []int{s.ctrl}
	for _, st := range s.streams {
		fds = append(fds, st.fd)
	}
	return fds
}

// A connection over loopback without data streams gets the bounded send
// queue on its one data-carrying socket (the kernel reports twice what was
// set), and nothing else changes: the receiving end and the liveness stream
// keep autotuning.
func TestLocalConnectionBoundsTheSendQueue(t *testing.T) {
	withEnv(t, map[string]string{"NCCL_SOCKET_NTHREADS": "0"})
	s, r := pair(t, initLoopback(t, &captureLog{}))
	require.Empty(t, s.streams)
	want := 2 * defaultLocalSndBuf
	if os.Geteuid() != 0 && wmemMax() < defaultLocalSndBuf {
		t.Skipf("neither CAP_NET_ADMIN nor net.core.wmem_max >= %d: the bound is not applied here (TestLocalSndBufAboveWmemMax covers that case)", defaultLocalSndBuf)
	}
	assert.Equal(t, want, sndBufOf(t, s.ctrl), "send socket")
	assert.NotEqual(t, want, sndBufOf(t, s.live.fd), "liveness stream")
	assert.NotEqual(t, want, sndBufOf(t, r.ctrl), "receiving end")
}

// With data streams the auto default leaves every socket autotuning (real
// NCCL on the 16-core host lost a third of its broadcast bandwidth to the
// bound); a value set by hand still bounds every data-carrying socket.
func TestLocalSndBufWithDataStreams(t *testing.T) {
	t.Run("auto", func(t *testing.T) {
		withEnv(t, map[string]string{"NCCL_SOCKET_NTHREADS": "2"})
		s, _ := pair(t, initLoopback(t, &captureLog{}))
		require.Len(t, s.streams, 2)
		for _, fd := range sendFds(s) {
			assert.NotEqual(t, 2*defaultLocalSndBuf, sndBufOf(t, fd), "send socket %d", fd)
		}
	})
	t.Run("set", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs CAP_NET_ADMIN to set a send buffer independent of net.core.wmem_max")
		}
		withEnv(t, map[string]string{"NCCL_SOCKET_NTHREADS": "2", envLocalSndBuf: "262144"})
		s, _ := pair(t, initLoopback(t, &captureLog{}))
		require.Len(t, s.streams, 2)
		for _, fd := range sendFds(s) {
			assert.Equal(t, 2*262144, sndBufOf(t, fd), "send socket %d", fd)
		}
	})
}

func TestLocalSndBufFor(t *testing.T) {
	for _, c := range []struct {
		v       int64
		streams int
		want    int
	}{
		{auto, 0, defaultLocalSndBuf},
		{auto, 4, 0},
		{0, 0, 0},
		{-1, 0, 0},
		{262144, 0, 262144},
		{262144, 4, 262144},
	} {
		assert.Equal(t, c.want, localSndBufFor(c.v, c.streams), "value %d, %d streams", c.v, c.streams)
	}
}

func TestLocalSndBufSettings(t *testing.T) {
	t.Run("off", func(t *testing.T) {
		withEnv(t, map[string]string{envLocalSndBuf: "0"})
		s, _ := pair(t, initLoopback(t, &captureLog{}))
		assert.NotEqual(t, 2*defaultLocalSndBuf, sndBufOf(t, s.ctrl))
	})
	t.Run("NCCL_SOCKET_SNDBUF wins", func(t *testing.T) {
		withEnv(t, map[string]string{envSndBuf: "65536"})
		s, _ := pair(t, initLoopback(t, &captureLog{}))
		assert.Equal(t, 2*65536, sndBufOf(t, s.ctrl))
	})
	t.Run("own value", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs CAP_NET_ADMIN to set a send buffer independent of net.core.wmem_max")
		}
		withEnv(t, map[string]string{envLocalSndBuf: "262144"})
		s, _ := pair(t, initLoopback(t, &captureLog{}))
		assert.Equal(t, 2*262144, sndBufOf(t, s.ctrl))
	})
}

// Without CAP_NET_ADMIN a value above net.core.wmem_max would be cut down
// and locked there, smaller than asked; the connection keeps autotuning
// instead, and says once how to get the bound.
func TestLocalSndBufAboveWmemMax(t *testing.T) {
	withEnv(t, map[string]string{"NCCL_SOCKET_NTHREADS": "0"}) // the layout auto bounds on any CPU count
	root := t.TempDir()
	dir := filepath.Join(root, "net", "core")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	old, oldSet := procSys, setSockInt
	t.Cleanup(func() { procSys, setSockInt = old, oldSet; localSndBufSkipped = sync.Once{} })
	procSys = root
	setSockInt = func(fd, level, opt, v int) error {
		if opt == unix.SO_SNDBUFFORCE {
			return unix.EPERM
		}
		return unix.SetsockoptInt(fd, level, opt, v)
	}
	localSndBufSkipped = sync.Once{}

	require.NoError(t, os.WriteFile(filepath.Join(dir, "wmem_max"), []byte("212992\n"), 0o644))
	log := &captureLog{}
	s, _ := pair(t, initLoopback(t, log))
	assert.NotEqual(t, 2*212992, sndBufOf(t, s.ctrl), "cut-down value set")
	assert.NotEqual(t, 2*defaultLocalSndBuf, sndBufOf(t, s.ctrl))
	assert.Contains(t, log.String(), "raise net.core.wmem_max")
	assert.Equal(t, 1, strings.Count(log.String(), "raise net.core.wmem_max"))
	s2, _ := pair(t, initLoopback(t, log))
	assert.NotEqual(t, 2*defaultLocalSndBuf, sndBufOf(t, s2.ctrl))
	assert.Equal(t, 1, strings.Count(log.String(), "raise net.core.wmem_max"), "said once per process")

	// With room under wmem_max, plain SO_SNDBUF sets it.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "wmem_max"), []byte("4194304\n"), 0o644))
	s3, _ := pair(t, initLoopback(t, &captureLog{}))
	assert.Equal(t, 2*defaultLocalSndBuf, sndBufOf(t, s3.ctrl))
}
