package ncclenv

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// cInteger reads s the way C's strto*(…, 0) does: an optional sign, then
// "0x"/"0X" hex, a leading "0" octal, else decimal, as many digits of that
// base as there are. rest is what follows them: NCCL (strtoll, checking only
// errno) ignores it, so "22 # comment" in nccl.conf is 22 and "1.5" is 1.
// No digit at all is errSyntax (NCCL would read 0; we keep the default and
// say so); Go's extras (underscores, 0b, 0o) are not syntax, so a value
// means what it means to NCCL.
func cInteger(s string) (neg bool, mag uint64, rest string, err error) {
	s = strings.TrimLeft(s, " \t\n\v\f\r") // as strtoll; values arrive trimmed anyway
	switch {
	case s == "":
		return false, 0, "", errSyntax
	case s[0] == '-':
		neg, s = true, s[1:]
	case s[0] == '+':
		s = s[1:]
	}
	base := 10
	switch {
	case len(s) > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X') && digitOf(s[2], 16):
		base, s = 16, s[2:]
	case len(s) > 0 && s[0] == '0':
		base = 8 // the 0 is a digit: "0x" alone, and "08", read as 0
	}
	n := 0
	for n < len(s) && digitOf(s[n], base) {
		n++
	}
	if n == 0 {
		return neg, 0, s, errSyntax
	}
	mag, err = strconv.ParseUint(s[:n], base, 64)
	if err != nil {
		return neg, 0, s[n:], errRange
	}
	return neg, mag, s[n:], nil
}

func digitOf(c byte, base int) bool {
	switch {
	case c >= '0' && c <= '9':
		return int(c-'0') < base
	case base == 16 && (c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'):
		return true
	}
	return false
}

var (
	errSyntax = errors.New("not a number")
	errRange  = errors.New("out of range")
)

// TrailingError is what ParseInt, ParseUint64 and ParseBool return, with the
// number, for a value NCCL reads only in part: the readers use the number
// NCCL would use, and WARN about the text it ignores.
type TrailingError struct {
	Value, Ignored string
}

func (e *TrailingError) Error() string {
	return fmt.Sprintf("NCCL reads only the number at the start of %q and ignores %q", e.Value, e.Ignored)
}

// ReadInPart reports whether err (from a Parse function) only says that text
// after the number was ignored: the number returned with it is the value.
func ReadInPart(err error) bool {
	var t *TrailingError
	return errors.As(err, &t)
}

// ParseInt reads s as NCCL reads an integer parameter (strtoll base 0):
// decimal, 0x hex or 0-prefixed octal, with an optional sign. Text after the
// number is ignored, as by NCCL, and reported with a *TrailingError.
func ParseInt(s string) (int64, error) {
	neg, mag, rest, err := cInteger(s)
	if err != nil {
		if err == errRange {
			return 0, fmt.Errorf("%q is out of range for a 64-bit integer", s)
		}
		return 0, fmt.Errorf("%q is not an integer (decimal, 0x hex or 0-prefixed octal)", s)
	}
	var n int64
	switch {
	case neg && mag > 1<<63, !neg && mag > math.MaxInt64:
		return 0, fmt.Errorf("%q is out of range for a 64-bit integer", s)
	case neg:
		n = -int64(mag) // -(1<<63) wraps to itself: correct
	default:
		n = int64(mag)
	}
	if rest != "" {
		return n, &TrailingError{Value: s, Ignored: rest}
	}
	return n, nil
}

// ParseUint64 reads s as NCCL reads NCCL_SOCKET_MAGIC (strtoull base 0):
// decimal, 0x hex or 0-prefixed octal, up to 2^64-1, text after the number
// ignored (*TrailingError). Unlike strtoull it refuses a minus sign (which C
// would silently wrap) and overflow (which C would silently saturate).
func ParseUint64(s string) (uint64, error) {
	neg, mag, rest, err := cInteger(s)
	switch {
	case err == errRange:
		return 0, fmt.Errorf("%q is larger than 2^64-1", s)
	case err != nil:
		return 0, fmt.Errorf("%q is not an unsigned integer (decimal, 0x hex or 0-prefixed octal)", s)
	case neg && mag != 0:
		return 0, fmt.Errorf("%q is negative; expected an unsigned 64-bit integer", s)
	case rest != "":
		return mag, &TrailingError{Value: s, Ignored: rest}
	}
	return mag, nil
}

// ParseBool reads a switch. NCCL's switches are integers where anything
// non-zero is on; the words true/false, yes/no, on/off, y/n (any case) are
// accepted too.
func ParseBool(s string) (bool, error) {
	switch strings.ToLower(s) {
	case "true", "yes", "on", "y":
		return true, nil
	case "false", "no", "off", "n":
		return false, nil
	}
	n, err := ParseInt(s)
	if err != nil && !ReadInPart(err) {
		return false, fmt.Errorf("%q is not a boolean (0 or 1, or true/false, yes/no, on/off)", s)
	}
	return n != 0, err
}

// ParseDuration reads a bare number in unit (NCCL's own variables are plain
// numbers such as NCCL_SOCKET_RETRY_SLEEP_MSEC; fractions are allowed) or a Go
// duration ("90s", "1.5m").
//
// A comment after the number ("500 # slower", an nccl.conf line) is ignored
// as for integers, with a *TrailingError; other text after it ("10 s") is an
// error, since it may mean a unit. Out of range is an error: 2^63 ns, which
// float64(math.MaxInt64) rounds to, would wrap to a negative duration.
func ParseDuration(s string, unit time.Duration) (time.Duration, error) {
	n, ierr := ParseInt(s)
	if ierr == nil {
		return scaled(s, float64(n), unit)
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil && !strings.ContainsAny(s, "xXpP_") {
		return scaled(s, f, unit)
	}
	if d, err := time.ParseDuration(s); err == nil {
		return d, nil
	}
	var t *TrailingError
	if errors.As(ierr, &t) && strings.HasPrefix(strings.TrimSpace(t.Ignored), "#") {
		d, err := scaled(s, float64(n), unit)
		if err != nil {
			return 0, err
		}
		return d, ierr
	}
	return 0, fmt.Errorf("%q is not a number of %s or a duration such as 1.5s", s, unitName(unit))
}

func scaled(s string, f float64, unit time.Duration) (time.Duration, error) {
	d := f * float64(unit)
	if math.IsNaN(d) || math.IsInf(d, 0) || math.Abs(d) >= 0x1p63 {
		return 0, fmt.Errorf("%q is out of range", s)
	}
	return time.Duration(d), nil
}

var unitNames = map[time.Duration]string{
	time.Nanosecond: "nanoseconds", time.Microsecond: "microseconds", time.Millisecond: "milliseconds",
	time.Second: "seconds", time.Minute: "minutes", time.Hour: "hours",
}

func unitName(u time.Duration) string {
	if n, ok := unitNames[u]; ok {
		return n
	}
	return "units of " + u.String()
}

// Family is an IP address family selection.
type Family int

const (
	AnyFamily Family = 0
	IPv4      Family = 4
	IPv6      Family = 6
)

// familyNames are the only spellings NCCL accepts.
var familyNames = map[Family]string{IPv4: "AF_INET", IPv6: "AF_INET6"}

func (f Family) String() string {
	if n, ok := familyNames[f]; ok {
		return n
	}
	return "any"
}

// ParseFamily reads NCCL_SOCKET_FAMILY / NCCL_IB_ADDR_FAMILY. NCCL compares
// with strcmp, so only the exact names count: "af_inet" or "IPv4" select
// nothing in NCCL, and are an error here (the caller WARNs and keeps its
// default, as NCCL silently does).
func ParseFamily(s string) (Family, error) {
	for f, name := range familyNames {
		if s == name {
			return f, nil
		}
	}
	hint := ""
	switch strings.ToUpper(s) {
	case "AF_INET", "INET", "IPV4":
		hint = " (write AF_INET: NCCL compares the exact name)"
	case "AF_INET6", "INET6", "IPV6":
		hint = " (write AF_INET6: NCCL compares the exact name)"
	}
	return AnyFamily, fmt.Errorf("%q is not AF_INET or AF_INET6%s", s, hint)
}
