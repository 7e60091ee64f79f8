package ncclenv

import (
	"os"
	"strings"
	"sync/atomic"
)

var lookup atomic.Pointer[func(string) (string, bool)]

// SetLookup replaces the function settings are read with (the glue installs
// C getenv; tests install a map). nil restores os.LookupEnv.
func SetLookup(f func(string) (string, bool)) {
	if f == nil {
		lookup.Store(nil)
		return
	}
	lookup.Store(&f)
}

// Lookup reads name through the installed lookup, untrimmed.
func Lookup(name string) (string, bool) {
	if f := lookup.Load(); f != nil {
		return (*f)(name)
	}
	return os.LookupEnv(name)
}

// Value returns name's value with surrounding white space removed, and
// whether it is set to something non-empty: an empty value means "unset",
// i.e. the default.
func Value(name string) (string, bool) {
	v, ok := Lookup(name)
	v = strings.TrimSpace(v)
	return v, ok && v != ""
}
