package plugin

import (
	"sync"
	"sync/atomic"
)

// Handles given to NCCL are integers, never Go pointers (cgo forbids C keeping
// Go pointers, and a forged or stale value must be detectable). A comm handle
// packs a kind tag, a generation and a slot index:
//
//	bits 63..56 kind tag | 55..24 generation | 23..0 slot
//
// so it is never 0 or 1 and never a valid user-space address. Request handles
// are described in requests.go.
const (
	tagListen = 0x4c // 'L'
	tagSend   = 0x53 // 'S'
	tagRecv   = 0x52 // 'R'
	tagCtx    = 0x43 // 'C': a v11+ per-communicator context

	slotBits = 16
	pageBits = 8
	maxSlots = 1 << slotBits
	pageSize = 1 << pageBits
	numPages = maxSlots / pageSize
)

func commHandle(tag uint8, gen uint32, slot uint32) uintptr {
	return uintptr(tag)<<56 | uintptr(gen)<<24 | uintptr(slot)
}

func splitCommHandle(h uintptr) (tag uint8, gen uint32, slot uint32) {
	return uint8(h >> 56), uint32(h>>24) & 0xffffffff, uint32(h) & 0xffffff
}

// slotTable maps slot indices to entries. Lookups are lock-free (two atomic
// loads) because NCCL's progress threads resolve a handle on every call;
// insertion and removal take a mutex (connection set-up and teardown only).
type slotTable[T any] struct {
	pages [numPages]atomic.Pointer[[pageSize]atomic.Pointer[T]]
	mu    sync.Mutex
	next  uint32
	free  []uint32
	gen   uint32
	used  int
}

// add stores e and returns its slot and a fresh generation, or ok=false when
// the table is full. bind (may be nil) sees both before e is published, so a
// lock-free reader that finds e also finds them set.
func (t *slotTable[T]) add(e *T, bind func(slot, gen uint32)) (slot uint32, gen uint32, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n := len(t.free); n > 0 {
		slot = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		if t.next >= maxSlots {
			return 0, 0, false
		}
		slot = t.next
		t.next++
	}
	t.gen++
	if t.gen == 0 {
		t.gen = 1
	}
	page := t.pages[slot>>pageBits].Load()
	if page == nil {
		page = new([pageSize]atomic.Pointer[T])
		t.pages[slot>>pageBits].Store(page)
	}
	if bind != nil {
		bind(slot, t.gen)
	}
	page[slot&(pageSize-1)].Store(e)
	t.used++
	return slot, t.gen, true
}

func (t *slotTable[T]) get(slot uint32) *T {
	if slot >= maxSlots {
		return nil
	}
	page := t.pages[slot>>pageBits].Load()
	if page == nil {
		return nil
	}
	return page[slot&(pageSize-1)].Load()
}

// remove clears slot if it still holds e.
func (t *slotTable[T]) remove(slot uint32, e *T) bool {
	if slot >= maxSlots {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	page := t.pages[slot>>pageBits].Load()
	if page == nil || !page[slot&(pageSize-1)].CompareAndSwap(e, nil) {
		return false
	}
	t.free = append(t.free, slot)
	t.used--
	return true
}

func (t *slotTable[T]) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.used
}
