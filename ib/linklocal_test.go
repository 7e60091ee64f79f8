package ib

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// newLinkLocalPair is a network namespace joined to this one by a veth pair
// whose ends have IPv6 link-local addresses only (fe80::1 here, fe80::2
// there) and different interface indexes, as two hosts of an IPv6
// link-local management network may have.
func newLinkLocalPair(t *testing.T) *netnsPair {
	t.Helper()
	return newVethNetns(t, "ibll", "and a veth pair", func(p *netnsPair, run func(...string)) {
		// No automatic link-local address (it would be tentative for a
		// while): each end gets one fixed address without duplicate
		// address detection.
		run("link", "set", p.hostIf, "addrgenmode", "none")
		run("-n", p.ns, "link", "set", p.peerIf, "addrgenmode", "none")
		run("addr", "add", "fe80::1/64", "dev", p.hostIf, "nodad")
		run("-n", p.ns, "addr", "add", "fe80::2/64", "dev", p.peerIf, "nodad")
		run("link", "set", p.hostIf, "up")
		run("-n", p.ns, "link", "set", p.peerIf, "up")
	})
}

// TestLinkLocalOnlyHandshake: hosts whose handshake interface has only an
// IPv6 link-local address connect, as with NCCL's IB transport. The listener
// advertises its fe80:: address (the handle has no room for a zone that
// would mean anything on the peer), and the connector dials it through its
// own handshake interface, so differing interface indexes do not matter.
// It used to fail init on both hosts ("no up interface with a usable
// address matches NCCL_SOCKET_IFNAME=...").
func TestLinkLocalOnlyHandshake(t *testing.T) {
	p := newLinkLocalPair(t)
	f := softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "simA_0"})
	f.AddDevice(softnic.DeviceConfig{Name: "simB_0"})
	root := t.TempDir()
	require.NoError(t, f.WriteSysfs(root))

	setEnv(t, "NCCL_GO_TIMEOUT", "10", "NCCL_SOCKET_IFNAME", p.peerIf)
	var b *Transport
	var h nccl.Handle
	var l nccl.Listener
	var initErr, listenErr error
	p.inNetns(t, func() {
		b = NewWithOptions(Options{Provider: f.Provider(verbs.Features{}, "simB_0"), SysfsRoot: root})
		if initErr = b.Init(nccl.InitContext{Log: &captureLog{}}); initErr == nil {
			l, listenErr = b.Listen(0, &h)
		}
	})
	require.NoError(t, initErr, "init with a link-local-only handshake interface")
	t.Cleanup(func() { _ = b.Finalize() })
	require.NoError(t, listenErr)
	t.Cleanup(func() { _ = l.Close() })
	hi, err := readHandle(&h)
	require.NoError(t, err)
	assert.Equal(t, "fe80::2", hi.addr.Addr().String(), "the handle carries the listener's link-local address")

	setEnv(t, "NCCL_GO_TIMEOUT", "10", "NCCL_SOCKET_IFNAME", p.hostIf)
	alog := &captureLog{}
	a := NewWithOptions(Options{Provider: f.Provider(verbs.Features{}, "simA_0"), SysfsRoot: root})
	require.NoError(t, a.Init(nccl.InitContext{Log: alog}), "init with a link-local-only handshake interface")
	t.Cleanup(func() { _ = a.Finalize() })

	var sc nccl.SendComm
	var rc nccl.RecvComm
	within(t, "connect over a link-local-only veth", func() (bool, error) {
		var err error
		if sc == nil {
			if sc, err = a.Connect(0, &h, nccl.ConnectOptions{TrafficClass: nccl.TrafficClassUndef}); err != nil {
				return false, err
			}
		}
		if rc == nil {
			rc, err = l.Accept()
		}
		return sc != nil && rc != nil, err
	})
	t.Cleanup(func() { _ = sc.Close(); _ = rc.Close() })
	assert.Contains(t, sc.(*sendComm).peer, "fe80::2%"+p.hostIf, "dialled through the connector's own interface")

	// A message crosses the connection.
	sb := newBuf(t, sc, 4096, 7)
	rb := newBuf(t, rc, 4096, 0)
	rreq, err := rc.Irecv([]nccl.RecvBuffer{{Data: rb.ptr(), Size: 4096, MH: rb.mh}})
	require.NoError(t, err)
	var sreq nccl.Request
	within(t, "isend", func() (bool, error) {
		r, err := sc.Isend(sb.ptr(), 4096, 0, sb.mh)
		sreq = r
		return r != nccl.NoRequest, err
	})
	sizes := make([]int, 1)
	within(t, "transfer", func() (bool, error) {
		rd, err := rc.Test(rreq, sizes)
		if err != nil {
			return false, err
		}
		sd, _, err := sc.Test(sreq)
		return rd && sd, err
	})
	assert.Equal(t, 4096, sizes[0])
	assert.Equal(t, sb.b[:4096], rb.b[:4096])
}
