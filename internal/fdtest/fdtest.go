// Package fdtest runs tests out of file descriptors, as a process at scale
// under a low `ulimit -n` is: the transports' tests of what set-up does then.
package fdtest

import (
	"os"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// Starve lowers the soft open-files limit to just above the highest
// descriptor open now and fills every free number below it, so that the
// process's next descriptor fails with EMFILE; both are undone when the test
// ends. Tests that call it must not run in parallel with others.
func Starve(t testing.TB) {
	t.Helper()
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatalf("getrlimit: %v", err)
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("listing descriptors: %v", err)
	}
	top := 0
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil && n > top {
			top = n
		}
	}
	lim := old
	lim.Cur = uint64(top + 1)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatalf("setrlimit: %v", err)
	}
	var fill []int
	t.Cleanup(func() {
		for _, fd := range fill {
			unix.Close(fd)
		}
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
			t.Errorf("restoring the open-files limit: %v", err)
		}
	})
	for {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			if err != unix.EMFILE {
				t.Fatalf("filling the descriptor table: %v (want EMFILE)", err)
			}
			return
		}
		fill = append(fill, fd)
	}
}
