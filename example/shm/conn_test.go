package shm

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// TestMain lets a test re-run this binary as the peer process.
func TestMain(m *testing.M) {
	switch os.Getenv("SHM_TEST_CHILD") {
	case "connect":
		os.Exit(childConnect())
	case "listen":
		os.Exit(childListen())
	case "claim":
		os.Exit(childClaim())
	case "sweep":
		os.Exit(childSweep())
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

// childClaim starts a connect (claim and proof) and stops there: its parent
// never accepts.
func childClaim() int {
	tr := childTransport()
	var h nccl.Handle
	raw, _ := hex.DecodeString(os.Getenv("SHM_TEST_HANDLE"))
	copy(h[:], raw)
	sc, err := tr.Connect(0, &h, nccl.ConnectOptions{})
	if err != nil || sc != nil {
		fmt.Fprintln(os.Stderr, "child claim:", sc, err)
		return 1
	}
	fmt.Println("claimed")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	return 0
}

// childSweep initialises a transport (which sweeps NCCL_GO_SHM_DIR), says so
// and exits.
func childSweep() int {
	tr := childTransport()
	_ = tr.Finalize()
	fmt.Println("swept")
	return 0
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
	cmd, out, err := spawnChild(t, nil, role, env...)
	require.NoError(t, err)
	return cmd, out
}

// spawnChild starts this test binary as a peer process (TestMain's roles); it
// is killed when t ends.
func spawnChild(t *testing.T, attr *syscall.SysProcAttr, role string, env ...string) (*exec.Cmd, *bufio.Reader, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{"SHM_TEST_CHILD=" + role}, env...)...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = attr
	stdin, err := cmd.StdinPipe() // the child waits on it until the test ends
	if err != nil {
		return nil, nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, bufio.NewReader(out), nil
}

// acceptFromChild listens, starts a child connecting to it (role "connect"),
// and accepts it.
func acceptFromChild(t *testing.T, tr *Transport, attr *syscall.SysProcAttr) (*exec.Cmd, *recvComm) {
	t.Helper()
	var h nccl.Handle
	l, err := tr.Listen(0, &h)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	cmd, out, err := spawnChild(t, attr, "connect", "SHM_TEST_HANDLE="+hex.EncodeToString(h[:]))
	if err != nil {
		if attr != nil && errors.Is(err, syscall.EPERM) {
			t.Skipf("cannot start a child in its own PID namespace (needs CAP_SYS_ADMIN): %v", err)
		}
		require.NoError(t, err)
	}
	var rc nccl.RecvComm
	drive(t, "accept from the child", func() bool {
		rc, err = l.Accept()
		require.NoError(t, err)
		return rc != nil
	})
	t.Cleanup(func() { _ = rc.Close() })
	line, err := out.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "connected\n", line)
	return cmd, rc.(*recvComm)
}

// waitStopped returns once the kernel reports pid stopped (state T).
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	drive(t, "SIGSTOP to take effect", func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		require.NoError(t, err)
		// "pid (comm) state ...": the state follows the last ')'.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		return len(f) > 0 && f[0] == "T"
	})
}

func TestDeadSenderProcessFailsReceiveWithSystemError(t *testing.T) {
	shmDir(t)
	cmd, r := acceptFromChild(t, newTransport(t), nil)
	require.False(t, r.w.self, "the peer is another process, watched through its lock")
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

// A frozen peer (SIGSTOP: a debugger, a checkpoint, a stuck rank) is alive:
// its kernel still answers for it. Deciding that a rank hangs is NCCL's (or
// the framework's) watchdog's job, so the receive keeps waiting however long
// it takes; killing the peer still fails it at once. The peer runs in its own
// PID namespace, where no pidfd can watch it: before the lock-based liveness,
// shm fell back to a heartbeat there and declared a frozen peer dead after
// NCCL_GO_SHM_PEER_TIMEOUT.
func TestFrozenPeerInAnotherPIDNamespaceIsAlive(t *testing.T) {
	shmDir(t)
	t.Setenv("NCCL_GO_SHM_PEER_TIMEOUT", "0.2") // what the heartbeat used to allow
	t.Setenv("NCCL_GO_TIMEOUT", "0.2")          // not a liveness limit: only bounds handshakes
	cmd, r := acceptFromChild(t, newTransport(t), &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID})
	require.False(t, r.w.self)
	rid, err := r.Irecv([]nccl.RecvBuffer{{Data: ptr(make([]byte, 64)), Size: 64, Tag: 0}})
	require.NoError(t, err)
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	waitStopped(t, cmd.Process.Pid)
	// Ten times the old heartbeat limit, polling as NCCL's progress thread does.
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		done, err := r.Test(rid, []int{0})
		require.NoError(t, err, "a frozen peer is not a dead one")
		require.False(t, done)
		runtime.Gosched()
	}
	require.NoError(t, r.w.check())
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	var testErr error
	drive(t, "dead-peer detection", func() bool {
		_, testErr = r.Test(rid, []int{0})
		return testErr != nil
	})
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(testErr))
	assert.Contains(t, testErr.Error(), "exited")
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
	assert.Zero(t, tr.pending.Len(), "a failed connect releases its mapping")
}

// A connector that dies between its claim and the listener's accept fails
// the accept (ncclSystemError naming the process) instead of handing NCCL a
// comm whose peer is already gone.
func TestConnectorDyingDuringTheHandshakeFailsAccept(t *testing.T) {
	shmDir(t)
	tr := newTransport(t)
	var h nccl.Handle
	l, err := tr.Listen(0, &h)
	require.NoError(t, err)
	defer l.Close()
	cmd, out := startChild(t, "claim", "SHM_TEST_HANDLE="+hex.EncodeToString(h[:]))
	line, err := out.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "claimed\n", line)
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	rc, err := l.Accept()
	assert.Nil(t, rc)
	require.Error(t, err)
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
	assert.Contains(t, err.Error(), fmt.Sprintf("process %d died during the handshake", cmd.Process.Pid))
}

// pollForError calls f, as NCCL polls connect or accept, until it fails; it
// must return nothing meanwhile. 10 s bounds a broken transport, no speed
// assertion.
func pollForError[T any](t *testing.T, what string, f func() (T, error)) error {
	t.Helper()
	for start := time.Now(); time.Since(start) < 10*time.Second; {
		v, err := f()
		if err != nil {
			return err
		}
		require.Zero(t, v, "%s returned a comm nobody should have given", what)
	}
	t.Fatalf("%s still pending after 10s", what)
	return nil
}

// listenWithTimeout sets NCCL_GO_TIMEOUT to 300 ms and listens.
func listenWithTimeout(t *testing.T) (*Transport, nccl.Listener, nccl.Handle) {
	t.Helper()
	shmDir(t)
	t.Setenv("NCCL_GO_TIMEOUT", "0.3")
	tr := newTransport(t)
	var h nccl.Handle
	l, err := tr.Listen(0, &h)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return tr, l, h
}

// A listener whose rank never accepts fails the connect after NCCL_GO_TIMEOUT
// instead of leaving NCCL polling forever.
func TestConnectIsBoundedByNCCLGoTimeout(t *testing.T) {
	tr, _, h := listenWithTimeout(t)
	err := pollForError(t, "connect", func() (any, error) { return tr.Connect(0, &h, nccl.ConnectOptions{}) })
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
	assert.Contains(t, err.Error(), "did not accept within 300ms (NCCL_GO_TIMEOUT)")
	assert.Zero(t, tr.pending.Len(), "a failed connect releases its attempt")
}

// A claim that never turns into a proof (the connector is alive but stuck
// mid-handshake) fails the accept after NCCL_GO_TIMEOUT.
func TestAcceptOfAStuckHandshakeIsBounded(t *testing.T) {
	_, l, h := listenWithTimeout(t)
	_, _, path, err := decodeHandle(&h)
	require.NoError(t, err)
	// Claim the file as a connector would, and stop there.
	r, err := openRegion(path)
	require.NoError(t, err)
	defer r.release()
	require.NoError(t, r.lock(sideSend))
	writeSide(r.h, sideSend)
	require.True(t, r.h.u32(offState).CompareAndSwap(stListening, stClaimed))
	err = pollForError(t, "accept", func() (any, error) { return l.Accept() })
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
	assert.Contains(t, err.Error(), "did not finish the handshake within 300ms (NCCL_GO_TIMEOUT)")
}

func TestNonPositiveTimeoutTurnsDeadPeerChecksOffWithAWarn(t *testing.T) {
	shmDir(t)
	t.Setenv("NCCL_GO_TIMEOUT", "0")
	var log strings.Builder
	tr := New().(*Transport)
	require.NoError(t, tr.Init(nccl.InitContext{Log: &nccl.WriterLogger{W: &log}}))
	defer tr.Finalize()
	assert.Contains(t, log.String(), "WARN NET/GoShm : NCCL_GO_TIMEOUT=0s: dead-peer detection is off")
	s, r := connectPair(t, tr)
	assert.True(t, s.w.off)
	assert.True(t, r.w.off)
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
	_, err = tr.Connect(0, &forged, nccl.ConnectOptions{})
	require.Error(t, err)
	assert.Equal(t, nccl.InvalidUsage, nccl.ResultOf(err))
	assert.Contains(t, err.Error(), "secret")
	// The file is still there and the genuine handle connects.
	entries, _ := os.ReadDir(dir)
	require.Len(t, entries, 1)
	sc, rc = connectAccept(t, tr, l, &h)
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
	// ncclnet-go env's check says the same before the job.
	v, ok := ncclenv.Check(envRing, "12345")
	assert.True(t, ok && v.Invalid, "%+v", v)
	assert.Equal(t, strconv.Itoa(defaultRing), v.Used)
	v, _ = ncclenv.Check(envRing, strconv.Itoa(2*minRing))
	assert.True(t, v.OK(), "%+v", v)

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
