package socket

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Each stream helper holds an OS thread while its connection is open, and the
// Go runtime aborts the process past 10,000 threads: without a process-wide
// budget, a job with a few thousand connection ends at the default 4 helpers
// each was killed by its network plugin (measured: 152 ends with 64 helpers
// each held 9,626 threads). Connections past the budget get fewer helpers or
// none, still move their data, and give theirs back when they close.
func TestHelperBudgetBoundsTheProcess(t *testing.T) {
	old := helperBudget.limit
	helperBudget.limit = 6
	helperBudget.warned.Store(false)
	t.Cleanup(func() { helperBudget.limit = old; helperBudget.warned.Store(false) })
	require.Zero(t, helperBudget.used.Load(), "helpers left over by an earlier test")
	withEnv(t, map[string]string{envNThreads: "4", envHelpers: "4", envInline: "0", envIdleInline: "0"})
	log := &captureLog{}
	tr := initLoopback(t, log)

	s1, r1 := pair(t, tr)
	assert.Equal(t, 6, len(s1.helpers)+len(r1.helpers), "the first connection takes the whole budget of 6")
	assert.Equal(t, int64(6), helperBudget.used.Load())

	s2, r2 := pair(t, tr)
	assert.Zero(t, len(s2.helpers)+len(r2.helpers), "the budget is spent")
	exchange(t, s2, r2, 4<<20) // striped over 4 streams, all moved by NCCL's thread
	exchange(t, s1, r1, 4<<20)
	assert.Equal(t, 1, strings.Count(log.String(), "stream helpers, the most it keeps"), log.String())

	require.NoError(t, s1.Close())
	require.NoError(t, r1.Close())
	assert.Equal(t, int64(0), helperBudget.used.Load(), "closing gives the helpers back")
	s3, r3 := pair(t, tr)
	assert.Equal(t, 6, len(s3.helpers)+len(r3.helpers), "a later connection gets them again")
	exchange(t, s3, r3, 4<<20)
	require.NoError(t, s3.Close())
	require.NoError(t, r3.Close())
	require.NoError(t, s2.Close())
	require.NoError(t, r2.Close())
	assert.Equal(t, int64(0), helperBudget.used.Load())
}

// Under RLIMIT_NPROC (ulimit -u) or a cgroup pids.max, the Go runtime aborts
// the host process (SIGABRT, "runtime/cgo: pthread_create failed") when a
// helper's thread cannot be created: through the C ABI, a non-root process
// under ulimit -u 12 with 4 striped streams was killed at its first transfer.
// Helpers take only what the limit leaves beyond helperThreadReserve, the
// data still moves, and a WARN names the limit once.
func TestHelpersStayUnderTheThreadLimit(t *testing.T) {
	require.Zero(t, helperBudget.used.Load(), "helpers left over by an earlier test")
	helperBudget.warnedRoom.Store(false)
	room := helperThreadReserve + 3
	threadRoom.Set(t, func() (int, string, bool) {
		return room, "ulimit -u (RLIMIT_NPROC) is 100 and the user runs 30 threads", true
	})
	t.Cleanup(func() { helperBudget.warnedRoom.Store(false) })
	withEnv(t, map[string]string{envNThreads: "4", envHelpers: "4", envInline: "0", envIdleInline: "0"})
	log := &captureLog{}
	tr := initLoopback(t, log)

	s1, r1 := pair(t, tr)
	assert.LessOrEqual(t, len(s1.helpers), 3, "one end takes at most the room left above the reserve")
	assert.LessOrEqual(t, len(r1.helpers), 3)
	room = helperThreadReserve
	s2, r2 := pair(t, tr)
	assert.Zero(t, len(s2.helpers)+len(r2.helpers), "no room above the reserve: no helpers")
	exchange(t, s2, r2, 4<<20)
	exchange(t, s1, r1, 4<<20)
	assert.Equal(t, 1, strings.Count(log.String(), "ulimit -u (RLIMIT_NPROC) is 100"), log.String())
	assert.Contains(t, log.String(), "NCCL_GO_SOCKET_HELPERS=0")
	for _, c := range []interface{ Close() error }{s1, r1, s2, r2} {
		require.NoError(t, c.Close())
	}
	assert.Equal(t, int64(0), helperBudget.used.Load())
}

// pidsRoom reads the tightest pids.max of the cgroup and its ancestors.
func TestPidsRoomReadsTheTightestCgroup(t *testing.T) {
	root, proc := fakeRoots(t)
	writeFixture(t, filepath.Join(proc, "self", "cgroup"), "0::/pod/ctr\n")
	for dir, v := range map[string][2]string{"pod": {"100", "90"}, "pod/ctr": {"max", "50"}} {
		writeFixture(t, filepath.Join(root, dir, "pids.max"), v[0]+"\n")
		writeFixture(t, filepath.Join(root, dir, "pids.current"), v[1]+"\n")
	}
	room, why, ok := pidsRoom()
	require.True(t, ok)
	assert.Equal(t, 10, room)
	assert.Contains(t, why, "pids.max 100 with 90 in use")
	require.NoError(t, os.WriteFile(filepath.Join(root, "pod", "pids.max"), []byte("max\n"), 0o644))
	_, _, ok = pidsRoom()
	assert.False(t, ok, "no limit anywhere")
}

// Most users have a finite ulimit -u (Debian and Ubuntu set one from the
// RAM size), so nprocRoom runs at every connection that wants helpers: when
// the host's whole thread count leaves room for every helper, it must not
// scan /proc (a read of every process's status file per connection).
func TestNprocRoomScansProcOnlyWhenTheLimitIsNear(t *testing.T) {
	_, proc := fakeRoots(t)
	writeFixture(t, filepath.Join(proc, "loadavg"), "0.10 0.20 0.30 2/500 1234\n")
	// One process of user 1000 with 30 threads, one of user 0 with 400.
	for pid, st := range map[string]string{"10": "Uid:\t1000\t1000\t1000\t1000\nThreads:\t30\n", "11": "Uid:\t0\t0\t0\t0\nThreads:\t400\n"} {
		writeFixture(t, filepath.Join(proc, pid, "status"), st)
	}
	room, why, ok := nprocRoomFor(100000, 1000)
	require.True(t, ok)
	assert.Equal(t, 100000-500, room, "a far limit is bounded by the host's threads, without a scan: %s", why)
	assert.Contains(t, why, "the host runs 500 threads")
	room, why, ok = nprocRoomFor(1200, 1000)
	require.True(t, ok)
	assert.Equal(t, 1200-30, room, "a near limit counts the user's own threads: %s", why)
	assert.Contains(t, why, "the user runs 30 threads")
}

func TestSystemThreadsReadsLoadavg(t *testing.T) {
	_, proc := fakeRoots(t)
	_, ok := systemThreads()
	assert.False(t, ok, "no loadavg")
	writeFixture(t, filepath.Join(proc, "loadavg"), "0.10 0.20 0.30 2/500 1234\n")
	n, ok := systemThreads()
	require.True(t, ok)
	assert.Equal(t, 500, n)
}

// On a cgroup v1 host (or a hybrid one, which has a "0::" line too, with no
// controller behind it) a container's pids limit is in the v1 pids hierarchy
// (/sys/fs/cgroup/pids), and without a cgroup namespace /proc/self/cgroup
// names the container's cgroup by its host path while the container sees its
// own cgroup mounted at the hierarchy's root: the search walks up to it.
// Reading only the "0::" line found no limit there, and the helpers went past
// a docker --pids-limit.
func TestPidsRoomReadsTheV1PidsHierarchy(t *testing.T) {
	root, proc := fakeRoots(t)
	require.NoError(t, os.MkdirAll(filepath.Join(root, "unified"), 0o755))
	// The container's own cgroup, mounted at the v1 hierarchy's root.
	writeFixture(t, filepath.Join(root, "pids", "pids.max"), "200\n")
	writeFixture(t, filepath.Join(root, "pids", "pids.current"), "150\n")
	for _, self := range []string{
		"12:pids:/docker/0123abcd\n4:memory:/docker/0123abcd\n1:name=systemd:/docker/0123abcd\n",                      // v1
		"12:pids:/docker/0123abcd\n4:memory:/docker/0123abcd\n1:name=systemd:/docker/0123abcd\n0::/docker/0123abcd\n", // hybrid
	} {
		writeFixture(t, filepath.Join(proc, "self", "cgroup"), self)
		room, why, ok := pidsRoom()
		require.True(t, ok, "a v1 pids limit was not found (%q)", self)
		assert.Equal(t, 50, room)
		assert.Contains(t, why, "pids.max 200 with 150 in use")
	}
	require.NoError(t, os.WriteFile(filepath.Join(root, "pids", "pids.max"), []byte("max\n"), 0o644))
	_, _, ok := pidsRoom()
	assert.False(t, ok, "no limit anywhere")
}

// RLIMIT_NPROC spares only the host's root: root in a user namespace
// (rootless podman, an unprivileged LXC container) is an ordinary user to
// the kernel, whose ulimit -u applies (RHEL's limits.d gives non-root users
// 4096). nprocRoom took uid 0 for the host's root and set no bound there.
func TestNprocRoomBoundsRootInAUserNamespace(t *testing.T) {
	var lim unix.Rlimit
	require.NoError(t, unix.Getrlimit(unix.RLIMIT_NPROC, &lim))
	if lim.Cur == unix.RLIM_INFINITY {
		// A finite but far limit: nothing this test does comes near it.
		far := unix.Rlimit{Cur: 1 << 30, Max: lim.Max}
		require.NoError(t, unix.Setrlimit(unix.RLIMIT_NPROC, &far))
		t.Cleanup(func() { _ = unix.Setrlimit(unix.RLIMIT_NPROC, &lim) })
	}
	_, proc := fakeRoots(t)
	getuid.Set(t, func() int { return 0 })
	writeFixture(t, filepath.Join(proc, "loadavg"), "0.10 0.20 0.30 2/500 1234\n")
	uidMap := filepath.Join(proc, "self", "uid_map")

	writeFixture(t, uidMap, "         0     100000      65536\n")
	_, why, ok := nprocRoom()
	assert.True(t, ok, "root of a user namespace is under ulimit -u")
	assert.Contains(t, why, "RLIMIT_NPROC")

	writeFixture(t, uidMap, "         0          0 4294967295\n")
	_, _, ok = nprocRoom()
	assert.False(t, ok, "the host's root is exempt")
}

// fakeRoots points cgroupRoot and procRoot at fresh fixture trees for the
// test and returns them.
func fakeRoots(t *testing.T) (cgroup, proc string) {
	t.Helper()
	cgroup, proc = t.TempDir(), t.TempDir()
	cgroupRoot.Set(t, cgroup)
	procRoot.Set(t, proc)
	return cgroup, proc
}

// writeFixture writes a fixture file, making its directory.
func writeFixture(t *testing.T, path, content string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
}
