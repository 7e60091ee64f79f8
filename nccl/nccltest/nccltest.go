package nccltest

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Options tunes the suite. The zero value is a sensible default for a
// transport over a local fabric (loopback TCP, shared memory, a local HCA).
type Options struct {
	// Dev is the device the suite listens and connects on.
	Dev int
	// MaxSize is the largest message sent (default 64 MiB). NCCL sends up to
	// nccl.MaxNetSize (1 GiB) with registered buffers; raise it to that to
	// check the full range (the suite then needs about 2.5 GiB of memory).
	MaxSize int
	// Timeout bounds each subtest, set-up and teardown included (default 60s).
	// A subtest still running at the deadline fails as a hang, with the
	// transport call it was inside and every goroutine's stack.
	Timeout time.Duration
	// CloseTimeout bounds one Close with requests outstanding (default 5s).
	CloseTimeout time.Duration
	// Log is handed to Init. By default WARN and INFO lines go to the test log.
	Log nccl.Logger
	// RequireDevice makes an Init error wrapping nccl.ErrNoDevice a failure.
	// By default the suite is skipped, with the reason, on a host without the
	// transport's hardware.
	RequireDevice bool
	// Skip names subtests not to run (for example "Truncation" for a transport
	// under development); each skip is reported with the test output.
	Skip []string
	// Register registers every buffer with RegMr before handing it to
	// Isend or Irecv, and deregisters it once its request completed (or
	// before its comm closes), as NCCL's proxy does for a transport whose
	// properties lack nothing but host pointers: RDMA transports need it.
	// Without it buffers carry MemHandle 0, which a transport over sockets
	// or shared memory accepts.
	Register bool
	// PostsDoTheNICsWork turns off the data-path timing check, for a
	// provider that does a NIC's work inside the post itself: Soft-RoCE's
	// ibv_post_send copies and checksums the whole message in the system
	// call (about 1 ms per 64 KiB under emulation), which is not a wait the
	// transport could avoid. Everywhere else a slow Isend, Irecv or Test is a
	// transport that blocks.
	PostsDoTheNICsWork bool
}

func (o *Options) fill() {
	if o.MaxSize <= 0 {
		o.MaxSize = 64 << 20
	}
	if o.MaxSize > nccl.MaxNetSize {
		o.MaxSize = nccl.MaxNetSize
	}
	if o.Timeout <= 0 {
		o.Timeout = 60 * time.Second
	}
	if o.CloseTimeout <= 0 {
		o.CloseTimeout = 5 * time.Second
	}
}

// Run runs the conformance suite as subtests of t. newTransport makes a fresh,
// uninitialised transport; the suite initialises one, runs every subtest on it,
// and finalises it at the end (NCCL too initialises a transport once per
// process). A last subtest checks that Finalize returns.
func Run(t *testing.T, newTransport func() nccl.Transport, opts Options) {
	t.Helper()
	opts.fill()
	log := opts.Log
	var tl *testLogger
	if log == nil {
		tl = &testLogger{t: t}
		t.Cleanup(tl.stop)
		log = tl
	}
	goroutines := runtime.NumGoroutine()
	tr := newTransport()
	if tr == nil {
		t.Fatal("newTransport returned nil")
	}
	if err := tr.Init(nccl.InitContext{Log: log}); err != nil {
		if errors.Is(err, nccl.ErrNoDevice) && !opts.RequireDevice {
			t.Skipf("transport %s has no device on this host: %v", tr.Name(), err)
		}
		t.Fatalf("Init: %v", err)
	}
	s := &suite{tr: tr, opts: opts}
	for _, c := range cases {
		if s.skipped(c.name) {
			t.Run(c.name, func(t *testing.T) { t.Skip("skipped by Options.Skip") })
			continue
		}
		s.run(t, c.name, c.body)
	}
	s.run(t, "Finalize", func(h *subtest) {
		h.call("Finalize", func() { h.noError(tr.Finalize()) })
	})
	// The glue makes a new transport and initialises it again when NCCL
	// (2.28+) starts a communicator after the last one finalized.
	again := &suite{opts: opts}
	if s.skipped("InitAgainAfterFinalize") {
		t.Run("InitAgainAfterFinalize", func(t *testing.T) { t.Skip("skipped by Options.Skip") })
	} else {
		again.run(t, "InitAgainAfterFinalize", func(h *subtest) {
			again.tr = newTransport()
			var err error
			h.call("Init", func() { err = again.tr.Init(nccl.InitContext{Log: log}) })
			h.noError(err, "Init of a new transport after the first one was finalized (as the glue does for NCCL's next communicator)")
			if err != nil {
				return
			}
			p := h.connect()
			h.pump(h.newFlow("after a second Init", p, mixedGroups(4, 1)))
			h.closePair(p)
			h.call("Finalize", func() { h.noError(again.tr.Finalize()) })
		})
	}
	t.Run("GoroutinesAfterFinalize", func(t *testing.T) {
		// Goroutines end asynchronously; give them a moment. This subtest's
		// own goroutine is not the transport's.
		n := 0
		for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if n = runtime.NumGoroutine() - 1; n <= goroutines || time.Now().After(end) {
				break
			}
		}
		if n > goroutines {
			t.Errorf("%d goroutines before the transport was made, %d five seconds after its Finalize: Close and Finalize must stop what the transport started\n%s",
				goroutines, n, stack(true))
		}
	})
}

type suite struct {
	tr   nccl.Transport
	opts Options
}

func (s *suite) skipped(name string) bool {
	for _, n := range s.opts.Skip {
		if n == name {
			return true
		}
	}
	return false
}

// run executes body in its own goroutine under the deadline. Failures are
// recorded by the subtest handle and reported from the test goroutine, so
// a body abandoned after a hang can never touch a finished *testing.T.
func (s *suite) run(t *testing.T, name string, body func(h *subtest)) {
	t.Run(name, func(t *testing.T) {
		// The body's own waits give up a little before the hang timer, so a
		// transfer that stopped is reported with its state, not as a hang.
		h := &subtest{suite: s, deadline: time.Now().Add(s.opts.Timeout * 9 / 10)}
		h.op.Store(new(string))
		// Registered first, so it runs last: after every comm closed.
		h.defer_(h.freeAll)
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer h.cleanup()
			defer func() {
				if r := recover(); r != nil {
					h.errorf("panic: %v\n%s", r, stack(false))
				}
			}()
			body(h)
		}()
		timer := time.NewTimer(s.opts.Timeout)
		defer timer.Stop()
		select {
		case <-done:
			h.checkDataPathTiming()
		case <-timer.C:
			h.abandon()
			t.Errorf("hang: subtest still running after %v; it was inside %s\n%s", s.opts.Timeout, h.currentOp(), stack(true))
		}
		for _, e := range h.take() {
			t.Error(e)
		}
		for _, m := range h.takeSkips() {
			t.Skip(m)
		}
	})
}

func stack(all bool) string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, all)])
}

// subtest is the handle a subtest body uses. Failures are recorded, and
// fatalf and skip end the body's goroutine.
type subtest struct {
	suite    *suite
	deadline time.Time

	mu        sync.Mutex
	errs      []string
	skips     []string
	abandoned bool
	cleanups  []func()
	// flows keeps every flow's state for the hang report; live holds every
	// buffer handed to the transport, mapped until the comms are closed even
	// when the body ends early.
	flows []*flow
	live  map[*buffer]struct{}
	pool  map[poolKey][]*buffer
	seed  uint64

	op atomic.Pointer[string]

	// Data-path calls (Isend, Irecv, Test), timed per call: NCCL's progress
	// thread calls them in a tight loop, so one that waits is a stall even
	// when it never deadlocks the suite.
	dp [len(dataPathCalls)]struct{ calls, slow, max atomic.Int64 }
}

// Data-path timing limits: any single call longer than maxDataPathCall, or
// most calls of one kind longer than slowDataPathCall, fails the subtest.
var dataPathCalls = [...]string{"Isend", "Irecv", "SendComm.Test", "RecvComm.Test"}

const (
	slowDataPathCall = time.Millisecond
	// maxDataPathCall is wall-clock time, which counts time descheduled: on a
	// loaded 2-core machine a call that never waits was seen at 382 ms.
	maxDataPathCall = 5 * time.Second
)

// errorf records a failure.
func (h *subtest) errorf(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.abandoned {
		h.errs = append(h.errs, fmt.Sprintf(format, args...))
	}
}

// skip ends the body and reports the subtest as skipped with the reason.
func (h *subtest) skip(format string, args ...any) {
	h.mu.Lock()
	h.skips = append(h.skips, fmt.Sprintf(format, args...))
	h.mu.Unlock()
	runtime.Goexit()
}

func (h *subtest) failed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.errs) > 0
}

func (h *subtest) fatalf(format string, args ...any) {
	h.errorf(format, args...)
	runtime.Goexit()
}

func (h *subtest) abandon() {
	h.mu.Lock()
	h.abandoned = true
	h.mu.Unlock()
}

func (h *subtest) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.errs
	h.errs = nil
	return e
}

func (h *subtest) takeSkips() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.errs) > 0 {
		return nil
	}
	return h.skips
}

// defer registers f to run when the body ends (in reverse order), whether it
// failed or not.
func (h *subtest) defer_(f func()) {
	h.mu.Lock()
	h.cleanups = append(h.cleanups, f)
	h.mu.Unlock()
}

func (h *subtest) cleanup() {
	for {
		h.mu.Lock()
		n := len(h.cleanups)
		if n == 0 {
			h.mu.Unlock()
			return
		}
		f := h.cleanups[n-1]
		h.cleanups = h.cleanups[:n-1]
		h.mu.Unlock()
		func() {
			defer func() {
				if r := recover(); r != nil {
					h.errorf("panic during cleanup: %v\n%s", r, stack(false))
				}
			}()
			f()
		}()
	}
}

// call runs one transport call, recording its name so that a hang inside it is
// reported by name.
func (h *subtest) call(name string, f func()) {
	prev := h.op.Load()
	n := name
	h.op.Store(&n)
	k := -1
	for i, c := range dataPathCalls {
		if c == name {
			k = i
		}
	}
	if k < 0 {
		f()
		h.op.Store(prev)
		return
	}
	start := time.Now()
	f()
	d := int64(time.Since(start))
	st := &h.dp[k]
	st.calls.Add(1)
	if d >= int64(slowDataPathCall) {
		st.slow.Add(1)
	}
	if d > st.max.Load() {
		st.max.Store(d)
	}
	h.op.Store(prev)
}

// checkDataPathTiming fails the subtest when the transport's data path waited.
func (h *subtest) checkDataPathTiming() {
	if h.suite.opts.PostsDoTheNICsWork {
		return
	}
	for k, name := range dataPathCalls {
		st := &h.dp[k]
		calls, slow, maxd := st.calls.Load(), st.slow.Load(), time.Duration(st.max.Load())
		if maxd > maxDataPathCall {
			h.errorf("one %s call took %v: Isend, Irecv and Test run on NCCL's progress thread and must never wait (return nccl.NoRequest or not-done instead)", name, maxd.Round(time.Millisecond))
		} else if calls >= 100 && slow*2 > calls {
			h.errorf("%d of %d %s calls took %v or more (slowest %v): Isend, Irecv and Test run in NCCL's polling loop and must not block, sleep or wait", slow, calls, name, slowDataPathCall, maxd.Round(time.Microsecond))
		}
	}
}

func (h *subtest) currentOp() string {
	if p := h.op.Load(); p != nil && *p != "" {
		return "transport call " + *p
	}
	return "the suite's polling loop (no transport call in progress)"
}

// expired reports whether the subtest's deadline passed; polling loops check it
// so that a transport that never completes (rather than blocks) is reported
// with what was being waited for.
func (h *subtest) expired() bool { return time.Now().After(h.deadline) }

// noError records err as a failure and ends the body.
func (h *subtest) noError(err error, msgAndArgs ...any) {
	if err != nil {
		h.fatalf("%sunexpected error: %v (%v)", prefix(msgAndArgs), err, nccl.ResultOf(err))
	}
}

func prefix(msgAndArgs []any) string {
	if len(msgAndArgs) == 0 {
		return ""
	}
	if f, ok := msgAndArgs[0].(string); ok {
		return fmt.Sprintf(f, msgAndArgs[1:]...) + ": "
	}
	return fmt.Sprint(msgAndArgs...) + ": "
}

// testLogger forwards the transport's log to the top-level test until the
// test ends; lines after that (from goroutines a transport leaked, or from a
// body abandoned after a hang) are dropped rather than panicking the binary.
type testLogger struct {
	mu      sync.Mutex
	t       *testing.T
	stopped bool
}

func (l *testLogger) stop() {
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
}

func (l *testLogger) logf(level, format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.stopped {
		l.t.Logf("%s %s", level, strings.TrimRight(fmt.Sprintf(format, args...), "\n"))
	}
}

func (l *testLogger) Warnf(format string, args ...any) { l.logf("WARN", format, args...) }
func (l *testLogger) Infof(_ nccl.Subsys, format string, args ...any) {
	l.logf("INFO", format, args...)
}
func (l *testLogger) Tracef(nccl.Subsys, string, ...any) {}
