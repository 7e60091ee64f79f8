package ib

import (
	"testing"

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
