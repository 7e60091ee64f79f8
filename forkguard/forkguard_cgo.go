//go:build cgo

package forkguard

/*
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

// Indexed by descriptor; 0: not ours. Descriptors at or above the bound are
// not tracked (their children keep them, as without this package). The
// array is in .bss: only the pages of descriptors used are ever touched.
#define FG_MAX (1 << 20)
static _Atomic uint64_t fg_ino[FG_MAX];
static _Atomic int fg_top; // highest tracked descriptor + 1

// Runs in the child only, single-threaded, before fork returns there: only
// async-signal-safe calls.
static void fg_child(void) {
	int top = atomic_load(&fg_top);
	for (int fd = 0; fd < top; fd++) {
		uint64_t ino = atomic_load_explicit(&fg_ino[fd], memory_order_relaxed);
		if (ino == 0) continue;
		struct stat st;
		if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) && (uint64_t)st.st_ino == ino) close(fd);
		atomic_store_explicit(&fg_ino[fd], 0, memory_order_relaxed);
	}
}

static int fg_install(void) { return pthread_atfork(NULL, NULL, fg_child); }

// 0: tracked; 1: not a socket or out of range; -errno: fstat failed.
static int fg_track(int fd) {
	if (fd < 0 || fd >= FG_MAX) return 1;
	struct stat st;
	if (fstat(fd, &st) != 0) return -1;
	if (!S_ISSOCK(st.st_mode)) return 1;
	atomic_store(&fg_ino[fd], (uint64_t)st.st_ino);
	int top = atomic_load(&fg_top);
	while (fd + 1 > top && !atomic_compare_exchange_weak(&fg_top, &top, fd + 1)) {
	}
	return 0;
}

static void fg_untrack(int fd) {
	if (fd >= 0 && fd < FG_MAX) atomic_store(&fg_ino[fd], 0);
}

static int fg_tracked(int fd) { return fd >= 0 && fd < FG_MAX && atomic_load(&fg_ino[fd]) != 0; }

// For tests: fork; the child reports for each descriptor whether it is still
// open (1) or not (0) through a pipe and exits. Returns 0, or -1 when fork
// or the pipe failed.
static int fg_probe_child(const int* fds, int n, unsigned char* open_out) {
	int p[2];
	if (pipe(p) != 0) return -1;
	pid_t pid = fork();
	if (pid < 0) { close(p[0]); close(p[1]); return -1; }
	if (pid == 0) {
		for (int i = 0; i < n; i++) {
			struct stat st;
			unsigned char o = fstat(fds[i], &st) == 0;
			if (write(p[1], &o, 1) != 1) _exit(2);
		}
		_exit(0);
	}
	close(p[1]);
	int got = 0;
	while (got < n) {
		ssize_t k = read(p[0], open_out + got, (size_t)(n - got));
		if (k <= 0) break;
		got += (int)k;
	}
	close(p[0]);
	int status = -1;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
	}
	return got == n && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

var install struct {
	once sync.Once
	err  error
}

func installed() error {
	install.once.Do(func() {
		if rc := C.fg_install(); rc != 0 {
			install.err = fmt.Errorf("pthread_atfork: error %d", int(rc))
		}
	})
	return install.err
}

func track(fd int) error {
	if err := installed(); err != nil {
		return err
	}
	if rc := C.fg_track(C.int(fd)); rc < 0 {
		return fmt.Errorf("fstat of descriptor %d failed", fd)
	}
	return nil
}

func untrack(fd int) { C.fg_untrack(C.int(fd)) }

func tracked(fd int) bool { return C.fg_tracked(C.int(fd)) != 0 }

// OpenInChild forks (from C, as a host process would) and reports which of
// fds the child still has open once fork has returned there. For tests.
func OpenInChild(fds []int) ([]bool, error) {
	if len(fds) == 0 {
		return nil, nil
	}
	cfds := make([]C.int, len(fds))
	for i, fd := range fds {
		cfds[i] = C.int(fd)
	}
	out := make([]C.uchar, len(fds))
	if C.fg_probe_child(&cfds[0], C.int(len(fds)), (*C.uchar)(unsafe.Pointer(&out[0]))) != 0 {
		return nil, fmt.Errorf("fork probe failed")
	}
	res := make([]bool, len(fds))
	for i := range out {
		res[i] = out[i] != 0
	}
	return res, nil
}
