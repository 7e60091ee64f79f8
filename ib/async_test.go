package ib

import (
	"testing"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
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
