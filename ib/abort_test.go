package ib

import (
	"encoding/binary"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclsock"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Abort safety: NCCL (2.28+) finalizes the plugin and closes listeners on
// every ncclCommAbort/destroy, which races connection set-up. Whatever the
// moment, the transport must stop every goroutine it started, release every
// QP, CQ, MR and fd they built, and never touch a device after closing it.
// The software NIC refuses and records every call on a destroyed object, so
// a use-after-free shows up in Fabric.Violations.

func fdCount(t testing.TB) int {
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// settle waits (bounded) until the process is back to base goroutines and
// fds: exiting goroutines and closed sockets are reaped asynchronously.
func settle(t testing.TB, baseG, baseFD int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		g, fd := runtime.NumGoroutine(), fdCount(t)
		if g <= baseG && fd <= baseFD {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("goroutines %d (baseline %d), fds %d (baseline %d) after 5s:\n%s", g, baseG, fd, baseFD, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(time.Millisecond)
	}
}

// noLeaks checks the devices hold no QP or MR and the NIC saw no misuse.
func noLeaks(t testing.TB, f *softnic.Fabric, devs ...string) {
	t.Helper()
	for _, d := range devs {
		dev := f.Device(d)
		assert.Zero(t, dev.QPCount(), "QPs left on %s", d)
		assert.Zero(t, dev.MRCount(), "MRs left on %s", d)
	}
	assert.Empty(t, f.Violations(), "use-after-free or leak reported by the software NIC")
}

// bareHost is a transport whose Finalize the test calls itself.
func bareHost(t testing.TB, f *softnic.Fabric, root, dev string) *Transport {
	t.Helper()
	tr := NewWithOptions(Options{Provider: f.Provider(verbs.Features{}, dev), SysfsRoot: root})
	require.NoError(t, tr.Init(nccl.InitContext{Log: &captureLog{}}))
	return tr
}

// stallingListener answers a connector's hello, reads its QP information
// and then says nothing: the connector is left inside set-up with its QPs
// and FIFO built.
type stallingListener struct {
	ln      net.Listener
	gotMeta chan struct{}
	wg      sync.WaitGroup
}

func newStallingListener(t *testing.T) (*stallingListener, nccl.Handle) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &stallingListener{ln: ln, gotMeta: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var h hello
		var m connMeta
		if readMsg(c, &h) != nil || writeMsg(c, &helloReply{NDevs: 1, LinkLayer: uint32(verbs.LinkInfiniBand)}) != nil || readMsg(c, &m) != nil {
			return
		}
		close(s.gotMeta)
		_, _ = c.Read(make([]byte, 1)) // until the connector or the test closes
	}()
	t.Cleanup(func() { _ = ln.Close(); s.wg.Wait() })
	var h nccl.Handle
	writeHandle(&h, handleInfo{magic: ncclsock.DefaultMagic, secret: 7, addr: ln.Addr().(*net.TCPAddr).AddrPort()})
	return s, h
}

// stallingConnector plays a connector up to the listener's QP information
// and never confirms: the listener is left with its receive comm built.
func stallingConnector(t *testing.T, h *nccl.Handle) (gotMeta chan struct{}, stop func()) {
	hi, err := readHandle(h)
	require.NoError(t, err)
	c, err := net.Dial("tcp", hi.addr.String())
	require.NoError(t, err)
	gotMeta = make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		m := connMeta{NDevs: 1, NQPs: 1, NDataQPs: 1}
		m.Devs[0] = devMeta{LID: 999, LinkLayer: uint8(verbs.LinkInfiniBand), MTU: 5, Port: 1, RKey: 0x1234}
		m.QPs[0] = qpMeta{QPN: 0xabcdef}
		m.Addr = 0x10000
		var r helloReply
		var rm connMeta
		if writeMsg(c, &hello{Magic: hi.magic, Type: socketTypeNetIB, Version: protoVersion, Secret: hi.secret, NDevs: 1, LinkLayer: uint32(verbs.LinkInfiniBand)}) != nil ||
			readMsg(c, &r) != nil || writeMsg(c, &m) != nil || readMsg(c, &rm) != nil {
			return
		}
		close(gotMeta)
		_, _ = c.Read(make([]byte, 1))
	}()
	return gotMeta, func() { _ = c.Close(); <-done }
}

func waitFor(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not within 10s", what)
	}
}

// oneDevice is a fabric with one device and its sysfs tree.
func oneDevice(t *testing.T, name string) (*softnic.Fabric, string) {
	setEnv(t)
	f := softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: name})
	root := t.TempDir()
	require.NoError(t, f.WriteSysfs(root))
	return f, root
}

func TestFinalizeDuringPendingConnect(t *testing.T) {
	f, root := oneDevice(t, "simA_0")
	baseG, baseFD := runtime.NumGoroutine(), fdCount(t)

	a := bareHost(t, f, root, "simA_0")
	sl, h := newStallingListener(t)
	sc, err := a.Connect(0, &h, nccl.ConnectOptions{TrafficClass: -1})
	require.NoError(t, err)
	require.Nil(t, sc)
	waitFor(t, "the connector sent its QP information", sl.gotMeta)
	require.NotZero(t, f.Device("simA_0").QPCount(), "the connector's QPs exist while it waits for the peer")

	start := time.Now()
	require.NoError(t, a.Finalize())
	assert.Less(t, time.Since(start), 5*time.Second, "Finalize must not wait for the peer")
	noLeaks(t, f, "simA_0")
	sc, err = a.Connect(0, &h, nccl.ConnectOptions{TrafficClass: -1})
	assert.Nil(t, sc)
	assert.Error(t, err, "connect on a finalized transport")
	_ = sl.ln.Close()
	settle(t, baseG, baseFD)
	assert.Empty(t, f.Violations())
}

func TestListenerCloseOrFinalizeDuringPendingAccept(t *testing.T) {
	for _, how := range []string{"listener close", "finalize"} {
		t.Run(how, func(t *testing.T) {
			f, root := oneDevice(t, "simB_0")
			baseG, baseFD := runtime.NumGoroutine(), fdCount(t)

			b := bareHost(t, f, root, "simB_0")
			var h nccl.Handle
			l, err := b.Listen(0, &h)
			require.NoError(t, err)
			gotMeta, stop := stallingConnector(t, &h)
			waitFor(t, "the listener answered with its QP information", gotMeta)
			require.NotZero(t, f.Device("simB_0").QPCount(), "the receive comm exists while the listener waits for 'ready'")

			start := time.Now()
			if how == "listener close" {
				require.NoError(t, l.Close())
				noLeaks(t, f, "simB_0")
				require.NoError(t, b.Finalize())
			} else {
				require.NoError(t, b.Finalize())
				rc, err := l.Accept()
				assert.Nil(t, rc)
				assert.Error(t, err, "accept on a finalized transport")
				assert.NoError(t, l.Close())
			}
			assert.Less(t, time.Since(start), 5*time.Second, "must not wait for the peer")
			noLeaks(t, f, "simB_0")
			stop()
			settle(t, baseG, baseFD)
			assert.Empty(t, f.Violations())
		})
	}
}

// TestAbortAtAnyMoment finalizes and closes at random points of set-up and
// of the data path, 1000 times, and checks nothing leaks or is touched after
// it was freed. Variants: finalize right after connect starts; after a few
// polls; after set-up with comms closed first; with requests in flight and
// comms closed first; with comms still open at finalize (they stay usable
// and release the devices when the last one closes); listener closed
// during a pending accept.
func TestAbortAtAnyMoment(t *testing.T) {
	rounds := 1000
	if testing.Short() {
		rounds = 100
	}
	// A connector whose listener closed before it connected gets refused;
	// NCCL's retries of that (34 x 100 ms, linear) would only slow the test.
	setEnv(t, "NCCL_SOCKET_RETRY_CNT", "1", "NCCL_SOCKET_RETRY_SLEEP_MSEC", "1")
	f := softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "simA_0"})
	f.AddDevice(softnic.DeviceConfig{Name: "simB_0"})
	root := t.TempDir()
	require.NoError(t, f.WriteSysfs(root))
	baseG, baseFD := runtime.NumGoroutine(), fdCount(t)
	rng := rand.New(rand.NewPCG(1, 2))
	for r := 0; r < rounds; r++ {
		abortRound(t, bareHost(t, f, root, "simA_0"), bareHost(t, f, root, "simB_0"), r%6, rng)
		noLeaks(t, f, "simA_0", "simB_0")
		if t.Failed() {
			t.Fatalf("round %d (variant %d) failed", r, r%6)
		}
	}
	settle(t, baseG, baseFD)
}

func abortRound(t *testing.T, a, b *Transport, variant int, rng *rand.Rand) {
	finalize := func() {
		if rng.IntN(2) == 0 {
			a, b = b, a
		}
		require.NoError(t, a.Finalize())
		require.NoError(t, b.Finalize())
	}
	var h nccl.Handle
	l, err := b.Listen(0, &h)
	require.NoError(t, err)
	var sc nccl.SendComm
	var rc nccl.RecvComm
	poll := func(n int) {
		for i := 0; i < n && (sc == nil || rc == nil); i++ {
			if sc == nil {
				sc, err = a.Connect(0, &h, nccl.ConnectOptions{TrafficClass: -1})
				require.NoError(t, err)
			}
			if rc == nil {
				rc, err = l.Accept()
				require.NoError(t, err)
			}
			runtime.Gosched()
		}
	}
	connect := func() {
		deadline := time.Now().Add(10 * time.Second)
		for sc == nil || rc == nil {
			poll(1)
			require.True(t, time.Now().Before(deadline), "set-up did not finish")
		}
	}
	closeComms := func() {
		// Comms that reached NCCL survive finalize; NCCL closes them later.
		if sc != nil {
			require.NoError(t, sc.Close())
		}
		if rc != nil {
			require.NoError(t, rc.Close())
		}
	}
	switch variant {
	case 0:
		poll(1)
		finalize()
		closeComms()
	case 1:
		poll(rng.IntN(40))
		if rng.IntN(2) == 0 {
			require.NoError(t, l.Close())
		}
		finalize()
		closeComms()
	case 2:
		connect()
		require.NoError(t, l.Close())
		require.NoError(t, sc.Close())
		require.NoError(t, rc.Close())
		finalize()
	case 3, 4:
		connect()
		require.NoError(t, l.Close())
		s, r := sc.(*sendComm), rc.(*recvComm)
		sb, rb := abortBuf(t, s, 1<<16), abortBuf(t, r, 1<<16)
		inflight(t, s, r, sb, rb, rng.IntN(8))
		if variant == 4 {
			// Comms NCCL still holds survive finalize and keep working; the
			// devices go when the last of them closes.
			finalize()
			_, err := r.Irecv([]nccl.RecvBuffer{{Data: rb.ptr(), Size: 8, MH: rb.mh}})
			require.NoError(t, err)
		}
		require.NoError(t, s.DeregMr(sb.mh))
		require.NoError(t, r.DeregMr(rb.mh))
		if rng.IntN(2) == 0 {
			require.NoError(t, sc.Close())
			require.NoError(t, rc.Close())
		} else {
			require.NoError(t, rc.Close())
			require.NoError(t, sc.Close())
		}
		if variant == 3 {
			finalize()
		}
	case 5:
		poll(1 + rng.IntN(3))
		require.NoError(t, l.Close())
		// The connector must then fail or finish, never hang.
		deadline := time.Now().Add(10 * time.Second)
		for sc == nil && err == nil {
			sc, err = a.Connect(0, &h, nccl.ConnectOptions{TrafficClass: -1})
			require.True(t, time.Now().Before(deadline), "connect neither failed nor finished after the listener closed")
			runtime.Gosched()
		}
		closeComms()
		finalize()
	}
}

// abortBuf is registered off-heap memory that outlives the round's comms.
func abortBuf(t *testing.T, c nccl.Comm, n int) *buf {
	t.Helper()
	x := &buf{b: mmapBytes(t, n)}
	mh, err := c.RegMr(x.ptr(), n, nccl.PtrHost)
	require.NoError(t, err)
	x.mh = mh
	return x
}

// inflight posts k receives and k sends and tests a random subset, leaving
// the rest in flight.
func inflight(t *testing.T, s *sendComm, r *recvComm, sb, rb *buf, k int) {
	var rreqs, sreqs []nccl.Request
	for i := 0; i < k; i++ {
		rr, err := r.Irecv([]nccl.RecvBuffer{{Data: rb.ptr(), Size: 4096, MH: rb.mh}})
		require.NoError(t, err)
		rreqs = append(rreqs, rr)
		sr, err := s.Isend(sb.ptr(), 100*i, 0, sb.mh)
		require.NoError(t, err)
		sreqs = append(sreqs, sr)
	}
	for i := 0; i < k/2; i++ {
		if sreqs[i] != nccl.NoRequest {
			_, _, err := s.Test(sreqs[i])
			require.NoError(t, err)
		}
		_, err := r.Test(rreqs[i], make([]int, 1))
		require.NoError(t, err)
	}
	binary.LittleEndian.PutUint64(sb.b, uint64(k))
}
