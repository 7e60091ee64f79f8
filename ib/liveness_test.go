package ib

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/forkguard"
	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// netnsPair is a network namespace joined to this one by a veth pair: the
// peer host of the liveness test. Cutting the link makes it unreachable
// while both "processes" live on.
type netnsPair struct {
	ns, hostIf, peerIf string
}

func newNetnsPair(t *testing.T) *netnsPair {
	t.Helper()
	return newVethNetns(t, "ibt", "the unreachable-host case cannot be made otherwise", func(p *netnsPair, run func(...string)) {
		run("addr", "add", "10.213.7.1/30", "dev", p.hostIf)
		run("link", "set", p.hostIf, "up")
		run("-n", p.ns, "addr", "add", "10.213.7.2/30", "dev", p.peerIf)
		run("-n", p.ns, "link", "set", p.peerIf, "up")
	})
}

// newVethNetns makes the namespace and its veth pair (names from prefix and
// the pid), lets addr address and raise both ends with run (ip with its
// arguments), brings up the namespace's lo, and removes it all when the test
// ends. Skipped, saying why (why), without root or iproute2.
func newVethNetns(t *testing.T, prefix, why string, addr func(p *netnsPair, run func(...string))) *netnsPair {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("needs root to create a network namespace (%s)", why)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip to create a network namespace")
	}
	id := os.Getpid() % 100000
	p := &netnsPair{ns: fmt.Sprintf("%s-%d", prefix, id), hostIf: fmt.Sprintf("%sh%d", prefix, id), peerIf: fmt.Sprintf("%sp%d", prefix, id)}
	run := func(args ...string) {
		t.Helper()
		out, err := exec.Command("ip", args...).CombinedOutput()
		require.NoError(t, err, "ip %v: %s", args, out)
	}
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", p.hostIf).Run()
		_ = exec.Command("ip", "netns", "del", p.ns).Run()
	})
	run("netns", "add", p.ns)
	run("link", "add", p.hostIf, "type", "veth", "peer", "name", p.peerIf)
	run("link", "set", p.peerIf, "netns", p.ns)
	addr(p, run)
	run("-n", p.ns, "link", "set", "lo", "up")
	return p
}

// inNetns runs f on an OS thread inside the namespace; sockets f creates
// stay there. The thread is discarded afterwards (never unlocked).
func (p *netnsPair) inNetns(t *testing.T, f func()) {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open("/var/run/netns/"+p.ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			err = unix.Setns(fd, unix.CLONE_NEWNET)
			unix.Close(fd)
		}
		if err == nil {
			f()
		}
		done <- err
	}()
	require.NoError(t, <-done)
}

// Liveness decides death (CONVENTIONS §6): through the handshake connection
// each comm keeps, a sender waiting for a clear-to-send and a receiver
// waiting for data both notice within NCCL_GO_TIMEOUT that the peer's host
// became unreachable; before that, a peer that simply does not post for
// three times NCCL_GO_TIMEOUT is alive (its kernel answers) and nothing
// fails.
func TestDeadPeerHostDetectedSlowPeerNever(t *testing.T) {
	p := newNetnsPair(t)
	const timeout = 2 * time.Second
	f := softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "simA_0"})
	f.AddDevice(softnic.DeviceConfig{Name: "simB_0"})
	root := t.TempDir()
	require.NoError(t, f.WriteSysfs(root))

	// B, the peer host, lives in the namespace: its listening sockets (and
	// so the connections they accept) are there.
	setEnv(t, "NCCL_GO_TIMEOUT", "2", "NCCL_SOCKET_IFNAME", p.peerIf)
	var b *Transport
	var h1, h2 nccl.Handle
	var l1, l2 nccl.Listener
	p.inNetns(t, func() {
		b = NewWithOptions(Options{Provider: f.Provider(verbs.Features{}, "simB_0"), SysfsRoot: root})
		if err := b.Init(nccl.InitContext{Log: &captureLog{}}); err != nil {
			panic(err)
		}
		var err error
		if l1, err = b.Listen(0, &h1); err != nil {
			panic(err)
		}
		if l2, err = b.Listen(0, &h2); err != nil {
			panic(err)
		}
	})
	t.Cleanup(func() { _ = l1.Close(); _ = l2.Close(); _ = b.Finalize() })
	setEnv(t, "NCCL_GO_TIMEOUT", "2", "NCCL_SOCKET_IFNAME", p.hostIf)
	alog := &captureLog{}
	a := NewWithOptions(Options{Provider: f.Provider(verbs.Features{}, "simA_0"), SysfsRoot: root})
	require.NoError(t, a.Init(nccl.InitContext{Log: alog}))
	t.Cleanup(func() { _ = a.Finalize() })

	hA, hB := &host{t: a, log: alog}, &host{t: b, log: &captureLog{}}
	_ = hB
	connect := func(h *nccl.Handle, l nccl.Listener) (*sendComm, *recvComm) {
		var sc nccl.SendComm
		var rc nccl.RecvComm
		within(t, "connect over the veth", func() (bool, error) {
			var err error
			if sc == nil {
				if sc, err = hA.t.Connect(0, h, nccl.ConnectOptions{TrafficClass: -1}); err != nil {
					return false, err
				}
			}
			if rc == nil {
				rc, err = l.Accept()
			}
			return sc != nil && rc != nil, err
		})
		t.Cleanup(func() { _ = sc.Close(); _ = rc.Close() })
		return sc.(*sendComm), rc.(*recvComm)
	}
	// Connection 1: A sends, B never posts (A waits for a clear-to-send).
	// Connection 2: B posts a receive, A never sends (B waits for data).
	sc1, _ := connect(&h1, l1)
	_, rc2 := connect(&h2, l2)
	sb := newBuf(t, sc1, 64, 1)
	rb := newBuf(t, rc2, 64, 0)
	rreq, err := rc2.Irecv([]nccl.RecvBuffer{{Data: rb.ptr(), Size: 64, MH: rb.mh}})
	require.NoError(t, err)

	var sendErr, recvErr error
	var sendAt, recvAt time.Duration
	step := func(start time.Time) {
		if sendErr == nil {
			r, err := sc1.Isend(sb.ptr(), 64, 0, sb.mh)
			require.Equal(t, nccl.NoRequest, r)
			if err != nil {
				sendErr, sendAt = err, time.Since(start)
			}
		}
		if recvErr == nil {
			done, err := rc2.Test(rreq, make([]int, 1))
			require.False(t, done)
			if err != nil {
				recvErr, recvAt = err, time.Since(start)
			}
		}
	}
	// Slow, not dead: 3 x NCCL_GO_TIMEOUT without posting.
	start := time.Now()
	for time.Since(start) < 3*timeout {
		step(start)
		require.NoError(t, sendErr, "a sender whose receiver is slow (not dead) must keep waiting")
		require.NoError(t, recvErr, "a receiver whose sender is slow (not dead) must keep waiting")
		time.Sleep(time.Millisecond)
	}
	// Now the peer host becomes unreachable.
	out, err := exec.Command("ip", "link", "set", p.hostIf, "down").CombinedOutput()
	require.NoError(t, err, "%s", out)
	start = time.Now()
	const slack = 3 * time.Second
	for (sendErr == nil || recvErr == nil) && time.Since(start) < timeout+slack+5*time.Second {
		step(start)
		time.Sleep(time.Millisecond)
	}
	t.Logf("after the link went down: sender failed after %v (%v), receiver after %v (%v)", sendAt, sendErr, recvAt, recvErr)
	require.Error(t, sendErr, "the sender never noticed")
	require.Error(t, recvErr, "the receiver never noticed")
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(sendErr))
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(recvErr))
	assert.LessOrEqual(t, sendAt, timeout+slack, "sender: dead host noticed within NCCL_GO_TIMEOUT")
	assert.LessOrEqual(t, recvAt, timeout+slack, "receiver: dead host noticed within NCCL_GO_TIMEOUT")
}

// The kept handshake connection's keepalive follows NCCL_GO_TIMEOUT on both
// ends: first probe after half of it, and off altogether with 0 (Go's dialer
// and listener would otherwise leave their own 15 s keepalive on).
func TestKeepAliveFollowsTimeout(t *testing.T) {
	for _, c := range []struct {
		timeout  string
		on, idle int
	}{{"20", 1, 10}, {"0", 0, -1}} {
		t.Run("NCCL_GO_TIMEOUT="+c.timeout, func(t *testing.T) {
			setEnv(t, "NCCL_GO_TIMEOUT", c.timeout)
			_, a, b := twoHosts(t, softnic.DeviceConfig{})
			sc, rc := connectPair(t, a, 0, b, 0)
			for side, w := range map[string]*peerWatch{"sender": &sc.watch, "receiver": &rc.watch} {
				var on, idle int
				require.NoError(t, w.raw.Control(func(fd uintptr) {
					on, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE)
					idle, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
				}))
				assert.Equal(t, c.on, on, "%s: SO_KEEPALIVE", side)
				if c.idle >= 0 {
					assert.Equal(t, c.idle, idle, "%s: TCP_KEEPIDLE", side)
				}
			}
		})
	}
}

// A child forked from the host process (a DataLoader worker) must not hold
// the kept handshake connections: while it did, this rank's death or close
// sent the peer no FIN, and the peer's liveness check saw a live peer.
func TestForkedChildDropsHandshakeConnections(t *testing.T) {
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	sc, rc := connectPair(t, a, 0, b, 0)
	var fds []int
	for _, c := range []*net.TCPConn{sc.watch.conn, rc.watch.conn} {
		require.NotNil(t, c, "the comm keeps its handshake connection")
		raw, err := c.SyscallConn()
		require.NoError(t, err)
		require.NoError(t, raw.Control(func(fd uintptr) { fds = append(fds, int(fd)) }))
	}
	open, err := forkguard.OpenInChild(fds)
	require.NoError(t, err)
	assert.Equal(t, []bool{false, false}, open, "the child still holds the sender's / receiver's handshake connection")
}
