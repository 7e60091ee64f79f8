package ib

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// A port going down is not fatal to the device, but it is why the comms
// over it are about to fail with retry-exceeded completions: NCCL WARNs it,
// and so must we, since NCCL_DEBUG=WARN hides INFO lines.
func TestAsyncPortErrorIsWarned(t *testing.T) {
	setEnv(t)
	f, a, _ := twoHosts(t, softnic.DeviceConfig{})
	findDevice(t, f, "simA_0").InjectAsyncEvent(verbs.AsyncEvent{Type: verbs.EventPortErr, Port: 1})
	within(t, "port error logged", func() (bool, error) { return a.log.has("IBV_EVENT_PORT_ERR"), nil })
	if !a.log.has("WARN NET/GoIB : simA_0: async event IBV_EVENT_PORT_ERR") {
		t.Fatalf("port error not WARNed:\n%s", a.log.String())
	}
	findDevice(t, f, "simA_0").InjectAsyncEvent(verbs.AsyncEvent{Type: verbs.EventPortActive, Port: 1})
	within(t, "port active logged", func() (bool, error) { return a.log.has("IBV_EVENT_PORT_ACTIVE"), nil })
	if a.log.has("WARN NET/GoIB : simA_0: async event IBV_EVENT_PORT_ACTIVE") {
		t.Fatalf("a port coming up is not a warning:\n%s", a.log.String())
	}
}

// After IBV_EVENT_DEVICE_FATAL the device's context answers every call with
// some unrelated verbs error (EIO). Comms on it, those that exist and those
// set up later, must fail fast with ncclSystemError and the WARN that names
// the device, the event and what to do, never with that verbs error.
func TestDeviceFatalFailsCommsWithTheCause(t *testing.T) {
	setEnv(t)
	f, a, b := twoHosts(t, softnic.DeviceConfig{})
	sc, _ := connectPair(t, a, 0, b, 0)
	buf := newBuf(t, sc, 64, 0)
	findDevice(t, f, "simA_0").Fail()
	within(t, "fatal event handled", func() (bool, error) { return a.log.has("IBV_EVENT_DEVICE_FATAL"), nil })
	const cause = "simA_0: fatal async event IBV_EVENT_DEVICE_FATAL; the device is unusable until it is reset: " +
		"check the NIC (ibv_devinfo, dmesg, firmware), then restart the job (or leave the device out with NCCL_IB_HCA=^simA_0)"
	assert.True(t, a.log.has("WARN NET/GoIB : "+cause), a.log.String())

	_, err := sc.Isend(buf.ptr(), 64, 0, buf.mh)
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
	assert.ErrorContains(t, err, "encountered a fatal error: "+cause)

	_, err = sc.RegMr(buf.ptr(), 64, nccl.PtrHost)
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
	assert.ErrorContains(t, err, cause, "not a locked-memory hint")

	// A connection set up after the event, from either side.
	_, h := listenOn(t, b, 0)
	cerr := connectFails(t, a, h)
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(cerr))
	assert.ErrorContains(t, cerr, "cannot use simA_0:1: "+cause)
	assert.NotContains(t, cerr.Error(), "errno")

	l, h := listenOn(t, a, 0)
	var aerr error
	within(t, "accept fails", func() (bool, error) {
		if c, err := b.t.Connect(0, h, nccl.ConnectOptions{TrafficClass: nccl.TrafficClassUndef}); c != nil || err != nil {
			t.Logf("connect: %v", err)
		}
		var rc nccl.RecvComm
		rc, aerr = l.Accept()
		require.Nil(t, rc)
		return aerr != nil, nil
	})
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(aerr))
	assert.ErrorContains(t, aerr, cause)
	assert.NotContains(t, aerr.Error(), "errno")
}

// A data-path verbs call that fails before the async watcher has read the
// device's fatal event (rxe's post_send and post_recv are system calls that
// return EIO at once) must report the event, not the EIO, like the calls
// made after it; when no event comes, the verbs error itself, with no hang.
func TestDataPathFailureBeforeTheEventNamesIt(t *testing.T) {
	const event = "encountered a fatal error: %s: fatal async event IBV_EVENT_DEVICE_FATAL"
	t.Run("receiver", func(t *testing.T) {
		setEnv(t)
		f, a, b := twoHosts(t, softnic.DeviceConfig{})
		_, rc := connectPair(t, a, 0, b, 0)
		buf := newBuf(t, rc, 64, 0)
		findDevice(t, f, "simB_0").FailEventLater(20 * time.Millisecond)
		_, err := rc.Irecv([]nccl.RecvBuffer{{Data: buf.ptr(), Size: 64, MH: buf.mh}})
		assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
		assert.ErrorContains(t, err, fmt.Sprintf(event, "simB_0"))
		assert.ErrorContains(t, err, "the call that failed: NET/GoIB : ibv_post_recv on simB_0")
		_, again := rc.Irecv([]nccl.RecvBuffer{{Data: buf.ptr(), Size: 64, MH: buf.mh}})
		assert.Equal(t, err, again, "the failure is sticky")
	})
	t.Run("sender", func(t *testing.T) {
		setEnv(t)
		f, a, b := twoHosts(t, softnic.DeviceConfig{})
		sc, rc := connectPair(t, a, 0, b, 0)
		sbuf, rbuf := newBuf(t, sc, 64, 1), newBuf(t, rc, 64, 0)
		_, err := rc.Irecv([]nccl.RecvBuffer{{Data: rbuf.ptr(), Size: 64, MH: rbuf.mh}})
		require.NoError(t, err)
		within(t, "clear-to-send arrived", func() (bool, error) { return atomic.LoadUint64(&sc.cts[0][0].Idx) == 1, nil })
		findDevice(t, f, "simA_0").FailEventLater(20 * time.Millisecond)
		_, err = sc.Isend(sbuf.ptr(), 64, 0, sbuf.mh)
		assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
		assert.ErrorContains(t, err, fmt.Sprintf(event, "simA_0"))
		assert.ErrorContains(t, err, "the call that failed: NET/GoIB : ibv_post_send on simA_0")
	})
	t.Run("no event", func(t *testing.T) {
		setEnv(t)
		f, a, b := twoHosts(t, softnic.DeviceConfig{})
		_, rc := connectPair(t, a, 0, b, 0)
		buf := newBuf(t, rc, 64, 0)
		findDevice(t, f, "simB_0").FailEventLater(-1)
		_, err := rc.Irecv([]nccl.RecvBuffer{{Data: buf.ptr(), Size: 64, MH: buf.mh}})
		assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
		assert.ErrorContains(t, err, "ibv_post_recv on simB_0")
		assert.ErrorContains(t, err, "errno 5")
		assert.NotContains(t, err.Error(), "fatal async event")
	})
}
