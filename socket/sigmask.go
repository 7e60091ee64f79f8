package socket

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// A helper spends its life on its own thread, in poll(2) and send/recv, on a
// small goroutine stack. A signal delivered to that thread runs the host's
// handler there; a handler the host installed after loading us without
// SA_ONSTACK (a C/C++ profiler's SIGPROF with setitimer(ITIMER_PROF), say)
// then runs on the goroutine stack itself and writes its signal frame past
// the stack's end into whatever lies below: the process dies ("traceback did
// not unwind completely", SIGSEGV at PC 0) or a transfer fails. The Go
// runtime cannot help (os/signal: non-Go code must use SA_ONSTACK), but
// helpers are our threads: they block the host's asynchronous signals, so the
// kernel delivers process-directed ones (timers, kill) to the host's own
// threads. Not blocked: Go's preemption signal (SIGURG: the runtime's handler
// uses its signal stack), the synchronous faults, SIGPIPE (sends use
// MSG_NOSIGNAL; Go's handler forwards it), SIGCONT, and glibc's internal 32
// and 33 (SIGSETXID must reach every thread, or setuid(2) in the host hangs).

// hostSignals are the signals a helper's thread blocks.
var hostSignals = func() *unix.Sigset_t {
	var set unix.Sigset_t
	add := func(s unix.Signal) { set.Val[(s-1)/64] |= 1 << ((uint(s) - 1) % 64) }
	for _, s := range []unix.Signal{unix.SIGHUP, unix.SIGINT, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2,
		unix.SIGALRM, unix.SIGTERM, unix.SIGSTKFLT, unix.SIGCHLD, unix.SIGTSTP, unix.SIGTTIN, unix.SIGTTOU,
		unix.SIGXCPU, unix.SIGXFSZ, unix.SIGVTALRM, unix.SIGPROF, unix.SIGWINCH, unix.SIGIO, unix.SIGPWR} {
		add(s)
	}
	for s := unix.Signal(34); s <= 64; s++ { // SIGRTMIN (glibc) .. SIGRTMAX
		add(s)
	}
	return &set
}()

// blockHostSignals dedicates the calling goroutine's thread to it and blocks
// hostSignals there. The goroutine never unlocks: when it returns, the
// runtime ends the thread with its mask and whatever signal is pending on it
// (the runtime's first thread it parks for good instead), so no other
// goroutine ever runs with the mask, and restoring it can never deliver a
// pending signal onto a goroutine stack.
func blockHostSignals() {
	runtime.LockOSThread()
	_ = unix.PthreadSigmask(unix.SIG_BLOCK, hostSignals, nil) // EINVAL only for a bad how
}
