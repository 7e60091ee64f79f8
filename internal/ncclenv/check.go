package ncclenv

import (
	"fmt"
	"strings"
)

// Verdict is what a setting's reader makes of a value: the value it uses and,
// when that is not the value as written, why. ncclnet-go env shows it, so an
// operator sees before the job what the plugin would WARN about at init.
type Verdict struct {
	Used    string // the value the reader uses, shown as the registry shows values
	InPart  bool   // only the number at the start is used; text after it is ignored
	Invalid bool   // the value is refused: Used is the default, a bound, or "none"
	// Why says what is wrong and what the reader uses instead, without the
	// variable's name ("" when the value is used as written).
	Why string
}

// OK reports whether the value is used as written.
func (v Verdict) OK() bool { return !v.InPart && !v.Invalid }

var checks struct {
	m map[string]func(string) Verdict
}

// setCheck registers name's reader as its check; declarations run at package
// initialisation, before anything can call Check.
func setCheck(name string, f func(string) Verdict) {
	registry.Lock()
	defer registry.Unlock()
	if checks.m == nil {
		checks.m = map[string]func(string) Verdict{}
	}
	checks.m[name] = f
}

// SetCheck replaces name's check, for a setting its package reads by a rule of
// its own rather than through the declared variable's Get (the metrics port,
// NCCL_SOCKET_IFNAME's one-character rule). Call it from the package's
// initialisation, next to the declaration.
func SetCheck(name string, f func(raw string) Verdict) { setCheck(name, f) }

// Check reads raw as the plugin reads the setting name, without logging.
// ok is false when name has no check (string settings, names nobody
// declared). An empty value is unset: the default, used as written.
func Check(name, raw string) (v Verdict, ok bool) {
	registry.Lock()
	f := checks.m[name]
	registry.Unlock()
	if f == nil {
		return Verdict{}, false
	}
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return Verdict{}, true
	}
	return f(raw), true
}

// FromReader makes a check out of a reader that takes the raw value and
// WARNs about what it will not use as written: the first WARN, less its
// "NET/... : " prefix, is the problem. For settings whose package reads them
// by a rule of its own (SetCheck), so that ncclnet-go env reports exactly
// what the plugin would WARN about, from the code that WARNs.
func FromReader(read func(log Logger, raw string)) func(string) Verdict {
	return FromPartialReader(func(log Logger, raw string) (string, bool) {
		read(log, raw)
		return "", false
	})
}

// FromPartialReader is FromReader for a reader that may use part of a value
// (a number with text after it) and WARN about that: it returns what it
// uses ("" for the value as written) and whether a WARN it logged means the
// value is read in part rather than refused.
func FromPartialReader(read func(log Logger, raw string) (used string, inPart bool)) func(string) Verdict {
	return func(raw string) Verdict {
		var w firstWarn
		used, inPart := read(&w, raw)
		if used == "" {
			used = raw
		}
		if !w.set {
			return Verdict{Used: used}
		}
		why := w.msg
		if _, rest, ok := strings.Cut(why, " : "); ok && strings.HasPrefix(why, "NET/") {
			why = rest
		}
		return Verdict{Used: used, InPart: inPart, Invalid: !inPart, Why: why}
	}
}

// firstWarn is a Logger that keeps the first WARN.
type firstWarn struct {
	msg string
	set bool
}

func (w *firstWarn) Warnf(format string, args ...any) {
	if !w.set {
		w.msg, w.set = fmt.Sprintf(format, args...), true
	}
}
