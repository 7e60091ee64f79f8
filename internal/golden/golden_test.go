package golden

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestDiff(t *testing.T) {
	want := "\na\nb\n"
	assert.Nil(t, Diff(want, []string{"a", "b"}, "golden", "got   "))
	assert.Equal(t, []string{"  golden \"b\"\n  got    \"c\""}, Diff(want, []string{"a", "c"}, "golden", "got   "))
	assert.Equal(t, []string{"  golden \"b\"\n  got    \"(none)\""}, Diff(want, []string{"a"}, "golden", "got   "))
	assert.Equal(t, []string{"  golden \"(none)\"\n  got    \"x\""}, Diff(want, []string{"a", "b", "x"}, "golden", "got   "))
}

func TestHex(t *testing.T) {
	assert.Equal(t, "0102 03 04", Hex([]byte{1, 2, 3, 4}, 2, 3))
	assert.Equal(t, "01020304", Hex([]byte{1, 2, 3, 4}))
}
