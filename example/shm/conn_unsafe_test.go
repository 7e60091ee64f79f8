package shm

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// TestMain lets a test re-run this binary as the peer process.
func TestMain(m *testing.M) {
	switch os.Getenv("SHM_TEST_CHILD") {
	case "connect":
		os.Exit(childConnect())
	case "listen":
		os.Exit(childListen())
	}
	os.Exit(m.Run())
}

func childTransport() *Transport {
	tr := New().(*Transport)
	if err := tr.Init(nccl.InitContext{Log: nccl.NewStderrLogger("child")}); err != nil {
		fmt.Fprintln(os.Stderr, "child init:", err)
		os.Exit(2)
	}
	return tr
}

// childConnect connects to the handle in SHM_TEST_HANDLE, says so, and then
// waits for its parent to kill it.
func childConnect() int {
	tr := childTransport()
	var h nccl.Handle
	raw, _ := hex.DecodeString(os.Getenv("SHM_TEST_HANDLE"))
	copy(h[:], raw)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		sc, err := tr.Connect(0, &h, nccl.ConnectOptions{})
		if err != nil {
			fmt.Fprintln(os.Stderr, "child connect:", err)
			return 1
		}
		if sc != nil {
			fmt.Println("connected")
			_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
			return 0
		}
	}
	return 1
}

// childListen prints a listen handle and waits to be killed.
func childListen() int {
	tr := childTransport()
	var h nccl.Handle
	if _, err := tr.Listen(0, &h); err != nil {
		fmt.Fprintln(os.Stderr, "child listen:", err)
		return 1
	}
	fmt.Println(hex.EncodeToString(h[:]))
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	return 0
}

func startChild(t *testing.T, role string, env ...string) (*exec.Cmd, *bufio.Reader) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{"SHM_TEST_CHILD=" + role}, env...)...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, bufio.NewReader(out)
}

func TestDeadSenderProcessFailsReceiveWithSystemError(t *testing.T) {
	shmDir(t)
	tr := newTransport(t)
	var h nccl.Handle
	l, err := tr.Listen(0, &h)
	require.NoError(t, err)
	defer l.Close()
	cmd, out := startChild(t, "connect", "SHM_TEST_HANDLE="+hex.EncodeToString(h[:]))
	var rc nccl.RecvComm
	drive(t, "accept from the child", func() bool {
		rc, err = l.Accept()
		require.NoError(t, err)
		return rc != nil
	})
	defer rc.Close()
	line, err := out.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "connected\n", line)
	r := rc.(*recvComm)
	require.GreaterOrEqual(t, r.w.pidfd, 0, "same PID namespace: the peer is watched through a pidfd")
	rid, err := r.Irecv([]nccl.RecvBuffer{{Data: ptr(make([]byte, 64)), Size: 64, Tag: 0}})
	require.NoError(t, err)
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	var testErr error
	drive(t, "dead-peer detection", func() bool {
		var done bool
		done, testErr = r.Test(rid, []int{0})
		require.False(t, done)
		return testErr != nil
	})
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(testErr))
	assert.Contains(t, testErr.Error(), "exited")
	// The comm stays failed; it does not pretend to recover.
	_, err = r.Irecv([]nccl.RecvBuffer{{Data: ptr(make([]byte, 8)), Size: 8}})
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
}

func TestDeadListenerProcessFailsConnect(t *testing.T) {
	shmDir(t)
	tr := newTransport(t)
	cmd, out := startChild(t, "listen")
	line, err := out.ReadString('\n')
	require.NoError(t, err)
	raw, err := hex.DecodeString(strings.TrimSpace(line))
	require.NoError(t, err)
	var h nccl.Handle
	copy(h[:], raw)
	sc, err := tr.Connect(0, &h, nccl.ConnectOptions{})
	require.NoError(t, err)
	require.Nil(t, sc, "the child never accepts")
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	drive(t, "connect to a dead listener", func() bool {
		sc, err = tr.Connect(0, &h, nccl.ConnectOptions{})
		require.Nil(t, sc)
		return err != nil
	})
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
	tr.mu.Lock()
	assert.Empty(t, tr.pending, "a failed connect releases its mapping")
	tr.mu.Unlock()
}

func TestHeartbeatDetectsAPeerWithoutPidfd(t *testing.T) {
	shmDir(t)
	s, r := connectPair(t, newTransport(t))
	// Pretend the sender lives in another PID namespace: no pidfd, only its
	// heartbeat tells it is alive. Then stop its heartbeat.
	r.w.close()
	r.w.pid = 1 << 22
	r.w.timeout = int64(300 * time.Millisecond)
	r.w.beatAt = now()
	rid, err := r.Irecv([]nccl.RecvBuffer{{Data: ptr(make([]byte, 8)), Size: 8, Tag: 0}})
	require.NoError(t, err)
	// While it beats, it is alive.
	for i := 0; i < 3; i++ {
		time.Sleep(beatPeriod)
		done, err := r.Test(rid, []int{0})
		require.NoError(t, err)
		require.False(t, done)
		require.NoError(t, r.w.check(now()))
	}
	stopBeating(s.r)
	var testErr error
	drive(t, "heartbeat timeout", func() bool {
		_, testErr = r.Test(rid, []int{0})
		return testErr != nil
	})
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(testErr))
	assert.Contains(t, testErr.Error(), "NCCL_GO_SHM_PEER_TIMEOUT")
}

func TestWrongSecretIsRejectedAndTheRightPeerStillConnects(t *testing.T) {
	dir := shmDir(t)
	tr := newTransport(t)
	var h nccl.Handle
	l, err := tr.Listen(0, &h)
	require.NoError(t, err)
	defer l.Close()
	forged := h
	forged[hOffSecret] ^= 0xFF
	sc, err := tr.Connect(0, &forged, nccl.ConnectOptions{})
	require.NoError(t, err)
	require.Nil(t, sc)
	rc, err := l.Accept()
	require.NoError(t, err)
	require.Nil(t, rc, "a wrong proof is not accepted")
	sc, err = tr.Connect(0, &forged, nccl.ConnectOptions{})
	require.Error(t, err)
	assert.Equal(t, nccl.InvalidUsage, nccl.ResultOf(err))
	assert.Contains(t, err.Error(), "secret")
	// The file is still there and the genuine handle connects.
	entries, _ := os.ReadDir(dir)
	require.Len(t, entries, 1)
	drive(t, "connect with the right secret", func() bool {
		if sc == nil {
			sc, err = tr.Connect(0, &h, nccl.ConnectOptions{})
			require.NoError(t, err)
		}
		if rc == nil {
			rc, err = l.Accept()
			require.NoError(t, err)
		}
		return sc != nil && rc != nil
	})
	require.NoError(t, sc.Close())
	require.NoError(t, rc.Close())
}

func TestConnectRefusals(t *testing.T) {
	shmDir(t)
	tr := newTransport(t)
	var h nccl.Handle
	l, err := tr.Listen(0, &h)
	require.NoError(t, err)

	other := h
	other[hOffBoot] ^= 1
	_, err = tr.Connect(0, &other, nccl.ConnectOptions{})
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
	assert.Contains(t, err.Error(), "another host")

	var junk nccl.Handle
	_, err = tr.Connect(0, &junk, nccl.ConnectOptions{})
	assert.Equal(t, nccl.InvalidArgument, nccl.ResultOf(err))

	first := h
	sc, err := tr.Connect(0, &first, nccl.ConnectOptions{})
	require.NoError(t, err)
	require.Nil(t, sc)
	second := h
	_, err = tr.Connect(0, &second, nccl.ConnectOptions{})
	assert.Equal(t, nccl.InvalidUsage, nccl.ResultOf(err), "one connector per listen")

	require.NoError(t, l.Close())
	_, err = tr.Connect(0, &first, nccl.ConnectOptions{})
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
	assert.Contains(t, err.Error(), "closed before accepting")
	_, err = tr.Connect(0, &h, nccl.ConnectOptions{})
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(err), "the file is gone after the listener closed")

	stale := nccl.Handle{}
	binary.LittleEndian.PutUint64(stale[0:], pendingMagic)
	binary.LittleEndian.PutUint64(stale[8:], 999)
	_, err = tr.Connect(0, &stale, nccl.ConnectOptions{})
	assert.Equal(t, nccl.InternalError, nccl.ResultOf(err))
	_, err = tr.Connect(1, &h, nccl.ConnectOptions{})
	assert.Equal(t, nccl.InvalidArgument, nccl.ResultOf(err))
}

func TestListenerCloseWithoutAcceptRemovesTheFile(t *testing.T) {
	dir := shmDir(t)
	tr := newTransport(t)
	var h nccl.Handle
	l, err := tr.Listen(0, &h)
	require.NoError(t, err)
	entries, _ := os.ReadDir(dir)
	require.Len(t, entries, 1)
	require.NoError(t, l.Close())
	entries, _ = os.ReadDir(dir)
	assert.Empty(t, entries)
}

func TestInitPropertiesAndSettings(t *testing.T) {
	shmDir(t)
	tr := newTransport(t)
	assert.Equal(t, 1, tr.Devices())
	p, err := tr.Properties(0)
	require.NoError(t, err)
	assert.Equal(t, "shm0", p.Name)
	assert.Empty(t, p.PCIPath)
	assert.Equal(t, nccl.PtrHost, p.PtrSupport)
	assert.Equal(t, maxRecvs, p.MaxRecvs)
	assert.Equal(t, defaultSpeed, p.Speed)
	t.Setenv(envSpeed, "25000")
	p, _ = tr.Properties(0)
	assert.Equal(t, 25000, p.Speed, "settings are read at use time")
	_, err = tr.Properties(1)
	assert.Equal(t, nccl.InvalidArgument, nccl.ResultOf(err))

	t.Setenv(envDisable, "1")
	err = New().Init(nccl.InitContext{})
	assert.True(t, errors.Is(err, nccl.ErrNoDevice), "disabled: %v", err)
	t.Setenv(envDisable, "0")
	t.Setenv(envDir, "/nonexistent/dir")
	err = New().Init(nccl.InitContext{})
	assert.True(t, errors.Is(err, nccl.ErrNoDevice), "missing dir: %v", err)

	var log strings.Builder
	t.Setenv(envRing, "12345")
	assert.EqualValues(t, defaultRing, ringSizeSetting(&nccl.WriterLogger{W: &log, Prefix: "t"}))
	assert.Contains(t, log.String(), "NCCL_GO_SHM_RING_SIZE")

	shmDir(t)
	t.Setenv(envDir, "/dev/shm/"+strings.Repeat("d", 60))
	_, err = tr.Listen(0, new(nccl.Handle))
	assert.Equal(t, nccl.InvalidUsage, nccl.ResultOf(err))
	assert.Contains(t, err.Error(), "too long")
}

func TestRegMrAcceptsHostMemoryOnly(t *testing.T) {
	shmDir(t)
	s, r := connectPair(t, newTransport(t))
	buf := make([]byte, 64)
	mh, err := s.RegMr(ptr(buf), len(buf), nccl.PtrHost)
	require.NoError(t, err)
	assert.NotZero(t, mh)
	assert.NoError(t, s.DeregMr(mh))
	assert.NoError(t, r.DeregMr(0))
	_, err = r.RegMr(ptr(buf), len(buf), nccl.PtrCUDA)
	assert.Equal(t, nccl.InvalidArgument, nccl.ResultOf(err))
	id, err := r.Iflush([]nccl.RecvBuffer{{Data: ptr(buf), Size: 64}})
	assert.NoError(t, err)
	assert.Equal(t, nccl.NoRequest, id)
	assert.Contains(t, s.PeerAddr(), "pid")
}
