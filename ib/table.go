package ib

import (
	"sync"
	"sync/atomic"
)

// table maps small integer handles to objects with lock-free lookups (the
// data path resolves memory handles on every call) and mutex-protected
// insertion and removal (registration is on NCCL's service thread).
// Handles are idx+1 in the low 32 bits and a generation in the high 32, so
// zero is never valid and a stale handle is detected.
type table[T any] struct {
	pages [1024]atomic.Pointer[[1024]atomic.Pointer[tableEntry[T]]]
	mu    sync.Mutex
	next  uint32
	free  []uint32
	gen   uint32
}

type tableEntry[T any] struct {
	gen uint32
	v   *T
}

const tableMax = 1024 * 1024

func (t *table[T]) add(v *T) (uint64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var idx uint32
	if n := len(t.free); n > 0 {
		idx = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		if t.next >= tableMax {
			return 0, false
		}
		idx = t.next
		t.next++
	}
	t.gen++
	if t.gen == 0 {
		t.gen = 1
	}
	page := t.pages[idx/1024].Load()
	if page == nil {
		page = new([1024]atomic.Pointer[tableEntry[T]])
		t.pages[idx/1024].Store(page)
	}
	page[idx%1024].Store(&tableEntry[T]{gen: t.gen, v: v})
	return uint64(t.gen)<<32 | uint64(idx+1), true
}

func (t *table[T]) get(h uint64) *T {
	idx := uint32(h) - 1
	if uint32(h) == 0 || idx >= tableMax {
		return nil
	}
	page := t.pages[idx/1024].Load()
	if page == nil {
		return nil
	}
	e := page[idx%1024].Load()
	if e == nil || e.gen != uint32(h>>32) {
		return nil
	}
	return e.v
}

// remove deletes h and returns its object, or nil if h is unknown or stale.
func (t *table[T]) remove(h uint64) *T {
	t.mu.Lock()
	defer t.mu.Unlock()
	v := t.get(h)
	if v == nil {
		return nil
	}
	idx := uint32(h) - 1
	t.pages[idx/1024].Load()[idx%1024].Store(nil)
	t.free = append(t.free, idx)
	return v
}
