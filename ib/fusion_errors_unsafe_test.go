package ib

import (
	"bytes"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/internal/clock"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// fusedHosts builds two hosts with na and nb devices each and fuses them all.
func fusedHosts(t *testing.T, na, nb int) (*softnic.Fabric, *host, int, *host, int) {
	f := softnic.NewFabric()
	var an, bn []string
	for i := 0; i < max(na, nb); i++ {
		if i < na {
			an = append(an, fmt.Sprintf("simA_%d", i))
			f.AddDevice(softnic.DeviceConfig{Name: an[i]})
		}
		if i < nb {
			bn = append(bn, fmt.Sprintf("simB_%d", i))
			f.AddDevice(softnic.DeviceConfig{Name: bn[i]})
		}
	}
	a, b := newHost(t, f, verbs.Features{}, an...), newHost(t, f, verbs.Features{}, bn...)
	fuse := func(h *host, n int) int {
		if n == 1 {
			return 0
		}
		devs := make([]int, n)
		for i := range devs {
			devs[i] = i
		}
		v, err := h.t.MakeVDevice(devs)
		require.NoError(t, err)
		require.Equal(t, n, v)
		return v
	}
	return f, a, fuse(a, na), b, fuse(b, nb)
}

func TestVNICFusion(t *testing.T) {
	for _, c := range [][2]int{{2, 2}, {3, 3}, {4, 4}, {2, 3}, {1, 4}} {
		t.Run(fmt.Sprintf("%dx%d", c[0], c[1]), func(t *testing.T) {
			setEnv(t, "NCCL_GO_IB_FORCE_FLUSH", "1")
			_, a, av, b, bv := fusedHosts(t, c[0], c[1])
			p, err := a.t.Properties(av)
			require.NoError(t, err)
			assert.Len(t, p.VDevs, c[0])
			assert.Equal(t, c[0]*100000, p.Speed, "speeds add up (EDR 4x = 100 Gb/s each)")
			sc, rc := connectPair(t, a, av, b, bv)
			assert.Len(t, sc.qps, max(c[0], c[1]), "QPs striped over the larger side's members")
			assert.Len(t, rc.flush.qps, c[1], "one loopback flush QP per member")
			for i := 0; i < 2*max(c[0], c[1]); i++ { // rotate over every QP
				size := 1000 + 4097*i
				got, sizes := transfer(t, sc, rc, []int{size, 3}, []int{size, 8})
				assert.Equal(t, []int{size, 3}, sizes)
				assert.True(t, bytes.Equal(pattern(size, 0), got[0][:size]))
			}
			rb := newBuf(t, rc, 64, 1)
			r, err := rc.Iflush([]nccl.RecvBuffer{{Data: rb.ptr(), Size: 1, MH: rb.mh}})
			require.NoError(t, err)
			within(t, "flush on every member", func() (bool, error) { return rc.Test(r, nil) })
		})
	}
}

func TestMakeVDeviceRefusals(t *testing.T) {
	setEnv(t)
	f := softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "ib0"})
	f.AddDevice(softnic.DeviceConfig{Name: "ib1"})
	f.AddDevice(softnic.DeviceConfig{Name: "roce0", LinkLayer: verbs.LinkEthernet})
	h := newHost(t, f, verbs.Features{})
	idx := map[string]int{}
	for d := 0; d < h.t.Devices(); d++ {
		p, err := h.t.Properties(d)
		require.NoError(t, err)
		idx[p.Name] = d
	}
	_, err := h.t.MakeVDevice([]int{idx["ib0"], idx["roce0"]})
	assert.Equal(t, nccl.InvalidUsage, nccl.ResultOf(err), "differing link layers")
	assert.ErrorContains(t, err, "link layers differ")
	_, err = h.t.MakeVDevice([]int{idx["ib0"], idx["ib0"]})
	assert.Equal(t, nccl.InvalidArgument, nccl.ResultOf(err))
	_, err = h.t.MakeVDevice(make([]int, 9))
	assert.Equal(t, nccl.InvalidUsage, nccl.ResultOf(err))
	_, err = h.t.MakeVDevice([]int{7})
	assert.Equal(t, nccl.InvalidArgument, nccl.ResultOf(err))
	setEnv(t, "NCCL_IB_MERGE_NICS", "0") // read once, by Init
	_, err = newHost(t, f, verbs.Features{}).t.MakeVDevice([]int{idx["ib0"], idx["ib1"]})
	assert.Equal(t, nccl.InvalidUsage, nccl.ResultOf(err))
	assert.ErrorContains(t, err, "NCCL_IB_MERGE_NICS=0")
	v, err := h.t.MakeVDevice([]int{idx["ib1"]})
	require.NoError(t, err, "a single device is not a fusion")
	assert.Equal(t, 3, v)
}

// failRequest drives a send and its receive until one side errors and
// returns both results.
func exchangeUntilError(t *testing.T, sc *sendComm, rc *recvComm) (error, error) {
	rb := newBuf(t, rc, 4096, 0)
	sb := newBuf(t, sc, 4096, 1)
	rreq, rerr := rc.Irecv([]nccl.RecvBuffer{{Data: rb.ptr(), Size: 4096, MH: rb.mh}})
	var sreq nccl.Request = nccl.NoRequest
	var serr error
	deadline := time.Now().Add(10 * time.Second)
	for rerr == nil && serr == nil {
		if sreq == nccl.NoRequest {
			sreq, serr = sc.Isend(sb.ptr(), 4096, 0, sb.mh)
		} else {
			_, _, serr = sc.Test(sreq)
		}
		if rreq != nccl.NoRequest && rerr == nil {
			_, rerr = rc.Test(rreq, make([]int, 1))
		}
		require.True(t, time.Now().Before(deadline), "no error surfaced within 10s")
	}
	return serr, rerr
}

func TestInjectedCompletionErrors(t *testing.T) {
	for _, c := range []struct {
		status verbs.WCStatus
		hint   string
	}{
		{verbs.WCRetryExcErr, "NCCL_IB_TIMEOUT (now 20) is too short"},
		{verbs.WCRemAccessErr, "rejected the RDMA access"},
		{verbs.WCLocProtErr, "NCCL_NET_GDR_LEVEL=0"},
	} {
		t.Run(c.status.String(), func(t *testing.T) {
			setEnv(t)
			f, a, b := twoHosts(t, softnic.DeviceConfig{})
			sc, rc := connectPair(t, a, 0, b, 0)
			f.InjectFault(softnic.Fault{Device: "simA_0", Status: c.status, Count: 1})
			serr, _ := exchangeUntilError(t, sc, rc)
			assert.Equal(t, nccl.RemoteError, nccl.ResultOf(serr))
			assert.True(t, a.log.has("status="+c.status.String()), a.log.String())
			assert.True(t, a.log.has(c.hint), a.log.String())
			assert.True(t, a.log.has("simA_0:1"), "the WARN names the device")
			// The comm stays failed: later calls fail fast with the same code.
			_, err := sc.Isend(nil, 0, 0, 0)
			assert.Equal(t, nccl.RemoteError, nccl.ResultOf(err))
		})
	}
}

func TestPeerGoneFlushesReceiver(t *testing.T) {
	setEnv(t)
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	sc, rc := connectPair(t, a, 0, b, 0)
	require.NoError(t, sc.Close()) // the sender's QPs vanish: CTS writes find nobody
	rb := newBuf(t, rc, 64, 0)
	r, err := rc.Irecv([]nccl.RecvBuffer{{Data: rb.ptr(), Size: 64, MH: rb.mh}})
	require.NoError(t, err)
	var terr error
	within(t, "error", func() (bool, error) {
		_, terr = rc.Test(r, make([]int, 1))
		if terr == nil {
			// CTS writes are unsignaled; a new post is what notices.
			_, terr = rc.Irecv([]nccl.RecvBuffer{{Data: rb.ptr(), Size: 64, MH: rb.mh}})
		}
		return terr != nil, nil
	})
	assert.Equal(t, nccl.RemoteError, nccl.ResultOf(terr))
	assert.True(t, b.log.has("IBV_WC_RETRY_EXC_ERR") || b.log.has("IBV_WC_WR_FLUSH_ERR"), b.log.String())
}

func TestAsyncEventsFailComms(t *testing.T) {
	t.Run("qp fatal", func(t *testing.T) {
		setEnv(t)
		f, a, b := twoHosts(t, softnic.DeviceConfig{})
		sc, rc := connectPair(t, a, 0, b, 0)
		_ = f
		dev := findDevice(t, f, "simB_0")
		dev.InjectAsyncEvent(verbs.AsyncEvent{Type: verbs.EventQPFatal, QPNum: rc.qps[0].qp.Num()})
		within(t, "fatal noticed", func() (bool, error) {
			_, err := rc.Irecv([]nccl.RecvBuffer{{Size: 0}})
			return nccl.ResultOf(err) == nccl.SystemError, nil
		})
		_, err := rc.Test(0, nil)
		assert.Error(t, err)
		assert.True(t, b.log.has("IBV_EVENT_QP_FATAL"), b.log.String())
		_, err = sc.Isend(nil, 0, 0, 0)
		assert.NoError(t, err, "the other host's comm is not affected")
	})
	t.Run("device fatal", func(t *testing.T) {
		setEnv(t)
		f, a, b := twoHosts(t, softnic.DeviceConfig{})
		sc, _ := connectPair(t, a, 0, b, 0)
		findDevice(t, f, "simA_0").InjectAsyncEvent(verbs.AsyncEvent{Type: verbs.EventDeviceFatal})
		within(t, "fatal noticed", func() (bool, error) {
			_, err := sc.Isend(nil, 0, 0, 0)
			return nccl.ResultOf(err) == nccl.SystemError, nil
		})
		_, err := sc.Isend(nil, 0, 0, 0)
		assert.ErrorContains(t, err, "IBV_EVENT_DEVICE_FATAL")
	})
	t.Run("non-fatal is only logged", func(t *testing.T) {
		setEnv(t)
		f, a, b := twoHosts(t, softnic.DeviceConfig{})
		sc, _ := connectPair(t, a, 0, b, 0)
		findDevice(t, f, "simA_0").InjectAsyncEvent(verbs.AsyncEvent{Type: verbs.EventPortActive, Port: 1})
		within(t, "logged", func() (bool, error) { return a.log.has("IBV_EVENT_PORT_ACTIVE"), nil })
		_, err := sc.Isend(nil, 0, 0, 0)
		assert.NoError(t, err)
	})
	t.Run("ignored with NCCL_IB_RETURN_ASYNC_EVENTS=0", func(t *testing.T) {
		setEnv(t, "NCCL_IB_RETURN_ASYNC_EVENTS", "0")
		f, a, b := twoHosts(t, softnic.DeviceConfig{})
		sc, _ := connectPair(t, a, 0, b, 0)
		findDevice(t, f, "simA_0").InjectAsyncEvent(verbs.AsyncEvent{Type: verbs.EventDeviceFatal})
		within(t, "logged", func() (bool, error) { return a.log.has("IBV_EVENT_DEVICE_FATAL"), nil })
		_, err := sc.Isend(nil, 0, 0, 0)
		assert.NoError(t, err)
	})
}

func findDevice(t *testing.T, f *softnic.Fabric, name string) *softnic.Device {
	d := f.Device(name)
	require.NotNil(t, d)
	return d
}

func TestRogueConnectionsDoNotDisturbListen(t *testing.T) {
	setEnv(t)
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	l, h := listenOn(t, b, 0)
	hi, err := readHandle(h)
	require.NoError(t, err)
	// Garbage, a wrong magic, and a silent peer.
	c1, err := net.Dial("tcp", hi.addr.String())
	require.NoError(t, err)
	_, _ = c1.Write(bytes.Repeat([]byte{0x42}, 64))
	c2, err := net.Dial("tcp", hi.addr.String())
	require.NoError(t, err)
	require.NoError(t, writeMsg(c2, &hello{Magic: 1, Type: socketTypeNetIB, Version: protoVersion, Secret: hi.secret}))
	c3, err := net.Dial("tcp", hi.addr.String())
	require.NoError(t, err)
	defer c1.Close()
	defer c2.Close()
	defer c3.Close()
	var sc nccl.SendComm
	var rc nccl.RecvComm
	within(t, "real connection", func() (bool, error) {
		var err error
		if sc == nil {
			if sc, err = a.t.Connect(0, h, nccl.ConnectOptions{TrafficClass: -1}); err != nil {
				return false, err
			}
		}
		if rc == nil {
			rc, err = l.Accept()
		}
		return sc != nil && rc != nil, err
	})
	defer sc.Close()
	defer rc.Close()
	within(t, "rogues logged", func() (bool, error) { return b.log.has("dropping connection"), nil })
	got, _ := transfer(t, sc.(*sendComm), rc.(*recvComm), []int{99}, []int{99})
	assert.Equal(t, pattern(99, 0), got[0][:99])
}

func TestMagicMismatchIsAClearError(t *testing.T) {
	setEnv(t)
	f := softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "simA_0"})
	f.AddDevice(softnic.DeviceConfig{Name: "simB_0"})
	b := newHost(t, f, verbs.Features{}, "simB_0")
	setEnv(t, "NCCL_SOCKET_MAGIC", "0x1234") // read once, by Init
	a := newHost(t, f, verbs.Features{}, "simA_0")
	_, h := listenOn(t, b, 0)
	_, err := a.t.Connect(0, h, nccl.ConnectOptions{})
	assert.Equal(t, nccl.InvalidUsage, nccl.ResultOf(err))
	assert.ErrorContains(t, err, "NCCL_SOCKET_MAGIC")
}

func TestIncompatibleLinkLayers(t *testing.T) {
	setEnv(t)
	f := softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "ibA"})
	f.AddDevice(softnic.DeviceConfig{Name: "roceB", LinkLayer: verbs.LinkEthernet})
	a, b := newHost(t, f, verbs.Features{}, "ibA"), newHost(t, f, verbs.Features{}, "roceB")
	l, h := listenOn(t, b, 0)
	var cerr, aerr error
	within(t, "refused", func() (bool, error) {
		if cerr == nil {
			_, cerr = a.t.Connect(0, h, nccl.ConnectOptions{})
		}
		if aerr == nil {
			_, aerr = l.Accept()
		}
		return cerr != nil && aerr != nil, nil
	})
	assert.Equal(t, nccl.InvalidUsage, nccl.ResultOf(cerr))
	assert.ErrorContains(t, cerr, "incompatible devices")
	assert.Equal(t, nccl.InvalidUsage, nccl.ResultOf(aerr))
}

// A sender that dies after the receiver's clear-to-send reached it leaves
// the receive with nothing in flight to fail: only the kept handshake
// connection tells. The receive must fail, not hang.
func TestReceiverNoticesSenderGone(t *testing.T) {
	setEnv(t)
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	sc, rc := connectPair(t, a, 0, b, 0)
	rb := newBuf(t, rc, 64, 0)
	r, err := rc.Irecv([]nccl.RecvBuffer{{Data: rb.ptr(), Size: 64, MH: rb.mh}})
	require.NoError(t, err)
	done, err := rc.Test(r, make([]int, 1))
	require.NoError(t, err)
	require.False(t, done)
	// The receiver's clock stands still until the test moves it past the
	// grace period, so what is checked is the order, not how long it took.
	now := clock.Now()
	rc.watch.now = func() int64 { return now }
	require.NoError(t, sc.Close())
	test := func() error {
		done, err := rc.Test(r, make([]int, 1))
		require.False(t, done, "a receive whose sender closed cannot complete")
		return err
	}
	within(t, "the receiver sees the close", func() (bool, error) { return rc.watch.goneAt != 0, test() })
	for i := 0; i < 2*peerCheckEvery; i++ {
		require.NoError(t, test(), "completions get a grace period after the close")
	}
	now += int64(peerGrace)
	var terr error
	within(t, "receive fails", func() (bool, error) { terr = test(); return terr != nil, nil })
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(terr), "%v", terr)
	assert.True(t, b.log.has("closed the connection"), b.log.String())
}

// The reverse: a send waiting for a clear-to-send from a receiver that
// closed must fail instead of returning "retry later" forever; also when the
// clear-to-send arrived in part (its first entry announces two receive
// buffers and the second never comes, as when the receiver dies between the
// packets of its one RDMA write; until 2026-11-28 isend answered "retry
// later" for that forever).
func TestSenderNoticesReceiverGone(t *testing.T) {
	for _, c := range []struct {
		name, waiting string
		half          bool
	}{
		{"none-arrived", "waiting for the receiver's clear-to-send", false},
		{"half-arrived", "waiting for the rest of the receiver's clear-to-send", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			setEnv(t)
			_, a, b := twoHosts(t, softnic.DeviceConfig{})
			sc, rc := connectPair(t, a, 0, b, 0)
			sb := newBuf(t, sc, 64, 0)
			if c.half {
				slot := int(sc.fifoHead % maxRequests)
				atomic.StoreUint64(&sc.cts[slot][0].Idx, sc.fifoHead+1)
				sc.cts[slot][0].NReqs = 2
			}
			require.NoError(t, rc.Close())
			var serr error
			within(t, "send fails", func() (bool, error) {
				var r nccl.Request
				r, serr = sc.Isend(sb.ptr(), 64, 0, sb.mh)
				require.Equal(t, nccl.NoRequest, r)
				return serr != nil, nil
			})
			assert.Equal(t, nccl.SystemError, nccl.ResultOf(serr), "%v", serr)
			assert.True(t, a.log.has(c.waiting), a.log.String())
		})
	}
}

// A sender may close as soon as its sends report done (the data has been
// acknowledged): that is not a dead peer, and the receives must complete.
func TestSenderClosingAfterLastSendIsNoFailure(t *testing.T) {
	setEnv(t)
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	sc, rc := connectPair(t, a, 0, b, 0)
	const n, size = 16, 4096
	rb := newBuf(t, rc, n*size, 0)
	sb := newBuf(t, sc, n*size, 0)
	for i := 0; i < n; i++ {
		copy(sb.b[i*size:], pattern(size, byte(i)))
	}
	rreqs := make([]nccl.Request, n)
	for i := range rreqs {
		var err error
		rreqs[i], err = rc.Irecv([]nccl.RecvBuffer{{Data: unsafe.Add(rb.ptr(), i*size), Size: size, MH: rb.mh}})
		require.NoError(t, err)
	}
	for i := 0; i < n; i++ {
		var r nccl.Request
		within(t, "isend", func() (bool, error) {
			var err error
			r, err = sc.Isend(unsafe.Add(sb.ptr(), i*size), size, 0, sb.mh)
			return r != nccl.NoRequest, err
		})
		within(t, "send done", func() (bool, error) { d, _, err := sc.Test(r); return d, err })
	}
	require.NoError(t, sc.Close())
	// Make the close old news before the first Test: let the receiver's
	// watch see it, then move its clock past the grace period.
	within(t, "the receiver sees the close", func() (bool, error) {
		rc.watch.gone()
		return rc.watch.goneAt != 0, nil
	})
	rc.watch.now = func() int64 { return clock.Now() + int64(peerGrace) }
	for i, r := range rreqs {
		sizes := make([]int, 1)
		within(t, "receive", func() (bool, error) { return rc.Test(r, sizes) })
		assert.Equal(t, size, sizes[0])
		assert.Equal(t, pattern(size, byte(i)), rb.b[i*size:(i+1)*size])
	}
}

// A connector always asks for at least one QP per member of the larger side
// (max of both device counts); a fused listener's receive comm sends each
// clear-to-send on the first QP of member (id % ndevs). A peer that offers
// fewer QPs than the listener has members (another build, or a forged
// handshake) left the receive comm indexing past its QPs on the first
// irecv, a panic on NCCL's progress thread. The handshake refuses it.
func TestFusedListenerRefusesFewerQPsThanItsMembers(t *testing.T) {
	setEnv(t)
	_, _, _, b, bv := fusedHosts(t, 1, 2)
	l, h := listenOn(t, b, bv)
	hi, err := readHandle(h)
	require.NoError(t, err)
	c, err := net.Dial("tcp", hi.addr.String())
	require.NoError(t, err)
	defer c.Close()
	m := connMeta{NDevs: 1, NQPs: 1, NDataQPs: 1}
	m.Devs[0] = devMeta{LID: 999, LinkLayer: uint8(verbs.LinkInfiniBand), MTU: 5, Port: 1, RKey: 0x1234}
	m.QPs[0] = qpMeta{QPN: 0xabcdef}
	m.Addr = 0x10000
	go func() {
		var r helloReply
		var rm connMeta
		if writeMsg(c, &hello{Magic: hi.magic, Type: socketTypeNetIB, Version: protoVersion, Secret: hi.secret, NDevs: 1, LinkLayer: uint32(verbs.LinkInfiniBand)}) != nil ||
			readMsg(c, &r) != nil || writeMsg(c, &m) != nil || readMsg(c, &rm) != nil {
			return
		}
		_ = writeMsg(c, uint32(readyMagic))
	}()
	var rc nccl.RecvComm
	var aerr error
	within(t, "accept", func() (bool, error) {
		rc, aerr = l.Accept()
		return rc != nil || aerr != nil, nil
	})
	if rc != nil {
		defer rc.Close()
	}
	require.Error(t, aerr, "a peer offering 1 QP to a listener fused from 2 ports")
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(aerr))
	assert.ErrorContains(t, aerr, "QPs")
}
