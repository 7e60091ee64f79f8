package ib

import (
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// TestClosedCommsAreNotRetained: once NCCL collected a connection and closed
// its comms and listen, nothing of the transport keeps them reachable. The
// timers that release a connection NCCL never collects (Connect's, 2 ×
// NCCL_GO_TIMEOUT; the listen's, NCCL_GO_TIMEOUT) used to keep running, and
// their closures the comms: about 60 KB of heap per connection held for up
// to 10 minutes after close, thousands of connections per process at scale
// (a job that destroys and re-creates communicators piles them up).
func TestClosedCommsAreNotRetained(t *testing.T) {
	setEnv(t)
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	const n = 4
	var ws []weak.Pointer[sendComm]
	var wr []weak.Pointer[recvComm]
	var wl []weak.Pointer[listener]
	for i := 0; i < n; i++ {
		func() {
			var hd nccl.Handle
			l, err := b.t.Listen(0, &hd)
			require.NoError(t, err)
			var sc nccl.SendComm
			var rc nccl.RecvComm
			within(t, "connect/accept", func() (bool, error) {
				var err error
				if sc == nil {
					if sc, err = a.t.Connect(0, &hd, nccl.ConnectOptions{TrafficClass: nccl.TrafficClassUndef}); err != nil {
						return false, err
					}
				}
				if rc == nil {
					if rc, err = l.Accept(); err != nil {
						return false, err
					}
				}
				return sc != nil && rc != nil, nil
			})
			require.NoError(t, l.Close())
			require.NoError(t, sc.Close())
			require.NoError(t, rc.Close())
			ws = append(ws, weak.Make(sc.(*sendComm)))
			wr = append(wr, weak.Make(rc.(*recvComm)))
			wl = append(wl, weak.Make(l.(*listener)))
		}()
	}
	runtime.GC()
	runtime.GC()
	for i := 0; i < n; i++ {
		require.Nil(t, ws[i].Value(), "send comm %d is still reachable after Close", i)
		require.Nil(t, wr[i].Value(), "recv comm %d is still reachable after Close", i)
		require.Nil(t, wl[i].Value(), "listen %d is still reachable after Close", i)
	}
}

// TestConnectOutOfDescriptorsSaysUlimit: a connect that cannot get a socket
// (a process at scale under a low ulimit -n) is SystemError and says what to
// raise; it used to send the user to NCCL_SOCKET_IFNAME and firewalls.
func TestConnectOutOfDescriptorsSaysUlimit(t *testing.T) {
	setEnv(t)
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	_, hd := listenOn(t, b, 0)
	var old unix.Rlimit
	require.NoError(t, unix.Getrlimit(unix.RLIMIT_NOFILE, &old))
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	top := 0
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil && n > top {
			top = n
		}
	}
	lim := old
	lim.Cur = uint64(top + 1)
	require.NoError(t, unix.Setrlimit(unix.RLIMIT_NOFILE, &lim))
	var fill []int
	defer func() {
		for _, fd := range fill {
			unix.Close(fd)
		}
		require.NoError(t, unix.Setrlimit(unix.RLIMIT_NOFILE, &old))
	}()
	for {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			require.ErrorIs(t, err, unix.EMFILE)
			break
		}
		fill = append(fill, fd)
	}
	var sc nccl.SendComm
	err = nil
	deadline := time.Now().Add(10 * time.Second)
	for sc == nil && err == nil {
		require.True(t, time.Now().Before(deadline), "connect neither failed nor completed")
		sc, err = a.t.Connect(0, hd, nccl.ConnectOptions{TrafficClass: nccl.TrafficClassUndef})
		time.Sleep(time.Millisecond)
	}
	require.Nil(t, sc)
	require.Equal(t, nccl.SystemError, nccl.ResultOf(err), "%v", err)
	require.Contains(t, err.Error(), "ulimit -n")
}
