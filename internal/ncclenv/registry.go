package ncclenv

import (
	"fmt"
	"sort"
	"strings"
	"sync"
)

// Kind names the grammar of a setting's value.
type Kind string

const (
	KindString   Kind = "string"
	KindInt      Kind = "integer"
	KindUint64   Kind = "unsigned 64-bit integer"
	KindBool     Kind = "boolean"
	KindDuration Kind = "duration"
	KindFamily   Kind = "address family"
	KindList     Kind = "list"
)

// Setting describes one declared variable.
type Setting struct {
	Name    string
	Default string // the default as users see it ("" for a string means unset)
	Doc     string // one line: what it does
	Owner   string // the package that declared it ("socket", "ib", "internal/ncclsock" ...)
	Kind    Kind
	Range   string // accepted values beyond the grammar ("[0, 1048576]"), if any
}

// Value is the setting's current value (trimmed) and whether it is set.
func (s Setting) Value() (string, bool) { return Value(s.Name) }

var registry struct {
	sync.Mutex
	byName map[string]Setting
	dups   []string
}

func register(s Setting) {
	registry.Lock()
	defer registry.Unlock()
	if registry.byName == nil {
		registry.byName = map[string]Setting{}
	}
	if prev, ok := registry.byName[s.Name]; ok {
		// Not a panic: declarations run at load time inside NCCL's process.
		// TestNoSettingIsDeclaredTwice (internal/settingsdoc) catches it instead.
		registry.dups = append(registry.dups, fmt.Sprintf("%s (declared by %s and by %s)", s.Name, prev.Owner, s.Owner))
		return
	}
	registry.byName[s.Name] = s
}

// All lists every declared setting, sorted by name. Only packages linked into
// the program have declared theirs.
func All() []Setting {
	registry.Lock()
	defer registry.Unlock()
	out := make([]Setting, 0, len(registry.byName))
	for _, s := range registry.byName {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Find returns the declaration of name.
func Find(name string) (Setting, bool) {
	registry.Lock()
	defer registry.Unlock()
	s, ok := registry.byName[name]
	return s, ok
}

// Duplicates lists names declared more than once (a programming error).
func Duplicates() []string {
	registry.Lock()
	defer registry.Unlock()
	return append([]string(nil), registry.dups...)
}

// OwnPrefix is the prefix of the variables that belong to this plugin alone;
// a set one nobody declared is most likely a typo.
const OwnPrefix = "NCCL_GO_"

// Undeclared returns the NCCL_GO_* names in environ ("NAME=value" strings, as
// os.Environ gives them) that no linked package declared, sorted.
func Undeclared(environ []string) []string {
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, OwnPrefix) {
			continue
		}
		if _, ok := Find(name); !ok {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// Suggest returns the declared name closest to name (a misspelling), or ""
// when none is close.
func Suggest(name string) string {
	best, bestD := "", 4 // more than 3 edits is not a typo
	for _, s := range All() {
		if d := editDistance(name, s.Name); d < bestD {
			best, bestD = s.Name, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
