package ib

import (
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// warnLines is every WARN a host logged, one per line.
func warnLines(l *captureLog) string {
	var out []string
	for _, s := range strings.Split(l.String(), "\n") {
		if strings.HasPrefix(s, "WARN ") {
			out = append(out, s)
		}
	}
	return strings.Join(out, "\n")
}

// ibv_reg_mr fails with ENOMEM when the pages would pass the locked-memory
// limit and with EFAULT when the range cannot be pinned at all (unmapped, or
// GPU memory without nvidia-peermem). The error must name the errno and give
// the hint that fits it: EFAULT was "errno 14 (unknown); check the
// locked-memory limit", which sends the user to the wrong knob. At
// connection set-up, where a container's 64 KiB default limit is met first
// (one connection pins 128 KiB of control blocks), the ENOMEM had no hint at
// all; and nothing of the failed set-up may stay registered.
func TestRegMrFailureHintFollowsErrno(t *testing.T) {
	t.Run("regMr", func(t *testing.T) {
		setEnv(t)
		f, a, b := twoHosts(t, softnic.DeviceConfig{})
		sc, _ := connectPair(t, a, 0, b, 0)
		m := mmapBytes(t, 4096)
		base := f.Device("simA_0").MRCount()

		f.InjectCallFault(softnic.CallFault{Device: "simA_0", Call: "ibv_reg_mr", Err: verbs.ENOMEM, Count: 1})
		_, err := sc.RegMr(unsafe.Pointer(&m[0]), len(m), nccl.PtrHost)
		assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
		assert.ErrorContains(t, err, "on simA_0:1 failed")
		assert.ErrorContains(t, err, "errno 12 (ENOMEM); check the locked-memory limit (ulimit -l unlimited")

		f.InjectCallFault(softnic.CallFault{Device: "simA_0", Call: "ibv_reg_mr", Err: verbs.EFAULT, Count: 1})
		_, err = sc.RegMr(unsafe.Pointer(&m[0]), len(m), nccl.PtrHost)
		assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
		assert.ErrorContains(t, err, "errno 14 (EFAULT)")
		assert.ErrorContains(t, err, "not memory this process can pin")
		assert.NotContains(t, err.Error(), "locked-memory", "EFAULT is not the memlock limit")
		assert.NotContains(t, err.Error(), "unknown")
		assert.Equal(t, base, f.Device("simA_0").MRCount(), "a failed registration leaves nothing registered")

		mh, err := sc.RegMr(unsafe.Pointer(&m[0]), len(m), nccl.PtrHost)
		require.NoError(t, err, "the comm is unaffected by a failed registration")
		require.NoError(t, sc.DeregMr(mh))
	})
	for _, dev := range []string{"simA_0", "simB_0"} {
		t.Run("set-up on "+dev, func(t *testing.T) {
			setEnv(t)
			f, a, b := twoHosts(t, softnic.DeviceConfig{})
			f.InjectCallFault(softnic.CallFault{Device: dev, Call: "ibv_reg_mr", Err: verbs.ENOMEM, Count: 1})
			l, h := listenOn(t, b, 0)
			var cerr, aerr error
			cdone, adone := false, false
			within(t, "both ends of the set-up fail", func() (bool, error) {
				if !cdone {
					sc, err := a.t.Connect(0, h, nccl.ConnectOptions{TrafficClass: nccl.TrafficClassUndef})
					require.Nil(t, sc)
					cerr, cdone = err, err != nil
				}
				if !adone {
					rc, err := l.Accept()
					require.Nil(t, rc)
					aerr, adone = err, err != nil
				}
				return cdone && adone, nil
			})
			failed := cerr
			if dev == "simB_0" {
				failed = aerr
			}
			assert.Equal(t, nccl.SystemError, nccl.ResultOf(failed))
			assert.ErrorContains(t, failed, "on "+dev+":1: ")
			assert.ErrorContains(t, failed, "errno 12 (ENOMEM); check the locked-memory limit (ulimit -l unlimited")
			for _, d := range []string{"simA_0", "simB_0"} {
				assert.Zero(t, f.Device(d).QPCount(), "QPs left on %s", d)
				assert.Zero(t, f.Device(d).MRCount(), "MRs left on %s", d)
			}
		})
	}
}

// The GPU-direct flush is an RDMA READ through a QP connected to itself:
// this rank's NIC reads this rank's receive buffer. When it completes with
// an error, the WARN blamed the peer ("got completion from peer <p> ...:
// the peer stopped acknowledging: it died" for RETRY_EXC_ERR, "the peer
// rejected the RDMA access ... its buffer was deregistered" for
// REM_ACCESS_ERR), sending the user to a healthy host. It must say that the
// local flush failed and why, keep NCCL's ncclRemoteError, fail the other
// requests of the comm, leave other comms on the device alone, and release
// everything at close.
func TestFlushCompletionErrorDoesNotBlameThePeer(t *testing.T) {
	for _, c := range []struct {
		status verbs.WCStatus
		hint   string
	}{
		{verbs.WCRetryExcErr, "the port lost its link or its path"},
		{verbs.WCRemAccessErr, "deregistered while the receive or flush was in flight"},
	} {
		t.Run(c.status.String(), func(t *testing.T) {
			setEnv(t, "NCCL_GO_IB_FORCE_FLUSH", "1")
			f, a, b := twoHosts(t, softnic.DeviceConfig{})
			sc, rc := connectPair(t, a, 0, b, 0)
			sc2, rc2 := connectPair(t, a, 0, b, 0)
			transfer(t, sc, rc, []int{100}, []int{100})
			rb := newBuf(t, rc, 4096, 0)
			pending, err := rc.Irecv([]nccl.RecvBuffer{{Data: rb.ptr(), Size: 4096, MH: rb.mh}})
			require.NoError(t, err)

			f.InjectFault(softnic.Fault{Device: "simB_0", Ops: []verbs.Opcode{verbs.WrRDMARead}, Status: c.status, Count: 1})
			fr, err := rc.Iflush([]nccl.RecvBuffer{{Data: rb.ptr(), Size: 100, MH: rb.mh}})
			require.NoError(t, err)
			require.NotEqual(t, nccl.NoRequest, fr)
			var ferr error
			within(t, "flush fails", func() (bool, error) {
				_, ferr = rc.Test(fr, nil)
				return ferr != nil, nil
			})
			assert.Equal(t, nccl.RemoteError, nccl.ResultOf(ferr), "as NCCL's net_ib for any error completion")
			assert.ErrorContains(t, ferr, "flush (loopback RDMA READ) on simB_0:1 failed with status "+c.status.String())
			w := warnLines(b.log)
			assert.Contains(t, w, "GPU-direct flush of a receive from "+rc.peer+" failed: the loopback RDMA READ on simB_0:1 completed with status="+c.status.String())
			assert.Contains(t, w, "not the peer")
			assert.Contains(t, w, c.hint)
			assert.NotContains(t, w, "the peer stopped acknowledging")
			assert.NotContains(t, w, "the peer rejected")

			_, err = rc.Test(pending, make([]int, 1))
			assert.Equal(t, nccl.RemoteError, nccl.ResultOf(err), "the comm's other requests fail too")

			out, _ := transfer(t, sc2, rc2, []int{100}, []int{100})
			assert.Equal(t, pattern(100, 0), out[0][:100], "another connection on the device is unaffected")

			for _, c := range []interface{ Close() error }{sc, rc, sc2, rc2} {
				require.NoError(t, c.Close())
			}
			for _, d := range []string{"simA_0", "simB_0"} {
				assert.Zero(t, f.Device(d).QPCount(), "QPs left on %s", d)
			}
		})
	}
}

// A QP's and a CQ's queues are memory the provider allocates and the kernel
// pins, charged to the locked-memory limit: ENOMEM from ibv_create_qp or
// ibv_create_cq is that limit far more often than the device's max_qp, which
// was the only hint ("max_qp 131072 reached?") and none for a CQ.
func TestCreateQueueFailureNamesTheLockedMemoryLimit(t *testing.T) {
	for _, call := range []string{"ibv_create_qp", "ibv_create_cq"} {
		t.Run(call, func(t *testing.T) {
			setEnv(t)
			f, a, b := twoHosts(t, softnic.DeviceConfig{})
			f.InjectCallFault(softnic.CallFault{Device: "simA_0", Call: call, Err: verbs.ENOMEM, Count: 1})
			l, h := listenOn(t, b, 0)
			var cerr error
			within(t, "the connect fails", func() (bool, error) {
				sc, err := a.t.Connect(0, h, nccl.ConnectOptions{TrafficClass: nccl.TrafficClassUndef})
				require.Nil(t, sc)
				_, _ = l.Accept()
				cerr = err
				return err != nil, nil
			})
			assert.Equal(t, nccl.SystemError, nccl.ResultOf(cerr))
			assert.ErrorContains(t, cerr, call)
			assert.ErrorContains(t, cerr, "errno 12 (ENOMEM); check the locked-memory limit (ulimit -l unlimited")
		})
	}
}
