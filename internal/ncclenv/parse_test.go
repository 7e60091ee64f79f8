package ncclenv

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// C's strtoll(s, NULL, 0), as NCCL's ncclLoadParam reads (it checks only
// errno): the number at the start, whatever follows it ignored.
func TestParseIntIsStrtollBase0(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "42": 42, "-42": -42, "+7": 7,
		"0x1f": 31, "0X1F": 31, "-0x10": -16,
		"010": 8, "0777": 511, "00": 0, // a leading 0 is octal, as in C
		" 5":                   5,
		"9223372036854775807":  math.MaxInt64,
		"-9223372036854775808": math.MinInt64,
	} {
		got, err := ParseInt(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	// What strtoll returns for these, and the text after its end pointer.
	for in, want := range map[string]struct {
		n    int64
		rest string
	}{
		"22 # big fabric": {22, " # big fabric"}, "12a": {12, "a"}, "1.5": {1, ".5"},
		"08": {0, "8"}, "0x": {0, "x"}, "0xZZ": {0, "xZZ"}, "1_000": {1, "_000"},
		"0b101": {0, "b101"}, "0o17": {0, "o17"}, "-3 ": {-3, " "},
	} {
		got, err := ParseInt(in)
		require.True(t, ReadInPart(err), "%q: %v", in, err)
		assert.Equal(t, want.n, got, in)
		assert.ErrorContains(t, err, fmt.Sprintf("ignores %q", want.rest))
	}
	for _, bad := range []string{"", "x", "--1", "+-1", "9223372036854775808", "-9223372036854775809", "0x8000000000000000"} {
		_, err := ParseInt(bad)
		require.Error(t, err, "%q", bad)
		assert.False(t, ReadInPart(err), "%q", bad)
	}
	_, err := ParseInt("9223372036854775808")
	assert.ErrorContains(t, err, "out of range")
	_, err = ParseInt("abc")
	assert.ErrorContains(t, err, "not an integer")
}

// NCCL_SOCKET_MAGIC: strtoull(env, NULL, 0); what follows the number is ignored.
func TestParseUint64IsStrtoull(t *testing.T) {
	for in, want := range map[string]uint64{
		"12345":                12345,
		"0x564ab9f2fc4b9d6c":   0x564ab9f2fc4b9d6c,
		"0XABCDEF0123456789":   0xabcdef0123456789,
		"0xffffffffffffffff":   math.MaxUint64, // signed parsing (the old ib reader) refused these
		"18446744073709551615": math.MaxUint64,
		"9223372036854775808":  1 << 63,
		"017":                  15,
		"-0":                   0,
	} {
		got, err := ParseUint64(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "magic", "-1", "18446744073709551616", "0x10000000000000000"} {
		_, err := ParseUint64(bad)
		require.Error(t, err, "%q", bad)
		assert.False(t, ReadInPart(err), "%q", bad)
	}
	n, err := ParseUint64("0x5a # ours")
	assert.True(t, ReadInPart(err))
	assert.EqualValues(t, 0x5a, n)
	_, err = ParseUint64("-1")
	assert.ErrorContains(t, err, "negative")
	_, err = ParseUint64("18446744073709551616")
	assert.ErrorContains(t, err, "2^64-1")
}

func TestParseBool(t *testing.T) {
	for in, want := range map[string]bool{
		"1": true, "0": false, "2": true, "-1": true, "0x10": true, "00": false, // NCCL: any non-zero integer is on
		"true": true, "FALSE": false, "yes": true, "No": false, "on": true, "off": false, "y": true, "n": false,
	} {
		got, err := ParseBool(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "maybe", "1.0", "enable"} {
		_, err := ParseBool(bad)
		assert.Error(t, err, bad)
	}
}

func TestParseDuration(t *testing.T) {
	for _, c := range []struct {
		in   string
		unit time.Duration
		want time.Duration
	}{
		{"100", time.Millisecond, 100 * time.Millisecond},
		{"1.5", time.Second, 1500 * time.Millisecond},
		{"0", time.Second, 0},
		{"-1", time.Second, -time.Second},
		{"90s", time.Millisecond, 90 * time.Second},
		{"2m", time.Second, 2 * time.Minute},
		{"500ms", time.Second, 500 * time.Millisecond},
		{"1e3", time.Millisecond, time.Second},
	} {
		got, err := ParseDuration(c.in, c.unit)
		require.NoError(t, err, c.in)
		assert.Equal(t, c.want, got, c.in)
	}
	// A comment after the number is read past, as for integers, and said so.
	got, err := ParseDuration("500 # slower", time.Millisecond)
	assert.Equal(t, 500*time.Millisecond, got)
	assert.True(t, ReadInPart(err), "%v", err)
	// 2^63 ns rounds to float64(MaxInt64) and used to wrap to a negative
	// duration (which turns NCCL_GO_TIMEOUT's liveness checks off).
	for _, c := range []struct {
		in   string
		unit time.Duration
	}{{"9223372036.854775807", time.Second}, {"9223372036854775807", time.Nanosecond}, {"-9223372036854775808", time.Nanosecond}} {
		_, err := ParseDuration(c.in, c.unit)
		assert.ErrorContains(t, err, "out of range", c.in)
	}
	for _, bad := range []string{"", "soon", "1.5.5", "inf", "NaN", "1e300", "0x1p3", "10 s", "5 s # x"} {
		_, err := ParseDuration(bad, time.Second)
		assert.Error(t, err, bad)
	}
	_, err = ParseDuration("soon", time.Millisecond)
	assert.ErrorContains(t, err, "milliseconds")
}

func TestParseFamilyIsExactLikeNCCL(t *testing.T) {
	f, err := ParseFamily("AF_INET")
	require.NoError(t, err)
	assert.Equal(t, IPv4, f)
	f, err = ParseFamily("AF_INET6")
	require.NoError(t, err)
	assert.Equal(t, IPv6, f)
	for _, bad := range []string{"af_inet", "INET", "IPv6", "AF_UNIX", ""} {
		f, err := ParseFamily(bad)
		assert.Error(t, err, bad)
		assert.Equal(t, AnyFamily, f)
	}
	_, err = ParseFamily("ipv6")
	assert.ErrorContains(t, err, "write AF_INET6")
	assert.Equal(t, "AF_INET", IPv4.String())
	assert.Equal(t, "any", AnyFamily.String())
}
