package socket

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/internal/testhook"
)

// The OS's own bounds on threads: RLIMIT_NPROC (ulimit -u, counted over every
// task of the user) and a cgroup's pids.max (a container's or a Kubernetes
// pod's pids limit). When the Go runtime cannot create a thread it aborts the
// whole process ("runtime/cgo: pthread_create failed: Resource temporarily
// unavailable", SIGABRT): nothing the host can catch. Stream helpers are the
// only threads the plugin starts in proportion to its connections, so the
// budget gives them only what these limits leave, minus helperThreadReserve
// for the host's own threads and the runtime's.

// helperThreadReserve is the number of threads the helpers leave free under a
// limit: the host's threads, NCCL's, and the Ms the Go runtime may still add.
const helperThreadReserve = 64

// threadRoom is how many more threads this process may start under the
// limits it has, and which limit that is; limited is false when neither
// RLIMIT_NPROC nor a cgroup pids.max applies.
var threadRoom = testhook.New(osThreadRoom)

// getuid is the process's uid; cgroupRoot and procRoot are where the cgroup
// hierarchies and procfs are mounted (tests point them at fixture trees).
var (
	getuid     = testhook.New(os.Getuid)
	cgroupRoot = testhook.New("/sys/fs/cgroup")
	procRoot   = testhook.New("/proc")
)

func osThreadRoom() (room int, why string, limited bool) {
	if r, w, ok := nprocRoom(); ok {
		room, why, limited = r, w, true
	}
	if r, w, ok := pidsRoom(); ok && (!limited || r < room) {
		room, why, limited = r, w, true
	}
	return room, why, limited
}

// nprocRoom: RLIMIT_NPROC applies to tasks of the real user, and not to the
// host's root (the kernel exempts the initial user namespace's root and
// CAP_SYS_RESOURCE / CAP_SYS_ADMIN there; a non-root process with one of
// those is treated as limited, the safe side). Root in a user namespace
// (rootless podman, an unprivileged LXC container) is an ordinary user to
// the kernel, and its ulimit -u applies.
func nprocRoom() (int, string, bool) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NPROC, &lim); err != nil || lim.Cur == unix.RLIM_INFINITY {
		return 0, "", false
	}
	uid := getuid.Get()()
	if uid == 0 && rootIsHostRoot() {
		return 0, "", false
	}
	return nprocRoomFor(int(min(lim.Cur, 1<<31)), uid)
}

// rootIsHostRoot reports whether this process's uid 0 is the host's root:
// its user namespace maps 0 to 0 (the initial namespace reads
// "0 0 4294967295"). Without the file (no user namespaces) it is.
func rootIsHostRoot() bool {
	b, err := os.ReadFile(filepath.Join(procRoot.Get(), "self", "uid_map"))
	if err != nil {
		return true
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "0" {
			return f[1] == "0"
		}
	}
	return false
}

// nprocRoomFor is nprocRoom for a user uid under a limit of limit tasks.
func nprocRoomFor(limit, uid int) (int, string, bool) {
	// Distributions set a finite ulimit -u for every user (Debian and Ubuntu
	// from the RAM size, some 100,000s), so this runs for most jobs, once per
	// connection, and NCCL opens hundreds: the host's thread count, one read,
	// bounds the user's from above, and when even it leaves room for every
	// helper the process may keep, the scan of /proc is not needed.
	if total, ok := systemThreads(); ok && limit-total >= helperThreadReserve+maxHelpers {
		return limit - total, fmt.Sprintf("ulimit -u (RLIMIT_NPROC) is %d and the host runs %d threads", limit, total), true
	}
	used := userTasks(uid)
	return limit - used, fmt.Sprintf("ulimit -u (RLIMIT_NPROC) is %d and the user runs %d threads", limit, used), true
}

// systemThreads is the number of threads on the host (the fourth field of
// /proc/loadavg, "running/total").
func systemThreads() (int, bool) {
	b, err := os.ReadFile(filepath.Join(procRoot.Get(), "loadavg"))
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) < 4 {
		return 0, false
	}
	_, total, ok := strings.Cut(f[3], "/")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(total)
	return n, err == nil
}

// userTasks counts the threads of every process the user owns (each counts
// against RLIMIT_NPROC). Read at connection set-up, never on the data path.
func userTasks(uid int) int {
	ents, err := os.ReadDir(procRoot.Get())
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procRoot.Get(), e.Name(), "status"))
		if err != nil {
			continue
		}
		var owner, threads = -1, 0
		for _, line := range bytes.Split(b, []byte{'\n'}) {
			if f := bytes.Fields(line); len(f) >= 2 {
				switch string(f[0]) {
				case "Uid:":
					owner, _ = strconv.Atoi(string(f[1]))
				case "Threads:":
					threads, _ = strconv.Atoi(string(f[1]))
				}
			}
		}
		if owner == uid {
			n += threads
		}
	}
	return n
}

// pidsRoom: the smallest pids.max - pids.current of this process's cgroup
// and its ancestors (a limit on any of them applies), in the cgroup v2
// hierarchy ("0::" in /proc/self/cgroup) and in a cgroup v1 pids hierarchy
// ("<n>:pids:", mounted at cgroupRoot/pids; a v1 or hybrid host, where a
// container's pids limit lives there). Without a cgroup namespace the path
// is the host's while the container has its own cgroup mounted at the
// hierarchy's root: the walk up to that root finds it.
func pidsRoom() (int, string, bool) {
	b, err := os.ReadFile(filepath.Join(procRoot.Get(), "self", "cgroup"))
	if err != nil {
		return 0, "", false
	}
	room, why, limited, root := 0, "", false, cgroupRoot.Get()
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		var base string
		switch {
		case f[0] == "0" && f[1] == "":
			base = root
		case slices.Contains(strings.Split(f[1], ","), "pids"):
			base = filepath.Join(root, f[1])
		default:
			continue
		}
		if r, w, ok := pidsRoomUnder(base, f[2]); ok && (!limited || r < room) {
			room, why, limited = r, w, true
		}
	}
	return room, why, limited
}

// pidsRoomUnder is pidsRoom for one hierarchy mounted at base, the process's
// cgroup being rel in it.
func pidsRoomUnder(base, rel string) (int, string, bool) {
	room, why, limited := 0, "", false
	for dir := filepath.Join(base, rel); ; dir = filepath.Dir(dir) {
		if max, cur, ok := cgroupPids(dir); ok && (!limited || max-cur < room) {
			room, limited = max-cur, true
			why = fmt.Sprintf("the cgroup %s has pids.max %d with %d in use", dir, max, cur)
		}
		if dir == base || len(dir) <= len(base) {
			break
		}
	}
	return room, why, limited
}

// cgroupPids reads a cgroup's pids.max and pids.current; ok is false when it
// has no limit of its own ("max", or no pids controller there).
func cgroupPids(dir string) (max, cur int, ok bool) {
	b, err := os.ReadFile(filepath.Join(dir, "pids.max"))
	if err != nil {
		return 0, 0, false
	}
	max, err = strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil { // "max"
		return 0, 0, false
	}
	return max, readInt(filepath.Join(dir, "pids.current")), true
}

func readInt(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}
