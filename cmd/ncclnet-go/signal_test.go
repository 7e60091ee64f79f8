package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// proc is one process of /proc: its parent and start time (which tells a
// process from a later one with the same pid).
type proc struct {
	pid, ppid int
	start     string
	state     string
	comm      string
}

func procs() map[int]proc {
	out := map[int]proc{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, ok := readProc(pid); ok {
			out[pid] = p
		}
	}
	return out
}

func readProc(pid int) (proc, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return proc{}, false
	}
	s := string(b)
	i, j := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if i < 0 || j < i {
		return proc{}, false
	}
	f := strings.Fields(s[j+1:]) // state ppid pgrp ... starttime is field 22 of stat, f[19]
	if len(f) < 20 {
		return proc{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	return proc{pid: pid, ppid: ppid, start: f[19], state: f[0], comm: s[i+1 : j]}, true
}

// descendants are root's children, their children, and so on.
func descendants(root int) []proc {
	all := procs()
	var out []proc
	seen := map[int]bool{root: true}
	for grew := true; grew; {
		grew = false
		for _, p := range all {
			if seen[p.ppid] && !seen[p.pid] {
				seen[p.pid] = true
				out = append(out, p)
				grew = true
			}
		}
	}
	return out
}

// stillThere says which of ps still exist (same pid, same start time).
func stillThere(ps []proc) []string {
	var left []string
	for _, p := range ps {
		if q, ok := readProc(p.pid); ok && q.start == p.start {
			left = append(left, fmt.Sprintf("pid %d (%s, state %s, parent %d)", q.pid, q.comm, q.state, q.ppid))
		}
	}
	return left
}

// SIGTERM (systemd stop, kubelet, `kill PID`) or Ctrl-C in the middle of a
// transfer stops `ncclnet-go selftest` at once: it exits with 128 + the
// signal's number, says where the test was, and leaves none of the helper's
// processes behind (running, or zombies for a PID 1 that may never reap
// them). So does a second signal right after the first, and a helper that
// does not answer (stopped with SIGSTOP here): after the grace period, or at
// once on a second signal, its whole process group is killed and reaped.
func TestSelftestStopsOnSignal(t *testing.T) {
	lib, helper := built(t)
	bin := builtCommand(t)
	conf := filepath.Join(t.TempDir(), "nccl.conf") // not the host's ~/.nccl.conf
	require.NoError(t, os.WriteFile(conf, nil, 0o644))
	const says = "ncclnet-go selftest: INTERRUPTED by %s after "
	for _, c := range []struct {
		name        string
		sigs        []syscall.Signal
		gap         time.Duration // between the signals
		stopHelper  bool          // SIGSTOP the helper first
		status      int
		says, where bool // the INTERRUPTED line, the step line
	}{
		{"SIGTERM", []syscall.Signal{syscall.SIGTERM}, 0, false, 143, true, true},
		{"SIGINT", []syscall.Signal{syscall.SIGINT}, 0, false, 130, true, true},
		{"two SIGTERMs", []syscall.Signal{syscall.SIGTERM, syscall.SIGTERM}, 0, false, 143, false, false}, // either stops it
		{"SIGTERM, helper not answering", []syscall.Signal{syscall.SIGTERM}, 0, true, 143, true, false},
		// The second signal comes while the first waits for the helper: it
		// does not wait.
		{"second SIGTERM, helper not answering", []syscall.Signal{syscall.SIGTERM, syscall.SIGTERM}, 300 * time.Millisecond, true, 143, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			// About 4 TB each way: it runs until it is stopped.
			cmd := exec.Command(bin, "selftest", "--plugin", lib, "--helper", helper, "--transport", "socket",
				"--size", "4M", "--iters", "1000000", "--lat-iters", "10", "--timeout", "120s")
			cmd.Env = append(os.Environ(), "NCCL_SOCKET_IFNAME=lo", "NCCL_CONF_FILE="+conf)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			// Its own group, so that this test can clean up whatever a
			// broken command leaves.
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			require.NoError(t, cmd.Start())
			var seen []proc
			t.Cleanup(func() {
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				for _, p := range seen {
					if q, ok := readProc(p.pid); ok && q.start == p.start {
						_ = syscall.Kill(p.pid, syscall.SIGKILL)
					}
				}
			})
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()

			// Wait for the helper and its two processes.
			deadline := time.Now().Add(60 * time.Second)
			for {
				seen = descendants(cmd.Process.Pid)
				if len(seen) >= 3 {
					break
				}
				select {
				case err := <-done:
					t.Fatalf("selftest ended before it was signalled (%v):\n%s%s", err, stdout.String(), stderr.String())
				case <-time.After(50 * time.Millisecond):
				}
				require.True(t, time.Now().Before(deadline), "the helper did not start its two processes within 60 s: %v", seen)
			}
			time.Sleep(500 * time.Millisecond) // into the transfer
			seen = descendants(cmd.Process.Pid)

			if c.stopHelper {
				for _, p := range seen {
					if p.ppid == cmd.Process.Pid {
						require.NoError(t, syscall.Kill(p.pid, syscall.SIGSTOP))
					}
				}
			}
			start, last := time.Now(), time.Now()
			for i, s := range c.sigs {
				if i > 0 {
					time.Sleep(c.gap)
				}
				last = time.Now()
				require.NoError(t, cmd.Process.Signal(s))
			}
			// Prompt: the helper stops its processes within
			// milliseconds; one that does not answer gets helperGrace.
			const bound = 10 * time.Second
			select {
			case <-done:
			case <-time.After(bound):
				t.Fatalf("still running %v after %v; output so far:\n%s", bound, c.sigs, stdout.String())
			}
			t.Logf("exited %v after the first signal, %v after the last: %s", time.Since(start).Round(time.Millisecond),
				time.Since(last).Round(time.Millisecond), strings.TrimSpace(stdout.String()))
			assert.Equal(t, c.status, cmd.ProcessState.ExitCode(), "exit status after %v", c.sigs)
			name := map[syscall.Signal]string{syscall.SIGTERM: "SIGTERM", syscall.SIGINT: "SIGINT"}[c.sigs[0]]
			if c.says {
				assert.Contains(t, stdout.String(), fmt.Sprintf(says, name))
			}
			if c.where {
				assert.Regexp(t, `\n  step      process 0: .+; process 1: .+\n$`, stdout.String(), "where the two processes were")
			}
			if c.gap > 0 {
				assert.Less(t, time.Since(last), helperGrace-c.gap, "the second signal does not wait for the first one's grace period")
			}
			// Nothing of the helper is left: not running, not a zombie
			// waiting to be reaped (by the command or, orphaned, by init).
			var left []string
			for wait := time.Now().Add(time.Second); ; time.Sleep(50 * time.Millisecond) {
				if left = stillThere(seen); len(left) == 0 || time.Now().After(wait) {
					break
				}
			}
			assert.Empty(t, left, "processes of the helper left after ncclnet-go exited (seen before the signal: %v)", seen)
		})
	}
}
