package ib

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// dialBoth polls a's Connect (with traffic class tclass) and Accept on l
// until each has a comm or an error; the comms are closed when the test ends.
func dialBoth(t *testing.T, a *host, l nccl.Listener, h *nccl.Handle, tclass int) (nccl.SendComm, nccl.RecvComm, error, error) {
	t.Helper()
	var sc nccl.SendComm
	var rc nccl.RecvComm
	var cerr, aerr error
	within(t, "connect and accept settle", func() (bool, error) {
		if sc == nil && cerr == nil {
			sc, cerr = a.t.Connect(0, h, nccl.ConnectOptions{TrafficClass: tclass})
		}
		if rc == nil && aerr == nil {
			rc, aerr = l.Accept()
		}
		return (sc != nil || cerr != nil) && (rc != nil || aerr != nil), nil
	})
	t.Cleanup(func() {
		if sc != nil {
			_ = sc.Close()
		}
		if rc != nil {
			_ = rc.Close()
		}
	})
	return sc, rc, cerr, aerr
}

// On RoCE, ibv_modify_qp(RTR) fails with ETIMEDOUT while the kernel has no
// ARP answer for the peer's address yet. NCCL retries it (100 ms × attempt,
// 34 times); the connection must come up once the address resolves, on
// either side, and say in an INFO what it waited for.
func TestQPTransitionRetriedOnETIMEDOUT(t *testing.T) {
	setEnv(t, "NCCL_IB_MQP_RETRY_SLEEP_MSEC", "20")
	f, a, b := twoHosts(t, softnic.DeviceConfig{LinkLayer: verbs.LinkEthernet})
	f.InjectModifyFault(softnic.ModifyFault{Device: "simB_0", To: "RTR", Err: verbs.ETIMEDOUT, Count: 1})
	f.InjectModifyFault(softnic.ModifyFault{Device: "simA_0", To: "RTR", Err: verbs.ETIMEDOUT, Count: 2})
	start := time.Now()
	sc, rc := connectPair(t, a, 0, b, 0)
	took := time.Since(start)
	assert.Equal(t, 3, f.ModifyFaultHits())
	assert.GreaterOrEqual(t, took, 20*time.Millisecond+(20+40)*time.Millisecond, "the n-th retry sleeps n × NCCL_IB_MQP_RETRY_SLEEP_MSEC")
	assert.Equal(t, 1, b.log.count("retrying"), b.log)
	assert.True(t, b.log.has("retrying 1/34 after 20ms"), b.log)
	assert.True(t, a.log.has("retrying 1/34 after 20ms"), a.log)
	assert.True(t, a.log.has("retrying 2/34 after 40ms"), a.log)
	assert.True(t, a.log.has("succeeded at retry 2/34"), a.log)
	assert.False(t, a.log.has("WARN"), a.log)
	got, _ := transfer(t, sc, rc, []int{4096}, []int{4096})
	assert.Equal(t, pattern(4096, 0), got[0], "the retried connection carries data")
}

// Any other error fails the connection at once, as in NCCL, unless
// NCCL_IB_MQP_RETRY_ALL asks for every error to be retried.
func TestQPTransitionOtherErrorsFailAtOnce(t *testing.T) {
	setEnv(t, "NCCL_IB_MQP_RETRY_SLEEP_MSEC", "10")
	f, a, b := twoHosts(t, softnic.DeviceConfig{LinkLayer: verbs.LinkEthernet})
	f.InjectModifyFault(softnic.ModifyFault{Device: "simB_0", To: "RTS", Err: verbs.EINVAL, Count: 3})
	l, h := listenOn(t, b, 0)
	sc, rc, cerr, aerr := dialBoth(t, a, l, h, nccl.TrafficClassUndef)
	require.Nil(t, rc)
	assert.Nil(t, sc)
	assert.Error(t, cerr)
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(aerr))
	assert.ErrorContains(t, aerr, "ibv_modify_qp(RTS)")
	assert.ErrorContains(t, aerr, "EINVAL")
	assert.Equal(t, 1, f.ModifyFaultHits(), "not retried")
	assert.False(t, b.log.has("retrying"), b.log)

	setEnv(t, "NCCL_IB_MQP_RETRY_SLEEP_MSEC", "10", "NCCL_IB_MQP_RETRY_ALL", "1")
	f, a, b = twoHosts(t, softnic.DeviceConfig{LinkLayer: verbs.LinkEthernet})
	f.InjectModifyFault(softnic.ModifyFault{Device: "simB_0", To: "RTS", Err: verbs.EINVAL, Count: 2})
	connectPair(t, a, 0, b, 0)
	assert.Equal(t, 2, f.ModifyFaultHits())
	assert.True(t, b.log.has("succeeded at retry 2/34"), b.log)
}

// A transition that keeps failing ends after NCCL_IB_MQP_RETRY_CNT retries,
// and the error says how long it tried and what to set.
func TestQPTransitionRetriesEnd(t *testing.T) {
	setEnv(t, "NCCL_IB_MQP_RETRY_SLEEP_MSEC", "5", "NCCL_IB_MQP_RETRY_CNT", "3")
	f, a, b := twoHosts(t, softnic.DeviceConfig{LinkLayer: verbs.LinkEthernet})
	f.InjectModifyFault(softnic.ModifyFault{Device: "simB_0", To: "RTR", Err: verbs.ETIMEDOUT})
	l, h := listenOn(t, b, 0)
	_, rc, cerr, aerr := dialBoth(t, a, l, h, nccl.TrafficClassUndef)
	require.Nil(t, rc)
	assert.Error(t, cerr)
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(aerr))
	assert.ErrorContains(t, aerr, "ETIMEDOUT")
	assert.ErrorContains(t, aerr, "retried 3 times")
	assert.ErrorContains(t, aerr, "NCCL_IB_MQP_RETRY_CNT=3")
	assert.ErrorContains(t, aerr, "NCCL_IB_GID_INDEX", "the RTR hint still names the likely cause")
	assert.Equal(t, 4, f.ModifyFaultHits(), "one attempt and three retries")

	// NCCL_IB_MQP_RETRY_CNT=0: one attempt.
	setEnv(t, "NCCL_IB_MQP_RETRY_CNT", "0")
	f, a, b = twoHosts(t, softnic.DeviceConfig{LinkLayer: verbs.LinkEthernet})
	f.InjectModifyFault(softnic.ModifyFault{Device: "simA_0", To: "RTR", Err: verbs.ETIMEDOUT})
	l, h = listenOn(t, b, 0)
	_, _, cerr, _ = dialBoth(t, a, l, h, nccl.TrafficClassUndef)
	assert.ErrorContains(t, cerr, "retried 0 times")
	assert.Equal(t, 1, f.ModifyFaultHits())
}

// No retry starts whose sleep would end past the set-up bound
// (NCCL_GO_TIMEOUT): the handshake stays bounded whatever the retry count.
func TestQPTransitionRetriesStayWithinSetupBound(t *testing.T) {
	setEnv(t, "NCCL_IB_MQP_RETRY_SLEEP_MSEC", "400", "NCCL_GO_TIMEOUT", "1")
	f, a, b := twoHosts(t, softnic.DeviceConfig{LinkLayer: verbs.LinkEthernet})
	f.InjectModifyFault(softnic.ModifyFault{Device: "simB_0", To: "RTR", Err: verbs.ETIMEDOUT})
	l, h := listenOn(t, b, 0)
	start := time.Now()
	_, rc, _, aerr := dialBoth(t, a, l, h, nccl.TrafficClassUndef)
	require.Nil(t, rc)
	assert.Less(t, time.Since(start), 1500*time.Millisecond)
	assert.ErrorContains(t, aerr, "retry 2 would end past the connection set-up bound, NCCL_GO_TIMEOUT: 1s")
	assert.Equal(t, 2, f.ModifyFaultHits(), "tried at 0 and 400 ms; the next, at 1.2 s, is past the bound")
}

// Finalize, and closing the listen, end a retry's sleep: neither may wait out
// NCCL's schedule (NCCL closes a listen right after its Accept, and aborts
// by finalizing).
func TestQPTransitionRetryEndsAtCloseAndFinalize(t *testing.T) {
	for _, stop := range []string{"listen close", "finalize"} {
		t.Run(stop, func(t *testing.T) {
			setEnv(t, "NCCL_IB_MQP_RETRY_SLEEP_MSEC", "30000")
			f, a, b := twoHosts(t, softnic.DeviceConfig{LinkLayer: verbs.LinkEthernet})
			f.InjectModifyFault(softnic.ModifyFault{Device: "simB_0", To: "RTR", Err: verbs.ETIMEDOUT})
			l, h := listenOn(t, b, 0)
			within(t, "the receiver's RTR is waiting to retry", func() (bool, error) {
				sc, err := a.t.Connect(0, h, nccl.ConnectOptions{TrafficClass: nccl.TrafficClassUndef})
				require.Nil(t, sc)
				if err != nil {
					return false, err
				}
				rc, err := l.Accept()
				require.Nil(t, rc)
				return b.log.has("retrying 1/34 after 30s"), err
			})
			done := make(chan error, 1)
			go func() {
				if stop == "finalize" {
					done <- b.t.Finalize()
				} else {
					done <- l.Close()
				}
			}()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(5 * time.Second):
				t.Fatalf("%s is waiting out the 30 s retry sleep", stop)
			}
			assert.Equal(t, 1, f.ModifyFaultHits())
		})
	}
}
