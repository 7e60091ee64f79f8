package nccl

import (
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// NCCL applies nccl.conf and env plugins with setenv after our library is loaded,
// and Go's os.Getenv only sees the environment copied at runtime start. So the
// glue installs a lookup backed by C getenv, and every NCCL_* setting is read
// through here at use time.
var envLookup atomic.Pointer[func(string) (string, bool)]

// SetEnvLookup replaces the function used to read settings (the glue installs C
// getenv; tests may install a map). nil restores os.LookupEnv.
func SetEnvLookup(f func(string) (string, bool)) {
	if f == nil {
		envLookup.Store(nil)
		return
	}
	envLookup.Store(&f)
}

// LookupEnv reads a setting through the installed lookup.
func LookupEnv(name string) (string, bool) {
	if f := envLookup.Load(); f != nil {
		return (*f)(name)
	}
	return os.LookupEnv(name)
}

// EnvString returns the trimmed value of name, or def when unset or empty.
func EnvString(name, def string) string {
	v, ok := LookupEnv(name)
	v = strings.TrimSpace(v)
	if !ok || v == "" {
		return def
	}
	return v
}

// EnvInt returns name parsed as an integer (decimal or 0x hex), or def when
// unset. A malformed value logs a WARN naming the variable and uses def.
func EnvInt(log Logger, name string, def int64) int64 {
	v, ok := LookupEnv(name)
	v = strings.TrimSpace(v)
	if !ok || v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 0, 64)
	if err != nil {
		if log != nil {
			log.Warnf("NET/Go : ignoring %s=%q: not an integer; using the default %d", name, v, def)
		}
		return def
	}
	return n
}

// EnvBool returns name as a boolean (1/0, true/false, yes/no, on/off), or def.
func EnvBool(log Logger, name string, def bool) bool {
	v, ok := LookupEnv(name)
	v = strings.ToLower(strings.TrimSpace(v))
	if !ok || v == "" {
		return def
	}
	switch v {
	case "1", "true", "yes", "on", "y":
		return true
	case "0", "false", "no", "off", "n":
		return false
	}
	if log != nil {
		log.Warnf("NET/Go : ignoring %s=%q: expected 0 or 1; using the default %v", name, v, def)
	}
	return def
}

// EnvDuration returns name as a duration. A bare number is taken in the given
// unit (NCCL's variables are plain numbers); Go syntax such as "1.5s" also works.
func EnvDuration(log Logger, name string, def, unit time.Duration) time.Duration {
	v, ok := LookupEnv(name)
	v = strings.TrimSpace(v)
	if !ok || v == "" {
		return def
	}
	if n, err := strconv.ParseFloat(v, 64); err == nil {
		return time.Duration(n * float64(unit))
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		if log != nil {
			log.Warnf("NET/Go : ignoring %s=%q: not a number or duration; using the default %v", name, v, def)
		}
		return def
	}
	return d
}
