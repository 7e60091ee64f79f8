package ncclenv

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// Check must say what the reader does: the same value, and a verdict exactly
// when the reader WARNs.
func TestCheckAgreesWithTheReader(t *testing.T) {
	g := NewGroup("checktest", "NET/Test")
	i := g.Int("NCCL_CHECKTEST_INT", 7, "").In(0, 100)
	c := g.Int("NCCL_CHECKTEST_CLAMP", 4, "").Clamp(1, 8)
	d := g.Duration("NCCL_CHECKTEST_DUR", time.Second, time.Millisecond, "")
	l := g.List("NCCL_CHECKTEST_LIST", 2, "")
	for _, tc := range []struct {
		name, raw, used string
		inPart, invalid bool
		why             string
	}{
		{i.Name(), "42", "42", false, false, ""},
		{i.Name(), "0x10", "16", false, false, ""},
		{i.Name(), "12k", "12", true, false, `NCCL reads only the number at the start of "12k" and ignores "k"; the plugin uses 12`},
		{i.Name(), "abc", "7", false, true, `"abc" is not an integer (decimal, 0x hex or 0-prefixed octal); the plugin uses the default 7`},
		{i.Name(), "500", "7", false, true, "500 must be in [0, 100]; the plugin uses the default 7"},
		{i.Name(), "500k", "7", true, true, `NCCL reads only the number at the start of "500k" and ignores "k"; 500 must be in [0, 100]; the plugin uses the default 7`},
		{c.Name(), "99", "8", false, true, "99 must be in [1, 8]; the plugin uses 8"},
		{d.Name(), "250", "250ms", false, false, ""},
		{d.Name(), "010", "8ms", false, false, ""},
		{l.Name(), "eth0,eth1,eth2", "eth0,eth1,eth2", true, false, ""},
		{i.Name(), "   ", "", false, false, ""}, // empty is unset
	} {
		v, ok := Check(tc.name, tc.raw)
		assert.True(t, ok, tc.name)
		if tc.raw != "   " {
			assert.Equal(t, tc.used, v.Used, "%s=%s", tc.name, tc.raw)
		}
		assert.Equal(t, tc.inPart, v.InPart, "%s=%s", tc.name, tc.raw)
		assert.Equal(t, tc.invalid, v.Invalid, "%s=%s", tc.name, tc.raw)
		if tc.why != "" {
			assert.Equal(t, tc.why, v.Why, "%s=%s", tc.name, tc.raw)
		}
		// The reader's WARN count agrees.
		SetLookup(func(k string) (string, bool) { return tc.raw, k == tc.name && tc.raw != "   " })
		w := &countWarns{}
		switch tc.name {
		case i.Name():
			i.Get(w)
		case c.Name():
			c.Get(w)
		case d.Name():
			d.Get(w)
		case l.Name():
			l.Get(w)
		}
		SetLookup(nil)
		assert.Equal(t, !v.OK(), w.n > 0, "%s=%s: Check and the reader disagree on whether it WARNs", tc.name, tc.raw)
	}
	_, ok := Check("NCCL_CHECKTEST_NOBODY", "1")
	assert.False(t, ok)
}

type countWarns struct{ n int }

func (c *countWarns) Warnf(string, ...any) { c.n++ }
