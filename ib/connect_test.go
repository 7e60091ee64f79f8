package ib

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// A listener drops, without a word, a connection whose secret is not its
// own (a stale handle: its listen was closed and the port reused, or the
// handle belongs to another job). The connector then only sees EOF, and its
// error must say what that means rather than "hello reply: EOF".
func TestStaleHandleIsAClearError(t *testing.T) {
	setEnv(t)
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	_, h := listenOn(t, b, 0)
	h[hOffSecret] ^= 1
	cerr := connectFails(t, a, h)
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(cerr))
	assert.ErrorContains(t, cerr, "closed the connection without answering")
	assert.ErrorContains(t, cerr, "stale")
}

// connectFails polls a's Connect on device 0 until it fails (it must not
// succeed) and returns the error.
func connectFails(t *testing.T, a *host, h *nccl.Handle) error {
	var cerr error
	within(t, "connect fails", func() (bool, error) {
		var sc nccl.SendComm
		sc, cerr = a.t.Connect(0, h, nccl.ConnectOptions{TrafficClass: nccl.TrafficClassUndef})
		require.Nil(t, sc)
		return cerr != nil, nil
	})
	return cerr
}

// A handle from another plugin build or from the socket transport is a
// configuration mismatch between ranks, not a bug in the plugin: NCCL
// reports such mismatches as ncclInvalidUsage, and so does the socket
// transport for its own handles.
func TestHandleVersionMismatchIsInvalidUsage(t *testing.T) {
	setEnv(t)
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	_, h := listenOn(t, b, 0)
	h[hOffVersion] = handleVersion + 1
	sc, err := a.t.Connect(0, h, nccl.ConnectOptions{TrafficClass: nccl.TrafficClassUndef})
	require.Nil(t, sc)
	assert.Equal(t, nccl.InvalidUsage, nccl.ResultOf(err))
	assert.ErrorContains(t, err, "NET/GoIB : connect: handle version 2 is not 1")
	assert.ErrorContains(t, err, "NCCL_GO_TRANSPORT")

	// A corrupt handle of the right version stays an internal error.
	h[hOffVersion], h[hOffFamily] = handleVersion, 9
	_, err = a.t.Connect(0, h, nccl.ConnectOptions{TrafficClass: nccl.TrafficClassUndef})
	assert.Equal(t, nccl.InternalError, nccl.ResultOf(err))
}

// A service level the HCA refuses at RTR is named in the error with the
// setting it came from, never blamed on the GID. ConnectX keeps an IB
// service level's low 4 bits and refuses nothing, and NCCL uses the
// communicator's traffic class (e.g. 106) as the service level when
// NCCL_IB_SL is unset, so the plugin must not refuse it itself: only an HCA
// that does (the model's RefuseSL) fails the connection. The receiver's RTR
// runs first, with the sender's service level, so its Accept reports it.
func TestBadServiceLevelNamesItsSetting(t *testing.T) {
	dial := func(t *testing.T, cfg softnic.DeviceConfig, tclass int) (nccl.SendComm, nccl.RecvComm, error, error) {
		_, a, b := twoHosts(t, cfg)
		l, h := listenOn(t, b, 0)
		return dialBoth(t, a, l, h, tclass)
	}
	for _, c := range []struct {
		env    []string
		tclass int
		want   string
	}{
		{[]string{"NCCL_IB_SL", "16"}, nccl.TrafficClassUndef, "service level 16 is out of range (0-15); it comes from the sender's NCCL_IB_SL"},
		{nil, 106, "service level 106 is out of range (0-15); it comes from the sender's NCCL_IB_SL (or its communicator's traffic class when that is unset)"},
	} {
		setEnv(t, c.env...)
		sc, rc, cerr, aerr := dial(t, softnic.DeviceConfig{RefuseSL: true}, c.tclass)
		require.Nil(t, rc)
		assert.Equal(t, nccl.SystemError, nccl.ResultOf(aerr), "%v", aerr)
		assert.ErrorContains(t, aerr, c.want)
		assert.NotContains(t, fmt.Sprint(aerr), "GID")
		// The receiver dropped the handshake: the sender must not get a comm.
		assert.Nil(t, sc)
		assert.Error(t, cerr)
	}
	// ConnectX (the model's default): the traffic class as service level connects.
	setEnv(t)
	sc, rc, cerr, aerr := dial(t, softnic.DeviceConfig{}, 106)
	require.NoError(t, cerr)
	require.NoError(t, aerr)
	assert.NotNil(t, sc)
	assert.NotNil(t, rc)
	// RoCE uses the low bits as the priority and refuses nothing.
	setEnv(t, "NCCL_IB_SL", "16")
	_, a, b := twoHosts(t, softnic.DeviceConfig{LinkLayer: verbs.LinkEthernet, RefuseSL: true})
	connectPair(t, a, 0, b, 0)
}

func TestRTRHint(t *testing.T) {
	local := qos{tc: 106, sl: 3, tcFrom: "NCCL_IB_TC", slFrom: "NCCL_IB_SL"}
	assert.Equal(t, "check the service level 3, from NCCL_IB_SL: the subnet manager must map it to a virtual lane of this port",
		rtrHint(verbs.LinkInfiniBand, local))
	h := rtrHint(verbs.LinkEthernet, local)
	assert.Contains(t, h, "NCCL_IB_GID_INDEX")
	assert.Contains(t, h, "traffic class 106, from NCCL_IB_TC")
	assert.Contains(t, h, "service level 3, from NCCL_IB_SL")
	local.sl = 20
	assert.True(t, strings.HasPrefix(rtrHint(verbs.LinkEthernet, local), "service level 20 is out of range (0-15); it comes from NCCL_IB_SL; otherwise"))
}

func TestQoSSaysWhereEachValueCameFrom(t *testing.T) {
	c := config{tc: -1, sl: -1, fifoTC: -1}
	q := c.trafficClass(nccl.ConnectOptions{TrafficClass: nccl.TrafficClassUndef})
	assert.Equal(t, qos{0, 0, "the default (NCCL_IB_TC is unset)", "the default (NCCL_IB_SL is unset)"}, q)
	q = c.trafficClass(nccl.ConnectOptions{TrafficClass: 106})
	assert.Equal(t, qos{106, 106, "the communicator's traffic class (NCCL_IB_TC is unset)", "the communicator's traffic class (NCCL_IB_SL is unset)"}, q)
	c.tc, c.sl = 41, 3
	assert.Equal(t, qos{41, 3, "NCCL_IB_TC", "NCCL_IB_SL"}, c.trafficClass(nccl.ConnectOptions{TrafficClass: 106}))
	r := c.receiverQoS(&connMeta{TC: 41, SL: 3})
	assert.Equal(t, 41, r.tc)
	assert.Contains(t, r.tcFrom, "the sender's NCCL_IB_TC")
	assert.Contains(t, r.slFrom, "the sender's NCCL_IB_SL")
	c.fifoTC = 7
	assert.Equal(t, qos{7, 3, "NCCL_IB_FIFO_TC", r.slFrom}, c.receiverQoS(&connMeta{TC: 41, SL: 3}))
}

// The flush QP gets the sender's service level and traffic class, as NCCL's
// flush QP gets the remote meta's: with SL 0 on a fabric where SL 0 is not
// usable on the port, the GPU-direct flush READ would fail while the data,
// on the configured SL, flows.
func TestFlushQPUsesTheSendersServiceLevel(t *testing.T) {
	for _, ll := range []verbs.LinkLayer{verbs.LinkInfiniBand, verbs.LinkEthernet} {
		setEnv(t, "NCCL_IB_SL", "5", "NCCL_IB_TC", "96", "NCCL_GO_IB_FORCE_FLUSH", "1")
		f, a, b := twoHosts(t, softnic.DeviceConfig{LinkLayer: ll})
		_, rc := connectPair(t, a, 0, b, 0)
		require.NotEmpty(t, rc.flush.qps, "%v: NCCL_GO_IB_FORCE_FLUSH=1 gives the receive comm a flush QP", ll)
		for _, q := range rc.flush.qps {
			rtr, ok := f.RTR(q.Num())
			require.True(t, ok)
			assert.EqualValues(t, 5, rtr.AH.SL, "%v: flush QP service level", ll)
			if ll == verbs.LinkEthernet {
				assert.EqualValues(t, 96, rtr.AH.TrafficClass, "RoCE flush QP traffic class")
			}
		}
	}
}
