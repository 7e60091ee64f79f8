package socket

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// blockedBy returns, for each thread of this process, the signals it blocks
// (SigBlk of /proc/self/task/TID/status).
func blockedBy(t *testing.T) map[int]uint64 {
	t.Helper()
	tasks, err := filepath.Glob("/proc/self/task/*/status")
	require.NoError(t, err)
	out := map[int]uint64{}
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread ended meanwhile
		}
		tid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "SigBlk:"); ok {
				m, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
				require.NoError(t, err, line)
				out[tid] = m
			}
		}
	}
	return out
}

func sigBit(s unix.Signal) uint64 { return 1 << (uint(s) - 1) }

// shielded returns the threads that block what a helper's thread must block,
// and fails on one that also blocks what it must not.
func shielded(t *testing.T) map[int]bool {
	t.Helper()
	must := sigBit(unix.SIGPROF) | sigBit(unix.SIGALRM) | sigBit(unix.SIGUSR1) | sigBit(unix.SIGCHLD) | sigBit(unix.SIGWINCH)
	never := sigBit(unix.SIGURG) | sigBit(32) | sigBit(33)
	n := map[int]bool{}
	for tid, m := range blockedBy(t) {
		if m&sigBit(unix.SIGSEGV) != 0 {
			continue // the runtime blocks everything only while it starts or ends a thread
		}
		if m&must == must {
			require.Zero(t, m&never, "thread %d blocks %#x: Go's preemption or glibc's internal signals", tid, m&never)
			n[tid] = true
		}
	}
	return n
}

// A host's handler installed after we were loaded, without SA_ONSTACK (a
// profiler's SIGPROF driven by setitimer), runs on the stack of whatever
// thread the signal lands on; on a helper that is a small goroutine stack,
// and the signal frame overruns it (the process crashed, or a receive failed,
// in 3 of 3 runs of the C harness with helpers on; none with helpers off).
// So the helpers' threads block the host's asynchronous signals (and never
// serve another goroutine: the thread ends with its helper).
func TestHelperThreadsBlockTheHostsSignals(t *testing.T) {
	withEnv(t, fenceEnv)
	tr := initLoopback(t, &captureLog{})
	before := shielded(t) // helpers of earlier tests may still be ending
	s, r := pair(t, tr)
	require.Len(t, s.helpers, 2)
	require.Len(t, r.helpers, 2)
	want := len(s.helpers) + len(r.helpers)
	fresh := 0
	// Helpers start asynchronously: wait (bounded) for their threads.
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		fresh = 0
		for tid := range shielded(t) {
			if !before[tid] {
				fresh++
			}
		}
		if fresh >= want {
			break
		}
	}
	require.GreaterOrEqual(t, fresh, want, "new threads blocking the host's asynchronous signals with %d helpers running", want)
	require.NoError(t, s.Close())
	require.NoError(t, r.Close())
}
