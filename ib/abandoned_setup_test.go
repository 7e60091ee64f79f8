package ib

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// ncclCommAbort during set-up: NCCL called connect once (the handshake runs
// on a goroutine) and listen, then stops polling; it never closes either
// (recvProxyFree/sendProxyFree act only on connected connections). The
// transport lives on (another communicator, NCCL_NET_PLUGIN_REF_COUNT > 0,
// v8-v10). What the set-up built must not outlive twice NCCL_GO_TIMEOUT
// (the dial's bound, then the time NCCL had to collect it); before, the QPs
// and registrations stayed until Finalize.
func TestAbandonedSetUpReleasesItsVerbsObjects(t *testing.T) {
	f, a, _, _, h := abandonedConnect(t)
	// abort: no further connect/accept/closeListen call.
	time.Sleep(2500 * time.Millisecond) // > 2 x NCCL_GO_TIMEOUT
	qa, qb := f.Device("simA_0").QPCount(), f.Device("simB_0").QPCount()
	ma, mb := f.Device("simA_0").MRCount(), f.Device("simB_0").MRCount()
	a.pendMu.Lock()
	np := len(a.pending)
	a.pendMu.Unlock()
	assert.Zero(t, qa+qb, "QPs of an abandoned set-up are kept until Finalize")
	assert.Zero(t, ma+mb, "MRs of an abandoned set-up are kept until Finalize")
	assert.Zero(t, np, "the abandoned connect is still pending")
	sc, err := a.Connect(0, &h, nccl.ConnectOptions{TrafficClass: -1})
	assert.Nil(t, sc)
	assert.Error(t, err, "a late connect call with the handle gets an error")
}

// The listener's side is a live rank that completed accept and posts a
// receive; the connector's communicator was aborted before it collected its
// connect. The orphaned send comm keeps the kept TCP connection (and its
// QPs) open, so the receiver's dead-peer check never fired; it is closed
// twice NCCL_GO_TIMEOUT after the connect started, and the receive fails.
func TestReceiverOfAnAbandonedConnectFails(t *testing.T) {
	_, _, _, l, _ := abandonedConnect(t) // a's communicator is aborted now: never polled again
	var rc nccl.RecvComm
	var err error
	for end := time.Now().Add(5 * time.Second); rc == nil && time.Now().Before(end); time.Sleep(time.Millisecond) {
		rc, err = l.Accept()
		require.NoError(t, err)
	}
	require.NotNil(t, rc)
	require.NoError(t, l.Close())
	defer rc.Close()
	r := rc.(*recvComm)
	rb := abortBuf(t, r, 4096)
	defer r.DeregMr(rb.mh)
	q, err := r.Irecv([]nccl.RecvBuffer{{Data: rb.ptr(), Size: 4096, MH: rb.mh}})
	require.NoError(t, err)
	start := time.Now()
	for time.Since(start) < 6*time.Second {
		done, err := r.Test(q, make([]int, 1))
		if err != nil || done {
			assert.False(t, done, "nothing was sent")
			return
		}
		time.Sleep(100 * time.Microsecond)
	}
	t.Errorf("the receive from a peer whose communicator was aborted is still pending after %v (NCCL_GO_TIMEOUT=1s)", time.Since(start))
}

// abandonedConnect is two hosts on a software-NIC fabric with
// NCCL_GO_TIMEOUT=1: b listens, a calls connect once (the handshake then
// runs on a goroutine) and never again.
func abandonedConnect(t *testing.T) (f *softnic.Fabric, a, b *Transport, l nccl.Listener, h nccl.Handle) {
	setEnv(t, "NCCL_GO_TIMEOUT", "1")
	f = softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "simA_0"})
	f.AddDevice(softnic.DeviceConfig{Name: "simB_0"})
	root := t.TempDir()
	require.NoError(t, f.WriteSysfs(root))
	a, b = bareHost(t, f, root, "simA_0"), bareHost(t, f, root, "simB_0")
	t.Cleanup(func() { a.Finalize(); b.Finalize() })
	l, err := b.Listen(0, &h)
	require.NoError(t, err)
	sc, err := a.Connect(0, &h, nccl.ConnectOptions{TrafficClass: -1})
	require.NoError(t, err)
	require.Nil(t, sc)
	return f, a, b, l, h
}
