package abi

import "testing"

func TestIDMapsUnknownToUndef(t *testing.T) {
	for _, c := range []struct {
		id    int
		known bool
		want  int16
	}{{0, false, IDUndef}, {5, false, IDUndef}, {0, true, 0}, {3, true, 3}} {
		if got := ID(c.id, c.known); got != c.want {
			t.Errorf("ID(%d, %v) = %d, want %d", c.id, c.known, got, c.want)
		}
	}
}
