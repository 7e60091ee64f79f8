package nccl

import (
	"fmt"
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
)

// NCCL applies nccl.conf and env plugins with setenv after the library is
// loaded, and Go's os.Getenv only sees the environment copied at runtime
// start. So the glue installs a lookup backed by C getenv, and every setting
// is read through it, at set-up time.

// SetEnvLookup replaces the function used to read settings (the glue installs C
// getenv; tests may install a map). nil restores os.LookupEnv.
func SetEnvLookup(f func(string) (string, bool)) { ncclenv.SetLookup(f) }

// LookupEnv reads a setting through the installed lookup, untrimmed.
func LookupEnv(name string) (string, bool) { return ncclenv.Lookup(name) }

// Env reads one transport's settings with NCCL's grammar: integers as C's
// strtoll reads them (decimal, 0x hex, 0-prefixed octal), switches as
// integers (non-zero is on) or true/false, yes/no, on/off. Values are trimmed
// and an empty value means unset. A malformed value is a WARN through Log,
// prefixed with Prefix ("NET/MyFabric : ignoring NCCL_MYFABRIC_X=..."), and
// the default is used; text after a number (an nccl.conf comment) is ignored
// as NCCL's strtoll ignores it, with a WARN. Read settings at set-up time (Init, Listen, Connect),
// never on the data path, and never with os.Getenv.
type Env struct {
	Log    Logger // nil drops the WARNs
	Prefix string // your transport's log prefix, e.g. "NET/MyFabric"
}

// String returns the trimmed value of name, or def when unset or empty.
func (e Env) String(name, def string) string {
	if v, ok := ncclenv.Value(name); ok {
		return v
	}
	return def
}

// Int returns name as an integer, or def.
func (e Env) Int(name string, def int64) int64 {
	return read(e, name, def, ncclenv.ParseInt, func(n int64) string { return fmt.Sprint(n) })
}

// IntIn returns name as an integer in [lo, hi], or def (with a WARN when the
// value is outside).
func (e Env) IntIn(name string, def, lo, hi int64) int64 {
	n := e.Int(name, def)
	if n < lo || n > hi {
		e.warnf("ignoring %s=%d: must be in [%d, %d]; using the default %d", name, n, lo, hi, def)
		return def
	}
	return n
}

// Bool returns name as a switch, or def.
func (e Env) Bool(name string, def bool) bool {
	return read(e, name, def, ncclenv.ParseBool, func(b bool) string { return fmt.Sprint(b) })
}

// Duration returns name as a duration: a bare number in unit (fractions
// allowed), or Go syntax such as "1.5s".
func (e Env) Duration(name string, def, unit time.Duration) time.Duration {
	parse := func(s string) (time.Duration, error) { return ncclenv.ParseDuration(s, unit) }
	return read(e, name, def, parse, time.Duration.String)
}

// read is what every typed reader does: unset means def, malformed is a WARN
// and def.
func read[T any](e Env, name string, def T, parse func(string) (T, error), show func(T) string) T {
	v, ok := ncclenv.Value(name)
	if !ok {
		return def
	}
	x, err := parse(v)
	if ncclenv.ReadInPart(err) {
		e.warnf("reading %s=%s as %s: %v", name, v, show(x), err)
		return x
	}
	if err != nil {
		e.warnf("ignoring %s=%s: %v; using the default %s", name, v, err, show(def))
		return def
	}
	return x
}

func (e Env) warnf(format string, args ...any) {
	if e.Log == nil {
		return
	}
	if e.Prefix != "" {
		format = e.Prefix + " : " + format
	}
	e.Log.Warnf(format, args...)
}
