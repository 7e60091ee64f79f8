package socket

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// The peer is another process here, so that it can be frozen (SIGSTOP) and
// killed (SIGKILL) as a rank is: this test binary re-runs itself as the
// receiving rank.

const peerRoleEnv = "SOCKET_TEST_PEER_ROLE"

// TestMain turns this test binary into the receiving rank when
// TestFrozenPeerIsAliveKilledPeerFails runs it as a child process.
func TestMain(m *testing.M) {
	if os.Getenv(peerRoleEnv) == "recv" {
		os.Exit(receivingRank())
	}
	os.Exit(m.Run())
}

// receivingRank listens, prints its handle, accepts, and receives 4 MiB
// messages until the sender goes away.
func receivingRank() int {
	tr := newLoopback()
	if err := tr.Init(nccl.InitContext{Log: nccl.DiscardLogger{}}); err != nil {
		fmt.Fprintln(os.Stderr, "peer: init:", err)
		return 2
	}
	var h nccl.Handle
	l, err := tr.Listen(0, &h)
	if err != nil {
		fmt.Fprintln(os.Stderr, "peer: listen:", err)
		return 2
	}
	fmt.Printf("HANDLE %s\n", hex.EncodeToString(h[:]))
	var rc nccl.RecvComm
	for rc == nil && err == nil {
		rc, err = l.Accept()
		pace()
	}
	l.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "peer: accept:", err)
		return 2
	}
	const size = 4 << 20
	buf := make([]byte, 2*size)
	for i := 0; ; i++ {
		rq, err := rc.Irecv([]nccl.RecvBuffer{{Data: bufPtr(buf[(i%2)*size:]), Size: size, Tag: 1}})
		for done := false; !done && err == nil; {
			done, err = rc.Test(rq, nil)
			runtime.Gosched()
		}
		if err != nil {
			return 0 // the sender went away: the test is over
		}
	}
}

func TestFrozenPeerIsAliveKilledPeerFails(t *testing.T) {
	const timeout = time.Second
	withEnv(t, map[string]string{envTimeout: "1"})
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), peerRoleEnv+"=recv", envTimeout+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, "the peer process printed no handle")
	hx, ok := strings.CutPrefix(strings.TrimSpace(line), "HANDLE ")
	require.True(t, ok, "unexpected line from the peer process: %q", line)
	raw, err := hex.DecodeString(hx)
	require.NoError(t, err)
	var h nccl.Handle
	copy(h[:], raw)

	log := &captureLog{}
	tr := initLoopback(t, log)
	var s nccl.SendComm
	for s == nil {
		s, err = tr.Connect(0, &h, nccl.ConnectOptions{})
		require.NoError(t, err)
		pace()
	}
	defer s.Close()
	const size = 4 << 20
	src := make([]byte, size)
	// send keeps two messages in flight until stop says so; it returns the
	// error that ended it (nil when stopped) and the messages completed.
	send := func(stop func(completed int) bool) (int, error) {
		var q [2]nccl.Request
		posted, completed := 0, 0
		for {
			for posted-completed < 2 {
				r, err := s.Isend(bufPtr(src), size, 1, 0)
				if err != nil {
					return completed, err
				}
				if r == nccl.NoRequest {
					break
				}
				q[posted%2] = r
				posted++
			}
			done, _, err := s.Test(q[completed%2])
			if err != nil {
				return completed, err
			}
			if done {
				completed++
			}
			if stop(completed) {
				return completed, nil
			}
			runtime.Gosched()
		}
	}
	n, err := send(func(c int) bool { return c >= 8 })
	require.NoError(t, err)
	require.Equal(t, 8, n)

	// Frozen: the process does not run, its kernel answers. Alive.
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	live := &s.(*sendComm).live
	thawAfter := live.pings + silentPings
	giveUp := time.Now().Add(30 * time.Second)
	_, err = send(func(int) bool { return live.pings >= thawAfter || time.Now().After(giveUp) })
	require.NoError(t, err, "a stopped process is alive: its host answers")
	require.GreaterOrEqual(t, live.pings, thawAfter, "the liveness check stopped pinging the stopped peer's kernel")
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	n, err = send(func(c int) bool { return c >= 8 })
	require.NoError(t, err, "the thawed peer receives again")
	require.Equal(t, 8, n)

	// Killed mid-transfer: its kernel closes its sockets; the sender fails
	// at once, not after the timeout.
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	start := time.Now()
	_, err = send(func(int) bool { return time.Since(start) > timeout+5*time.Second })
	took := time.Since(start)
	require.Error(t, err, "the sender never noticed its killed peer")
	t.Logf("killed peer noticed after %v", took.Round(time.Millisecond))
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
	assert.NotContains(t, err.Error(), "unreachable", "a killed peer is seen by its closed sockets, not by the timeout")
	runtime.KeepAlive(src)
}
