// Package slots is the plugin's generation-checked handle table: it maps the
// integers NCCL holds (init contexts and comms; ib's memory registrations;
// never Go pointers) to Go objects. Request handles are not here: each comm
// has its own table in the glue (plugin/requests.go). Lookups are lock-free (two atomic loads and a compare)
// because NCCL's progress threads resolve a handle on every data-path call;
// Add and Remove take a mutex (connection set-up and teardown only). Every
// Add gets a new generation, so a handle kept after its Remove, or forged,
// does not resolve.
package slots

import (
	"sync"
	"sync/atomic"
)

const (
	pageBits = 10
	pageSize = 1 << pageBits
	// MaxSlots is the largest number of live entries a table can hold.
	MaxSlots = 1 << 20
	numPages = MaxSlots / pageSize
)

// Ref names one entry: its slot and the generation it got at Add.
type Ref struct {
	Slot uint32
	Gen  uint32
}

// Pack is r as one integer: the generation in the high 32 bits, slot+1 in
// the low 32, so that a valid handle is never 0.
func (r Ref) Pack() uint64 { return uint64(r.Gen)<<32 | uint64(r.Slot+1) }

// Unpack reverses Pack; ok is false for values Pack never returns.
func Unpack(h uint64) (r Ref, ok bool) {
	low := uint32(h)
	if low == 0 || low > MaxSlots {
		return Ref{}, false
	}
	return Ref{Slot: low - 1, Gen: uint32(h >> 32)}, true
}

type entry[T any] struct {
	gen uint32
	v   *T
}

type page[T any] [pageSize]atomic.Pointer[entry[T]]

// Table maps Refs to *T. The zero value is an empty table ready to use.
type Table[T any] struct {
	// Limit caps the number of live entries (0: MaxSlots); set it before the
	// first Add, e.g. when handles have fewer than 20 bits for the slot.
	Limit int

	pages [numPages]atomic.Pointer[page[T]]
	mu    sync.Mutex
	next  uint32   // slots below next have been used at least once
	free  []uint32 // released slots, reused most recent first
	gen   uint32
	n     int
}

// Add stores v and returns its Ref, or ok=false when the table is full.
func (t *Table[T]) Add(v *T) (r Ref, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	limit := uint32(MaxSlots)
	if t.Limit > 0 && t.Limit < MaxSlots {
		limit = uint32(t.Limit)
	}
	var slot uint32
	if n := len(t.free); n > 0 {
		slot = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		if t.next >= limit {
			return Ref{}, false
		}
		slot = t.next
		t.next++
	}
	t.gen++
	if t.gen == 0 { // 0 is never a live generation
		t.gen = 1
	}
	p := t.pages[slot>>pageBits].Load()
	if p == nil {
		p = new(page[T])
		t.pages[slot>>pageBits].Store(p)
	}
	p[slot&(pageSize-1)].Store(&entry[T]{gen: t.gen, v: v})
	t.n++
	return Ref{Slot: slot, Gen: t.gen}, true
}

// Peek returns the entry in slot and its generation (nil, 0 when empty). It is
// for handles that carry only part of the generation; others use Get.
func (t *Table[T]) Peek(slot uint32) (v *T, gen uint32) {
	if slot >= MaxSlots {
		return nil, 0
	}
	p := t.pages[slot>>pageBits].Load()
	if p == nil {
		return nil, 0
	}
	e := p[slot&(pageSize-1)].Load()
	if e == nil {
		return nil, 0
	}
	return e.v, e.gen
}

// Get returns the entry r names, or nil when r is stale or was never added.
func (t *Table[T]) Get(r Ref) *T {
	v, gen := t.Peek(r.Slot)
	if gen != r.Gen || gen == 0 {
		return nil
	}
	return v
}

// Remove deletes the entry r names and returns it; nil when r is stale.
func (t *Table[T]) Remove(r Ref) *T {
	t.mu.Lock()
	defer t.mu.Unlock()
	v := t.Get(r)
	if v == nil {
		return nil
	}
	t.pages[r.Slot>>pageBits].Load()[r.Slot&(pageSize-1)].Store(nil)
	t.free = append(t.free, r.Slot)
	t.n--
	return v
}

// Len is the number of live entries.
func (t *Table[T]) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

// Range calls f for every live entry until f returns false (teardown, tests).
// Entries added or removed meanwhile may or may not be seen.
func (t *Table[T]) Range(f func(Ref, *T) bool) {
	t.mu.Lock()
	next := t.next
	t.mu.Unlock()
	for s := uint32(0); s < next; s++ {
		if v, gen := t.Peek(s); v != nil && !f(Ref{Slot: s, Gen: gen}, v) {
			return
		}
	}
}
