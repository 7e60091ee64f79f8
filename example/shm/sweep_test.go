package shm

import (
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// listenInChild starts a child process that listens (role "listen") and
// returns it with its handle and the connection file's path.
func listenInChild(t *testing.T) (*exec.Cmd, nccl.Handle, string) {
	t.Helper()
	cmd, out := startChild(t, "listen")
	line, err := out.ReadString('\n')
	require.NoError(t, err)
	raw, err := hex.DecodeString(strings.TrimSpace(line))
	require.NoError(t, err)
	var h nccl.Handle
	copy(h[:], raw)
	_, _, path, err := decodeHandle(&h)
	require.NoError(t, err)
	require.FileExists(t, path)
	return cmd, h, path
}

// kill kills a child and reaps it: once Wait returns, the kernel has dropped
// the child's locks.
func kill(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
}

// sweepInChild runs Init (and so the sweep) in another process.
func sweepInChild(t *testing.T) {
	t.Helper()
	cmd, out := startChild(t, "sweep")
	line, err := out.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "swept\n", line)
	require.NoError(t, cmd.Wait())
}

func connFiles(t *testing.T, dir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, connFilePrefix+"*"))
	require.NoError(t, err)
	return names
}

// A rank killed while its listen was pending leaves its connection file; the
// next Init of any process using the directory removes it.
func TestKilledListenersFileIsRemovedByTheNextInit(t *testing.T) {
	dir := shmDir(t)
	cmd, _, path := listenInChild(t)
	kill(t, cmd)
	require.FileExists(t, path, "nothing removes the file while it is not swept")
	var log strings.Builder
	tr := New().(*Transport)
	require.NoError(t, tr.Init(nccl.InitContext{Log: &nccl.WriterLogger{W: &log}}))
	defer tr.Finalize()
	assert.NoFileExists(t, path, "the file of a listener that died before accepting outlives it")
	assert.Empty(t, connFiles(t, dir))
	assert.Contains(t, log.String(), "INFO NET/GoShm : removed 1 connection file")
}

// A connector that finds the listener dead before it accepted removes the
// file: nobody else will ever use it.
func TestConnectorRemovesTheFileOfAListenerThatDied(t *testing.T) {
	shmDir(t)
	tr := newTransport(t)
	cmd, h, path := listenInChild(t)
	sc, err := tr.Connect(0, &h, nccl.ConnectOptions{})
	require.NoError(t, err)
	require.Nil(t, sc, "the child never accepts")
	kill(t, cmd)
	drive(t, "connect to a dead listener", func() bool {
		sc, err = tr.Connect(0, &h, nccl.ConnectOptions{})
		require.Nil(t, sc)
		return err != nil
	})
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
	assert.Contains(t, err.Error(), "exited")
	assert.NoFileExists(t, path, "the connector that saw the listener die leaves its file behind")
}

// The sweep never removes a file whose listener is alive, in another process
// or in the sweeping one, nor drops the sweeping process's own locks (closing
// any descriptor of a file drops all of a process's POSIX locks on it); and a
// connector of this process that gives up does not drop its listener's lock.
func TestSweepSparesLiveListeners(t *testing.T) {
	dir := shmDir(t)
	tr := newTransport(t)
	var own nccl.Handle
	l, err := tr.Listen(0, &own)
	require.NoError(t, err)
	defer l.Close()
	_, _, ownPath, err := decodeHandle(&own)
	require.NoError(t, err)
	// A connector in this process that is rejected and releases its mapping.
	forged := own
	forged[hOffSecret] ^= 0xFF
	sc, err := tr.Connect(0, &forged, nccl.ConnectOptions{})
	require.NoError(t, err)
	require.Nil(t, sc)
	rc, err := l.Accept()
	require.NoError(t, err)
	require.Nil(t, rc)
	_, err = tr.Connect(0, &forged, nccl.ConnectOptions{})
	require.Error(t, err, "the forged connect is rejected and released")

	_, child, childPath := listenInChild(t)
	newTransport(t) // sweeps in this process: skips its own file, spares the child's
	sweepInChild(t) // sweeps in another: both listeners hold their locks
	assert.FileExists(t, ownPath, "a live listener's file was removed")
	assert.FileExists(t, childPath, "a live listener's file was removed")
	assert.Len(t, connFiles(t, dir), 2)

	// Both still connect.
	sc, err = tr.Connect(0, &child, nccl.ConnectOptions{})
	require.NoError(t, err)
	require.Nil(t, sc, "the child is alive and never accepts: the connect waits")
	sc, rc = connectAccept(t, tr, l, &own)
	require.NoError(t, sc.Close())
	require.NoError(t, rc.Close())
}

// A file whose listener died but whose connector still lives is the
// connector's until it lets go; once both ends are dead, it goes.
func TestSweepSparesAFileALiveConnectorHolds(t *testing.T) {
	dir := shmDir(t)
	listener, h, path := listenInChild(t)
	connector, out := startChild(t, "claim", "SHM_TEST_HANDLE="+hex.EncodeToString(h[:]))
	line, err := out.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "claimed\n", line)
	kill(t, listener)
	newTransport(t)
	sweepInChild(t)
	assert.FileExists(t, path, "the file of a live connector was removed")
	kill(t, connector)
	newTransport(t)
	assert.NoFileExists(t, path, "a file whose ends both died outlives them")
	assert.Empty(t, connFiles(t, dir))
}

// A Listen that finds the directory full sweeps it and tries again, so a
// long-running job is not locked out by files that crashed ranks left after
// its Init.
func TestListenSweepsAFullDirectory(t *testing.T) {
	dir, err := os.MkdirTemp("/tmp", "shmt") // short: paths must fit the handle
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// Room for one connection file of the default ring, not two.
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1600k"); err != nil {
		if errors.Is(err, unix.EPERM) {
			t.Skipf("cannot mount a small tmpfs (needs CAP_SYS_ADMIN): %v", err)
		}
		require.NoError(t, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	t.Setenv(envDir, dir)
	tr := newTransport(t) // swept now, before the orphan exists
	cmd, _, path := listenInChild(t)
	var h nccl.Handle
	_, err = tr.Listen(0, &h)
	require.Error(t, err, "the tmpfs holds one connection file")
	require.Contains(t, err.Error(), "no space")
	kill(t, cmd)
	l, err := tr.Listen(0, &h)
	require.NoError(t, err, "the dead listener's file still fills the directory")
	defer l.Close()
	assert.NoFileExists(t, path)
}
