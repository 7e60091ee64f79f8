package testhook

import "testing"

var clock = New(func() int64 { return 42 })

func TestSetRestoresAtCleanup(t *testing.T) {
	if got := clock.Get()(); got != 42 {
		t.Fatalf("default: got %d", got)
	}
	t.Run("inner", func(t *testing.T) {
		clock.Set(t, func() int64 { return 7 })
		if got := clock.Get()(); got != 7 {
			t.Fatalf("set: got %d", got)
		}
		t.Run("nested", func(t *testing.T) {
			clock.Set(t, func() int64 { return 9 })
			if got := clock.Get()(); got != 9 {
				t.Fatalf("nested: got %d", got)
			}
		})
		if got := clock.Get()(); got != 7 {
			t.Fatalf("after nested: got %d, want the outer test's 7", got)
		}
	})
	if got := clock.Get()(); got != 42 {
		t.Fatalf("after the test: got %d, want the default back", got)
	}
}

func BenchmarkGet(b *testing.B) {
	b.ReportAllocs()
	var s int64
	for i := 0; i < b.N; i++ {
		s += clock.Get()()
	}
	_ = s
}
