package ib

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

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
