package slots

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAddGetRemoveAndStaleRefs(t *testing.T) {
	var tab Table[string]
	a, b := "a", "b"
	ra, ok := tab.Add(&a)
	require.True(t, ok)
	rb, ok := tab.Add(&b)
	require.True(t, ok)
	assert.NotEqual(t, ra.Gen, rb.Gen)
	assert.Equal(t, &a, tab.Get(ra))
	assert.Equal(t, 2, tab.Len())

	assert.Equal(t, &a, tab.Remove(ra))
	assert.Nil(t, tab.Remove(ra), "double remove")
	assert.Nil(t, tab.Get(ra), "stale after remove")
	c := "c"
	rc, ok := tab.Add(&c)
	require.True(t, ok)
	assert.Equal(t, ra.Slot, rc.Slot, "the freed slot is reused")
	assert.Nil(t, tab.Get(ra), "the old ref does not see the new entry")
	assert.Equal(t, &c, tab.Get(rc))
	assert.Nil(t, tab.Get(Ref{Slot: rc.Slot, Gen: rc.Gen + 1}), "forged generation")
	assert.Nil(t, tab.Get(Ref{Slot: MaxSlots + 5, Gen: 1}))
	assert.Nil(t, tab.Get(Ref{Slot: 999, Gen: 0}))
	v, gen := tab.Peek(rc.Slot)
	assert.Equal(t, &c, v)
	assert.Equal(t, rc.Gen, gen)
}

func TestPackNeverZeroAndRoundTrips(t *testing.T) {
	for _, r := range []Ref{{0, 1}, {5, 7}, {MaxSlots - 1, ^uint32(0)}} {
		h := r.Pack()
		assert.NotZero(t, h)
		got, ok := Unpack(h)
		require.True(t, ok)
		assert.Equal(t, r, got)
	}
	for _, h := range []uint64{0, 1 << 32, MaxSlots + 1} {
		_, ok := Unpack(h)
		assert.False(t, ok, "%#x", h)
	}
}

func TestLimit(t *testing.T) {
	tab := Table[int]{Limit: 3}
	var refs []Ref
	for i := 0; i < 3; i++ {
		r, ok := tab.Add(new(int))
		require.True(t, ok)
		refs = append(refs, r)
	}
	_, ok := tab.Add(new(int))
	assert.False(t, ok, "full")
	tab.Remove(refs[1])
	_, ok = tab.Add(new(int))
	assert.True(t, ok, "a freed slot is usable again")
}

func TestRange(t *testing.T) {
	var tab Table[int]
	var refs []Ref
	for i := 0; i < 2000; i++ { // more than one page
		v := i
		r, _ := tab.Add(&v)
		refs = append(refs, r)
	}
	tab.Remove(refs[7])
	seen := 0
	tab.Range(func(r Ref, v *int) bool {
		assert.Equal(t, v, tab.Get(r))
		seen++
		return true
	})
	assert.Equal(t, 1999, seen)
	n := 0
	tab.Range(func(Ref, *int) bool { n++; return n < 10 })
	assert.Equal(t, 10, n, "Range stops when f says so")
}

// Readers never see an entry under a Ref it was not added with, while other
// goroutines add and remove (run with -race).
func TestConcurrentLookupsSeeOnlyTheirOwnEntry(t *testing.T) {
	var tab Table[int64]
	var stop atomic.Bool
	var wg sync.WaitGroup
	var bad atomic.Int64
	live := make(chan Ref, 64)
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				select {
				case r := <-live:
					if v := tab.Get(r); v != nil && *v != int64(r.Gen) {
						bad.Add(1)
					}
					tab.Remove(r)
				default:
				}
			}
		}()
	}
	for i := 0; i < 5000; i++ {
		v := new(int64)
		r, ok := tab.Add(v)
		require.True(t, ok)
		*v = int64(r.Gen) // written before the Ref is published on the channel
		if rand.IntN(4) == 0 {
			tab.Remove(r)
			continue
		}
		live <- r
	}
	stop.Store(true)
	wg.Wait()
	assert.Zero(t, bad.Load())
}

func TestGetDoesNotAllocate(t *testing.T) {
	var tab Table[int]
	r, _ := tab.Add(new(int))
	assert.Zero(t, testing.AllocsPerRun(1000, func() { _ = tab.Get(r); _, _ = tab.Peek(r.Slot) }))
}

func BenchmarkGet(b *testing.B) {
	var tab Table[int]
	refs := make([]Ref, 1024)
	for i := range refs {
		refs[i], _ = tab.Add(new(int))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if tab.Get(refs[i&1023]) == nil {
			b.Fatal("lost an entry")
		}
	}
}

func BenchmarkAddRemove(b *testing.B) {
	var tab Table[int]
	v := new(int)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		r, _ := tab.Add(v)
		tab.Remove(r)
	}
}
