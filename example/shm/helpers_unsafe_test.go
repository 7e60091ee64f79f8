package shm

import (
	"os"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// shmDir gives the test its own connection directory (short enough for the
// handle) and points NCCL_GO_SHM_DIR at it.
func shmDir(t *testing.T) string {
	t.Helper()
	base := "/dev/shm"
	if st, err := os.Stat(base); err != nil || !st.IsDir() {
		base = os.TempDir()
	}
	dir, err := os.MkdirTemp(base, "shmt")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	t.Setenv(envDir, dir)
	return dir
}

func newTransport(t *testing.T) *Transport {
	t.Helper()
	tr := New().(*Transport)
	require.NoError(t, tr.Init(nccl.InitContext{Log: nccl.NewStderrLogger("test")}))
	t.Cleanup(func() { _ = tr.Finalize() })
	return tr
}

// drive polls step until it reports true. The bound only stops a broken
// transport from hanging the test run; it is no speed assertion.
func drive(t *testing.T, what string, step func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !step() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: no completion after 60s", what)
		}
	}
}

func connectPair(t *testing.T, tr *Transport) (*sendComm, *recvComm) {
	t.Helper()
	var h nccl.Handle
	l, err := tr.Listen(0, &h)
	require.NoError(t, err)
	sc, rc := connectAccept(t, tr, l, &h)
	require.NoError(t, l.Close())
	t.Cleanup(func() { _ = sc.Close(); _ = rc.Close() })
	return sc.(*sendComm), rc.(*recvComm)
}

// connectAccept drives Connect to h and Accept on l, alternately as NCCL
// does, until both are done.
func connectAccept(t *testing.T, tr *Transport, l nccl.Listener, h *nccl.Handle) (nccl.SendComm, nccl.RecvComm) {
	t.Helper()
	var sc nccl.SendComm
	var rc nccl.RecvComm
	var err error
	drive(t, "connect/accept", func() bool {
		if sc == nil {
			sc, err = tr.Connect(0, h, nccl.ConnectOptions{TrafficClass: nccl.TrafficClassUndef})
			require.NoError(t, err)
		}
		if rc == nil {
			rc, err = l.Accept()
			require.NoError(t, err)
		}
		return sc != nil && rc != nil
	})
	return sc, rc
}

func ptr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return unsafe.Pointer(&zeroByte)
	}
	return unsafe.Pointer(&b[0])
}

var zeroByte byte

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ seed
	}
	return b
}

// isendRetry posts a send, polling the receiver while the sender has to wait.
func isendRetry(t *testing.T, s *sendComm, r *recvComm, data []byte, tag int) nccl.Request {
	t.Helper()
	var id nccl.Request
	drive(t, "isend", func() bool {
		var err error
		id, err = s.Isend(ptr(data), len(data), tag, 1)
		require.NoError(t, err)
		if id == nccl.NoRequest {
			r.progress()
			return false
		}
		return true
	})
	return id
}

// waitBoth tests a send and a receive until both are done.
func waitBoth(t *testing.T, s *sendComm, sid nccl.Request, r *recvComm, rid nccl.Request, sizes []int) int {
	t.Helper()
	sDone, rDone, sent := false, false, 0
	drive(t, "send/recv", func() bool {
		var err error
		if !sDone {
			sDone, sent, err = s.Test(sid)
			require.NoError(t, err)
		}
		if !rDone {
			rDone, err = r.Test(rid, sizes)
			require.NoError(t, err)
		}
		return sDone && rDone
	})
	return sent
}
