package ib

import (
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclsock"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Out of requests is NoRequest (CONVENTIONS §7): after the FIFO wrapped, a
// clear-to-send can arrive for a slot whose previous sends were posted but
// not yet tested. That is exhaustion, not a tag mismatch: Isend must return
// NULL until Test frees the slot.
func TestIsendOutOfRequestsIsNoRequest(t *testing.T) {
	setEnv(t)
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	sc, rc := connectPair(t, a, 0, b, 0)
	const n, size = maxRequests, 64
	rb, sb := newBuf(t, rc, n*size, 0), newBuf(t, sc, n*size, 1)
	sreqs := make([]nccl.Request, n)
	for i := 0; i < n; i++ {
		rr, err := rc.Irecv([]nccl.RecvBuffer{{Data: unsafe.Add(rb.ptr(), i*size), Size: size, MH: rb.mh}})
		require.NoError(t, err)
		sreqs[i], err = sc.Isend(unsafe.Add(sb.ptr(), i*size), size, 0, sb.mh)
		require.NoError(t, err)
		require.NotEqual(t, nccl.NoRequest, sreqs[i])
		within(t, "receive", func() (bool, error) { return rc.Test(rr, make([]int, 1)) })
	}
	// Every send request is still in use (never tested); the receiver posts
	// again into slot 0.
	rr, err := rc.Irecv([]nccl.RecvBuffer{{Data: rb.ptr(), Size: size, MH: rb.mh}})
	require.NoError(t, err)
	for i := 0; i < 3; i++ {
		r, err := sc.Isend(sb.ptr(), size, 0, sb.mh)
		require.NoError(t, err, "no free request is exhaustion, not an error")
		assert.Equal(t, nccl.NoRequest, r)
	}
	for _, r := range sreqs {
		within(t, "send", func() (bool, error) { d, _, err := sc.Test(r); return d, err })
	}
	var sr nccl.Request
	within(t, "isend once requests are free", func() (bool, error) {
		var err error
		sr, err = sc.Isend(sb.ptr(), size, 0, sb.mh)
		return sr != nccl.NoRequest, err
	})
	within(t, "send", func() (bool, error) { d, _, err := sc.Test(sr); return d, err })
	within(t, "receive", func() (bool, error) { return rc.Test(rr, make([]int, 1)) })
}

// connectError polls Connect until it fails, bounded by limit.
func connectError(t *testing.T, tr *Transport, h *nccl.Handle, limit time.Duration) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	for {
		sc, err := tr.Connect(0, h, nccl.ConnectOptions{TrafficClass: -1})
		require.Nil(t, sc)
		if err != nil {
			return time.Since(start), err
		}
		if time.Since(start) > limit {
			t.Fatalf("connect still pending after %v", limit)
		}
		time.Sleep(time.Millisecond)
	}
}

// Every wait that depends on the peer is bounded by NCCL_GO_TIMEOUT
// (CONVENTIONS §5): connecting to an address where nobody listens, and to
// one that drops the SYNs (a black hole), fail within it.
func TestConnectIsBoundedByTimeout(t *testing.T) {
	setEnv(t, "NCCL_GO_TIMEOUT", "1")
	_, a, _ := twoHosts(t, softnic.DeviceConfig{})
	const slack = 2 * time.Second

	t.Run("no listener", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		var h nccl.Handle
		writeHandle(&h, handleInfo{magic: ncclsock.DefaultMagic, secret: 1, addr: ln.Addr().(*net.TCPAddr).AddrPort()})
		require.NoError(t, ln.Close())
		took, err := connectError(t, a.t, &h, time.Second+slack)
		assert.Equal(t, nccl.SystemError, nccl.ResultOf(err), "%v", err)
		t.Logf("connect to a closed port failed after %v: %v", took, err)
	})
	t.Run("black hole", func(t *testing.T) {
		// A listening socket with a full accept queue (backlog 0, one
		// connection waiting) drops further SYNs: the dial hangs like one to
		// an unreachable host.
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
		require.NoError(t, err)
		defer unix.Close(fd)
		require.NoError(t, unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
		require.NoError(t, unix.Listen(fd, 0))
		sa, err := unix.Getsockname(fd)
		require.NoError(t, err)
		port := sa.(*unix.SockaddrInet4).Port
		filler, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", itoa(port)))
		require.NoError(t, err)
		defer filler.Close()
		var h nccl.Handle
		addr := netipAddrPort(t, "127.0.0.1", port)
		writeHandle(&h, handleInfo{magic: ncclsock.DefaultMagic, secret: 1, addr: addr})
		took, err := connectError(t, a.t, &h, time.Second+slack)
		assert.Equal(t, nccl.SystemError, nccl.ResultOf(err), "%v", err)
		t.Logf("connect into a black hole failed after %v: %v", took, err)
	})
}

func itoa(i int) string { return strconv.Itoa(i) }

func netipAddrPort(t *testing.T, ip string, port int) netip.AddrPort {
	a, err := netip.ParseAddr(ip)
	require.NoError(t, err)
	return netip.AddrPortFrom(a, uint16(port))
}
