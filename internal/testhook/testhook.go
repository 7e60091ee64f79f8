// Package testhook is the one way production code lets tests replace a
// package-level dependency (the host's interface list, a step of listen, the
// socket helpers' eventfd):
// the code declares a Hook with the real value and calls Get; a test calls
// Set, which puts the previous value back when the test ends, so no test
// leaks its fake into the next one. Get is one atomic load.
//
// Dependencies of an object are still passed to its constructor (an Options
// struct, a Source argument); a Hook is for code that has no object to carry
// them. Tests that Set a hook must not run in parallel with tests reading it.
package testhook

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
)

// Hook holds a replaceable value of type T.
type Hook[T any] struct {
	cur atomic.Pointer[T]
	def T
}

// New returns a Hook whose value is def until a test sets another.
func New[T any](def T) *Hook[T] { return &Hook[T]{def: def} }

// Get returns the current value.
func (h *Hook[T]) Get() T {
	if p := h.cur.Load(); p != nil {
		return *p
	}
	return h.def
}

// TB is the part of testing.TB that Set needs (this package does not import
// testing, so production binaries do not link it).
type TB interface {
	Helper()
	Cleanup(func())
}

// Set replaces the value until t ends.
func (h *Hook[T]) Set(t TB, v T) {
	t.Helper()
	prev := h.cur.Load()
	h.cur.Store(&v)
	t.Cleanup(func() { h.cur.Store(prev) })
}

// Warnings is a logger for tests that records WARN lines (it satisfies
// ncclenv.Logger and the Warnf half of nccl.Logger).
type Warnings struct {
	mu    sync.Mutex
	lines []string
}

// Warnf records one line.
func (w *Warnings) Warnf(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lines = append(w.lines, fmt.Sprintf(format, args...))
}

// Take returns the lines recorded since the last Take.
func (w *Warnings) Take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.lines
	w.lines = nil
	return l
}

// String is every line recorded and not yet taken, one per line.
func (w *Warnings) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.lines, "\n")
}
