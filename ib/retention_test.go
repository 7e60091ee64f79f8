package ib

import (
	"runtime"
	"testing"
	"weak"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// NCCL 2.28+ makes and closes comms, and (at its default
// NCCL_NET_PLUGIN_REF_COUNT) finalizes and restarts the transport, for every
// communicator a job creates. A closed comm, its listen and a finalized
// transport must become garbage when NCCL is done with them: the expiry
// timers of Connect and of a listen's accepted connection used to keep them
// reachable for one and two NCCL_GO_TIMEOUTs (5 and 10 minutes by default),
// about 70 KB per connection, so a process that cycled communicators held
// every comm of the last ten minutes (the lifecycle soak: +21 MB of heap in
// 300 cycles, none of it freed).
func TestClosedCommsAndFinalizedTransportAreNotKeptBySetupTimers(t *testing.T) {
	setEnv(t, "NCCL_GO_TIMEOUT", "300")
	f, a, b := twoHosts(t, softnic.DeviceConfig{})
	sc, rc, l := connectUncollected(t, a, b)
	ws, wr, wl := weak.Make(sc), weak.Make(rc), weak.Make(l)
	require.NoError(t, l.Close())
	require.NoError(t, sc.Close())
	require.NoError(t, rc.Close())
	sc, rc, l = nil, nil, nil

	// A transport finalized after its comms closed (a restart's old one).
	// Not newHost: its cleanup would keep this one reachable.
	c := &host{t: NewWithOptions(Options{Provider: f.Provider(verbs.Features{}, "simA_0"), SysfsRoot: a.root}), log: &captureLog{}}
	require.NoError(t, c.t.Init(nccl.InitContext{Log: c.log}))
	sc2, rc2, l2 := connectUncollected(t, c, b)
	require.NoError(t, l2.Close())
	require.NoError(t, sc2.Close())
	require.NoError(t, rc2.Close())
	require.NoError(t, c.t.Finalize())
	wt := weak.Make(c.t)
	sc2, rc2, l2, c = nil, nil, nil, nil

	for i := 0; i < 3; i++ {
		runtime.GC()
	}
	assert.Nil(t, ws.Value(), "a closed send comm is still reachable")
	assert.Nil(t, wr.Value(), "a closed recv comm is still reachable")
	assert.Nil(t, wl.Value(), "a closed listen is still reachable")
	assert.Nil(t, wt.Value(), "a finalized transport is still reachable")
}

// connectUncollected connects a (sender) to b (receiver) on device 0 as NCCL
// does, registering no cleanup that would keep the comms reachable.
func connectUncollected(t *testing.T, a, b *host) (*sendComm, *recvComm, *listener) {
	t.Helper()
	var hd nccl.Handle
	ln, err := b.t.Listen(0, &hd)
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
			if rc, err = ln.Accept(); err != nil {
				return false, err
			}
		}
		return sc != nil && rc != nil, nil
	})
	return sc.(*sendComm), rc.(*recvComm), ln.(*listener)
}
