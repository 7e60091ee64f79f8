package nccltest

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

func TestMemTransportConformance(t *testing.T) {
	Run(t, func() nccl.Transport { return &memTransport{} }, Options{MaxSize: 16 << 20})
}

// A transport may leave zero what nccl.Properties says the glue fills
// (PtrSupport, Speed, MaxRecvs); the suite must not fail it for that.
func TestZeroPropertyDefaultsConform(t *testing.T) {
	Run(t, func() nccl.Transport { return &memTransport{zeroDefaults: true} }, Options{MaxSize: 1 << 20})
}

// With Options.Register every buffer handed over lies in a live
// registration of its comm, and every registration is released by the end.
func TestRegisteredBuffers(t *testing.T) {
	tr := &memTransport{checkRegs: true}
	Run(t, func() nccl.Transport { return tr }, Options{MaxSize: 4 << 20, Register: true})
	tr.mu.Lock()
	defer tr.mu.Unlock()
	assert.Empty(t, tr.regs, "registrations the suite never released")
}

// faults maps a broken variant of memTransport to the subtest that must catch
// it and a phrase its failure must contain.
var faults = map[string]struct {
	mk      func() *memTransport
	subtest string
	want    string
	run     string // the subtests to run (default: subtest alone)
}{
	"blockConnect": {func() *memTransport { return &memTransport{blockConnect: true} }, "ConnectAlternating", "inside transport call Connect", ""},
	"overrun":      {func() *memTransport { return &memTransport{overrun: true} }, "Truncation", "past the receive buffer", ""},
	"ignoreTrunc":  {func() *memTransport { return &memTransport{ignoreTrunc: true} }, "Truncation", "instead of failing with InvalidUsage", ""},
	"fifoBroken":   {func() *memTransport { return &memTransport{fifoBroken: true} }, "GroupedDistinctTags", "grouped, distinct tags", ""},
	"hangClose":    {func() *memTransport { return &memTransport{hangClose: true} }, "CloseOutstanding", "did not return within", ""},
	"refuseDereg0": {func() *memTransport { return &memTransport{refuseDereg0: true} }, "RegMr", "DeregMr(0)", ""},
	"wrongSize":    {func() *memTransport { return &memTransport{wrongSizeSent: true} }, "Sizes", "bytes sent", ""},
	"leakSendSlots": {func() *memTransport { return &memTransport{leakSendSlots: true} }, "LongLivedComm",
		"did not complete before the deadline", ""},
	"leakGroupedRecv": {func() *memTransport { return &memTransport{leakGroupedRecv: true} }, "LongLivedComm",
		"did not complete before the deadline", ""},
	"groupedTrunc": {func() *memTransport { return &memTransport{groupedTrunc: true} }, "Truncation",
		"into receive buffers of [64 4096] bytes: the receive completed", ""},
	"lateWriteOnClose": {func() *memTransport { return &memTransport{lateWriteOnClose: true} }, "CloseOutstanding",
		"was written after its comm was closed", ""},
	"lateWriteDereg": {func() *memTransport { return &memTransport{lateWriteDereg: true} }, "DeregMrFence",
		"the receive buffer was written after DeregMr returned", ""},
	"leakGoroutine": {func() *memTransport { return &memTransport{leakGoroutine: true} }, "GoroutinesAfterFinalize",
		"Close and Finalize must stop what the transport started", "ConnectAlternating|Finalize|GoroutinesAfterFinalize"},
	"ignorePeerClose": {func() *memTransport { return &memTransport{ignorePeerClose: true} }, "SenderClosedFailsPending",
		"not done and no error", ""},
	"keepBufs": {func() *memTransport { return &memTransport{keepBufs: true} }, "GroupedDistinctTags", "if Irecv keeps its bufs slice", ""},
	"reuseID":  {func() *memTransport { return &memTransport{reuseID: true} }, "Sizes", "which send 0 still holds", ""},
	"slowTest": {func() *memTransport { return &memTransport{slowTest: true} }, "InFlight", "calls took 1ms or more", ""},
	"onceGlobal": {func() *memTransport { return &memTransport{onceGlobal: true} }, "InitAgainAfterFinalize",
		"fabric already shut down", "Finalize|InitAgainAfterFinalize"},
}

// TestFaultyTransport runs the suite on one broken transport when re-executed
// by TestSuiteCatchesFaults; on its own it is skipped.
func TestFaultyTransport(t *testing.T) {
	name := os.Getenv("NCCLTEST_FAULT")
	if name == "" {
		t.Skip("only runs re-executed by TestSuiteCatchesFaults")
	}
	f := faults[name]
	Run(t, func() nccl.Transport { return f.mk() }, Options{MaxSize: 1 << 20, Timeout: 10 * time.Second, CloseTimeout: 2 * time.Second})
}

// TestSuiteCatchesFaults checks that the suite can fail: each broken
// transport must make its subtest fail with a message saying what is wrong
// (and a hang must be reported, not hang the test binary).
func TestSuiteCatchesFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("re-executes the test binary once per fault")
	}
	exe, err := os.Executable()
	require.NoError(t, err)
	for name, f := range faults {
		t.Run(name, func(t *testing.T) {
			// Parallel: the hang cases wait out their whole deadline.
			t.Parallel()
			run := f.run
			if run == "" {
				run = f.subtest
			}
			cmd := exec.Command(exe, "-test.run=^TestFaultyTransport$/^("+run+")$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "NCCLTEST_FAULT="+name)
			out, err := cmd.CombinedOutput()
			require.Error(t, err, "the suite passed a transport with fault %s:\n%s", name, out)
			assert.Contains(t, string(out), "--- FAIL: TestFaultyTransport/"+f.subtest)
			assert.Contains(t, string(out), f.want)
		})
	}
}
