package socket

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Hosts with several NICs (a GPU server's rails). These tests build two
// network namespaces, "hosts" A and B, joined by veth pairs, and run one
// transport in each: a thread that entered a namespace creates every socket
// of its transport there (Init's interface list, listen, connect).

type railHosts struct {
	t    *testing.T
	a, b string
}

// newRailHosts makes namespaces A and B joined by one veth pair per entry of
// links: {name, A's address/len, B's address/len}; the interface has the same
// name in both. Skips, saying why, without root or iproute2.
func newRailHosts(t *testing.T, links [][3]string) *railHosts {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces and veth pairs (two hosts with several NICs cannot be made otherwise)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip to create network namespaces")
	}
	id := os.Getpid() % 100000
	h := &railHosts{t: t, a: fmt.Sprintf("sockrA-%d", id), b: fmt.Sprintf("sockrB-%d", id)}
	t.Cleanup(func() {
		_ = exec.Command("ip", "netns", "del", h.a).Run()
		_ = exec.Command("ip", "netns", "del", h.b).Run()
	})
	h.ip("netns", "add", h.a)
	h.ip("netns", "add", h.b)
	for _, ns := range []string{h.a, h.b} {
		h.ip("-n", ns, "link", "set", "lo", "up")
	}
	for _, l := range links {
		h.ip("link", "add", l[0], "netns", h.a, "type", "veth", "peer", "name", l[0], "netns", h.b)
		h.ip("-n", h.a, "addr", "add", l[1], "dev", l[0])
		h.ip("-n", h.b, "addr", "add", l[2], "dev", l[0])
		h.ip("-n", h.a, "link", "set", l[0], "up")
		h.ip("-n", h.b, "link", "set", l[0], "up")
	}
	// A veth is running (IFF_RUNNING, which device selection requires)
	// only once both of its ends are up, a moment after the last "up".
	for _, l := range links {
		for _, ns := range []string{h.a, h.b} {
			deadline := time.Now().Add(10 * time.Second)
			for !h.running(ns, l[0]) {
				require.True(t, time.Now().Before(deadline), "%s in %s never came up", l[0], ns)
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	return h
}

func (h *railHosts) running(ns, dev string) bool {
	h.t.Helper()
	out, err := exec.Command("ip", "-n", ns, "-j", "link", "show", "dev", dev).Output()
	require.NoError(h.t, err)
	var l []struct {
		OperState string `json:"operstate"`
	}
	require.NoError(h.t, json.Unmarshal(out, &l), "%s", out)
	return len(l) == 1 && l[0].OperState == "UP"
}

func (h *railHosts) ip(args ...string) {
	h.t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	require.NoError(h.t, err, "ip %v: %s", args, out)
}

// in runs f on a thread inside namespace ns and fails the test with its
// error; the thread is discarded afterwards (never unlocked).
func (h *railHosts) in(ns string, f func() error) {
	h.t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open("/var/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			err = unix.Setns(fd, unix.CLONE_NEWNET)
			unix.Close(fd)
		}
		if err == nil {
			err = f()
		}
		done <- err
	}()
	require.NoError(h.t, <-done, "in namespace %s", ns)
}

// txBytes is what interface dev of namespace ns has sent.
func (h *railHosts) txBytes(ns, dev string) uint64 {
	h.t.Helper()
	out, err := exec.Command("ip", "-n", ns, "-j", "-s", "link", "show", "dev", dev).Output()
	require.NoError(h.t, err)
	var l []struct {
		Stats64 struct {
			TX struct {
				Bytes uint64 `json:"bytes"`
			} `json:"tx"`
		} `json:"stats64"`
	}
	require.NoError(h.t, json.Unmarshal(out, &l), "%s", out)
	require.Len(h.t, l, 1)
	return l[0].Stats64.TX.Bytes
}

// transfer connects A's device dev to B's device dev and moves n messages
// of size bytes from A to B, every byte checked.
func (h *railHosts) transfer(trA, trB *Transport, dev, size, n int) {
	t := h.t
	t.Helper()
	var hd nccl.Handle
	var l nccl.Listener
	h.in(h.b, func() (err error) {
		l, err = trB.Listen(dev, &hd)
		return err
	})
	defer l.Close()
	var s nccl.SendComm
	var r nccl.RecvComm
	h.in(h.a, func() error {
		deadline := time.Now().Add(10 * time.Second)
		for s == nil || r == nil {
			var err error
			if s == nil {
				if s, err = trA.Connect(dev, &hd, nccl.ConnectOptions{}); err != nil {
					return fmt.Errorf("connect: %w", err)
				}
			}
			if r == nil {
				if r, err = l.Accept(); err != nil {
					return fmt.Errorf("accept: %w", err)
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("connection set-up timed out")
			}
			runtime.Gosched()
		}
		return nil
	})
	defer s.Close()
	defer r.Close()
	src, dst := make([]byte, size), make([]byte, size)
	for i := 0; i < n; i++ {
		pattern(src, i)
		sq, err := s.Isend(bufPtr(src), size, 1, 0)
		require.NoError(t, err)
		rq, err := r.Irecv([]nccl.RecvBuffer{{Data: bufPtr(dst), Size: size, Tag: 1}})
		require.NoError(t, err)
		deadline := time.Now().Add(20 * time.Second)
		for sd, rd := false, false; !sd || !rd; {
			if !sd {
				sd, _, err = s.Test(sq)
				require.NoError(t, err)
			}
			if !rd {
				rd, err = r.Test(rq, nil)
				require.NoError(t, err)
			}
			require.True(t, time.Now().Before(deadline), "transfer timed out")
		}
		require.Equal(t, src, dst, "message %d", i)
	}
	runtime.KeepAlive(src)
	runtime.KeepAlive(dst)
}

// TestSameSubnetRailCarriesItsOwnTraffic: two NICs of each host share one
// subnet (10.214.0.0/24), with the source-based policy routing such hosts
// need ("ip rule from <second NIC's address> table ..."). A connection NCCL
// makes on device 1 (the second NIC, for its GPU) must leave through that
// NIC, data streams included. Unbound, the kernel picked the first NIC's
// address as source, so the main table sent every byte out of the first
// NIC: device 1 carried nothing while NCCL counted two NICs' bandwidth.
func TestSameSubnetRailCarriesItsOwnTraffic(t *testing.T) {
	h := newRailHosts(t, [][3]string{
		{"rl0", "10.214.0.1/24", "10.214.0.2/24"},
		{"rl1", "10.214.0.11/24", "10.214.0.12/24"},
	})
	// The second NIC's own table, on both hosts, as multi-NIC hosts on one
	// subnet are set up.
	for ns, addr := range map[string]string{h.a: "10.214.0.11", h.b: "10.214.0.12"} {
		h.ip("-n", ns, "route", "add", "10.214.0.0/24", "dev", "rl1", "src", addr, "table", "214")
		h.ip("-n", ns, "rule", "add", "from", addr, "table", "214")
	}
	withEnv(t, map[string]string{envIfname: "rl", envNThreads: "2", envNSocks: "2"})
	log := &captureLog{}
	trA := &Transport{ifaces: hostIfaces{}, sysRoot: "testdata/sys-none"}
	trB := &Transport{ifaces: hostIfaces{}, sysRoot: "testdata/sys-none"}
	h.in(h.a, func() error { return trA.Init(nccl.InitContext{Log: log}) })
	h.in(h.b, func() error { return trB.Init(nccl.InitContext{Log: log}) })
	defer trA.Finalize()
	defer trB.Finalize()
	require.Equal(t, 2, trA.Devices())
	p, err := trA.Properties(1)
	require.NoError(t, err)
	require.Equal(t, "rl1", p.Name)

	const size, n = 4 << 20, 8
	tx0, tx1 := h.txBytes(h.a, "rl0"), h.txBytes(h.a, "rl1")
	h.transfer(trA, trB, 1, size, n)
	d0, d1 := h.txBytes(h.a, "rl0")-tx0, h.txBytes(h.a, "rl1")-tx1
	t.Logf("device 1 (rl1): A sent %d bytes on rl0, %d on rl1", d0, d1)
	assert.GreaterOrEqual(t, d1, uint64(size*n), "device 1's connection did not leave through device 1's NIC")
	assert.Less(t, d0, uint64(size), "device 1's connection sent its data through device 0's NIC")

	tx0, tx1 = h.txBytes(h.a, "rl0"), h.txBytes(h.a, "rl1")
	h.transfer(trA, trB, 0, size, n)
	d0, d1 = h.txBytes(h.a, "rl0")-tx0, h.txBytes(h.a, "rl1")-tx1
	t.Logf("device 0 (rl0): A sent %d bytes on rl0, %d on rl1", d0, d1)
	assert.GreaterOrEqual(t, d0, uint64(size*n), "device 0's connection did not leave through device 0's NIC")
	assert.Less(t, d1, uint64(size), "device 0's connection sent its data through device 1's NIC")
}

// TestConnectOnADownRailNamesIt: device 1's link goes down after Init (a
// rail's cable, its switch port). A connect NCCL makes on it fails within
// NCCL_GO_TIMEOUT, and the WARN names the device and says its interface is
// down: the address alone does not tell which of eight NICs to look at.
func TestConnectOnADownRailNamesIt(t *testing.T) {
	h := newRailHosts(t, [][3]string{
		{"rl0", "10.215.0.1/24", "10.215.0.2/24"},
		{"rl1", "10.215.1.1/24", "10.215.1.2/24"},
	})
	withEnv(t, map[string]string{envIfname: "rl", envTimeout: "2"})
	logA := &captureLog{}
	trA := &Transport{ifaces: hostIfaces{}, sysRoot: "testdata/sys-none"}
	trB := &Transport{ifaces: hostIfaces{}, sysRoot: "testdata/sys-none"}
	h.in(h.a, func() error { return trA.Init(nccl.InitContext{Log: logA}) })
	h.in(h.b, func() error { return trB.Init(nccl.InitContext{Log: &captureLog{}}) })
	defer trA.Finalize()
	defer trB.Finalize()
	require.Equal(t, 2, trA.Devices())
	var hd nccl.Handle
	var l nccl.Listener
	h.in(h.b, func() (err error) { l, err = trB.Listen(1, &hd); return err })
	defer l.Close()
	h.ip("-n", h.a, "link", "set", "rl1", "down")
	var took time.Duration
	var cerr error
	h.in(h.a, func() error {
		start := time.Now()
		for time.Since(start) < 10*time.Second {
			s, err := trA.Connect(1, &hd, nccl.ConnectOptions{})
			if s != nil {
				s.Close()
				return fmt.Errorf("connected over a link that is down")
			}
			if err != nil {
				took, cerr = time.Since(start), err
				return nil
			}
			time.Sleep(time.Millisecond)
		}
		return fmt.Errorf("connect on a down rail still pending after 10 s")
	})
	t.Logf("failed after %v: %v", took.Round(time.Millisecond), cerr)
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(cerr))
	assert.Less(t, took, 4*time.Second, "NCCL_GO_TIMEOUT=2 bounds the connect")
	assert.Contains(t, logA.String(), "on device rl1 (the interface is down now)", "the WARN must name the rail and its state")
}
