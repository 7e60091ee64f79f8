package ib

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/internal/fdtest"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// TestConnectOutOfDescriptorsSaysUlimit: a connect that cannot get a socket
// (a process at scale under a low ulimit -n) is SystemError and says what to
// raise; it used to send the user to NCCL_SOCKET_IFNAME and firewalls.
func TestConnectOutOfDescriptorsSaysUlimit(t *testing.T) {
	setEnv(t)
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	_, hd := listenOn(t, b, 0)
	fdtest.Starve(t)
	var sc nccl.SendComm
	var err error
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
