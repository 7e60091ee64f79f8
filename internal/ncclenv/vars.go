package ncclenv

import (
	"fmt"
	"strconv"
	"time"
)

// Logger is where settings WARN; nccl.Logger satisfies it. A nil Logger drops
// the WARNs.
type Logger interface {
	Warnf(format string, args ...any)
}

// Group declares the settings of one package: the owner shown by the
// registry and the log prefix of the WARNs ("NET/GoSocket").
type Group struct {
	owner, prefix string
}

// NewGroup starts a package's declarations. Call it once per package, in its
// config.go.
func NewGroup(owner, logPrefix string) *Group { return &Group{owner: owner, prefix: logPrefix} }

// Prefix is the group's log prefix.
func (g *Group) Prefix() string { return g.prefix }

func (g *Group) declare(name string, kind Kind, def, doc string) base {
	b := base{g: g, s: Setting{Name: name, Default: def, Doc: doc, Owner: g.owner, Kind: kind}}
	register(b.s)
	return b
}

// base is what every setting shares.
type base struct {
	g *Group
	s Setting
}

// Name is the variable's name.
func (b *base) Name() string { return b.s.Name }

// Setting is the variable's declaration.
func (b *base) Setting() Setting { return b.s }

// IsSet reports whether the variable has a non-empty value.
func (b *base) IsSet() bool { _, ok := Value(b.s.Name); return ok }

func (b *base) setRange(r string) {
	b.s.Range = r
	registry.Lock()
	if cur, ok := registry.byName[b.s.Name]; ok && cur.Owner == b.s.Owner {
		registry.byName[b.s.Name] = b.s
	}
	registry.Unlock()
}

// showDefault replaces how the registry shows the default ("unset (no
// endpoint)" rather than "-1").
func (b *base) showDefault(text string) {
	b.s.Default = text
	b.setRange(b.s.Range)
}

// warn formats "<prefix> : ignoring NAME=value: why; using ...".
func warn(log Logger, prefix, format string, args ...any) {
	if log == nil {
		return
	}
	if prefix != "" {
		format = prefix + " : " + format
	}
	log.Warnf(format, args...)
}

// StringVar is a free-form string setting (a name, a path).
type StringVar struct {
	base
	def string
}

// String declares a string setting; def "" means "unset" to the reader.
func (g *Group) String(name, def, doc string) *StringVar {
	return &StringVar{base: g.declare(name, KindString, def, doc), def: def}
}

// ShowDefault sets how the registry shows the default.
func (v *StringVar) ShowDefault(text string) *StringVar { v.showDefault(text); return v }

// Get returns the trimmed value, or the default when unset or empty.
func (v *StringVar) Get() string {
	if s, ok := Value(v.s.Name); ok {
		return s
	}
	return v.def
}

// IntVar is an integer setting read as NCCL reads integers (ParseInt).
type IntVar struct {
	base
	def            int64
	lo, hi         int64
	ranged, clamps bool
}

// Int declares an integer setting.
func (g *Group) Int(name string, def int64, doc string) *IntVar {
	return &IntVar{base: g.declare(name, KindInt, strconv.FormatInt(def, 10), doc), def: def}
}

// In makes values outside [lo, hi] a WARN and the default.
func (v *IntVar) In(lo, hi int64) *IntVar {
	v.lo, v.hi, v.ranged, v.clamps = lo, hi, true, false
	v.setRange(fmt.Sprintf("[%d, %d]", lo, hi))
	return v
}

// Clamp makes values outside [lo, hi] a WARN and the nearest bound.
func (v *IntVar) Clamp(lo, hi int64) *IntVar {
	v.In(lo, hi)
	v.clamps = true
	return v
}

// ShowDefault sets how the registry shows the default (e.g. "auto" for a
// sentinel value).
func (v *IntVar) ShowDefault(text string) *IntVar { v.showDefault(text); return v }

// Default is the declared default.
func (v *IntVar) Default() int64 { return v.def }

// Get reads the value, WARNing with the group's prefix.
func (v *IntVar) Get(log Logger) int64 { return v.GetFor(log, v.g.prefix) }

// GetFor reads the value on behalf of the transport whose prefix is given.
func (v *IntVar) GetFor(log Logger, prefix string) int64 {
	s, ok := Value(v.s.Name)
	if !ok {
		return v.def
	}
	n, err := ParseInt(s)
	if err != nil {
		warn(log, prefix, "ignoring %s=%s: %v; using the default %d", v.s.Name, s, err, v.def)
		return v.def
	}
	if v.ranged && (n < v.lo || n > v.hi) {
		use := v.def
		if v.clamps {
			use = min(max(n, v.lo), v.hi)
		}
		warn(log, prefix, "ignoring %s=%s: must be in [%d, %d]; using %d", v.s.Name, s, v.lo, v.hi, use)
		return use
	}
	return n
}

// Uint64Var is an unsigned 64-bit setting (NCCL_SOCKET_MAGIC).
type Uint64Var struct {
	base
	def uint64
}

// Uint64 declares an unsigned setting, shown in hex.
func (g *Group) Uint64(name string, def uint64, doc string) *Uint64Var {
	return &Uint64Var{base: g.declare(name, KindUint64, fmt.Sprintf("%#x", def), doc), def: def}
}

// Get reads the value, WARNing with the group's prefix.
func (v *Uint64Var) Get(log Logger) uint64 { return v.GetFor(log, v.g.prefix) }

// GetFor reads the value on behalf of the transport whose prefix is given.
func (v *Uint64Var) GetFor(log Logger, prefix string) uint64 {
	s, ok := Value(v.s.Name)
	if !ok {
		return v.def
	}
	n, err := ParseUint64(s)
	if err != nil {
		warn(log, prefix, "ignoring %s=%s: %v; using the default %#x", v.s.Name, s, err, v.def)
		return v.def
	}
	return n
}

// BoolVar is a switch (ParseBool).
type BoolVar struct {
	base
	def bool
}

// Bool declares a switch.
func (g *Group) Bool(name string, def bool, doc string) *BoolVar {
	d := "0"
	if def {
		d = "1"
	}
	return &BoolVar{base: g.declare(name, KindBool, d, doc), def: def}
}

// Get reads the value, WARNing with the group's prefix.
func (v *BoolVar) Get(log Logger) bool { return v.GetFor(log, v.g.prefix) }

// GetFor reads the value on behalf of the transport whose prefix is given.
func (v *BoolVar) GetFor(log Logger, prefix string) bool {
	s, ok := Value(v.s.Name)
	if !ok {
		return v.def
	}
	b, err := ParseBool(s)
	if err != nil {
		d := 0
		if v.def {
			d = 1
		}
		warn(log, prefix, "ignoring %s=%s: %v; using the default %d", v.s.Name, s, err, d)
		return v.def
	}
	return b
}

// DurationVar is a duration setting: a bare number in its unit, or a Go
// duration (ParseDuration).
type DurationVar struct {
	base
	def, unit      time.Duration
	lo, hi         time.Duration
	ranged, clamps bool
}

// Duration declares a duration whose bare numbers are in unit.
func (g *Group) Duration(name string, def, unit time.Duration, doc string) *DurationVar {
	return &DurationVar{base: g.declare(name, KindDuration, def.String(), doc), def: def, unit: unit}
}

// In makes values outside [lo, hi] a WARN and the default.
func (v *DurationVar) In(lo, hi time.Duration) *DurationVar {
	v.lo, v.hi, v.ranged, v.clamps = lo, hi, true, false
	v.setRange(fmt.Sprintf("[%v, %v]", lo, hi))
	return v
}

// Clamp makes values outside [lo, hi] a WARN and the nearest bound.
func (v *DurationVar) Clamp(lo, hi time.Duration) *DurationVar {
	v.In(lo, hi)
	v.clamps = true
	return v
}

// ShowDefault sets how the registry shows the default.
func (v *DurationVar) ShowDefault(text string) *DurationVar { v.showDefault(text); return v }

// Default is the declared default.
func (v *DurationVar) Default() time.Duration { return v.def }

// Get reads the value, WARNing with the group's prefix.
func (v *DurationVar) Get(log Logger) time.Duration { return v.GetFor(log, v.g.prefix) }

// GetFor reads the value on behalf of the transport whose prefix is given.
func (v *DurationVar) GetFor(log Logger, prefix string) time.Duration {
	s, ok := Value(v.s.Name)
	if !ok {
		return v.def
	}
	d, err := ParseDuration(s, v.unit)
	if err != nil {
		warn(log, prefix, "ignoring %s=%s: %v; using the default %v", v.s.Name, s, err, v.def)
		return v.def
	}
	if v.ranged && (d < v.lo || d > v.hi) {
		use := v.def
		if v.clamps {
			use = min(max(d, v.lo), v.hi)
		}
		warn(log, prefix, "ignoring %s=%s: must be in [%v, %v]; using %v", v.s.Name, s, v.lo, v.hi, use)
		return use
	}
	return d
}

// FamilyVar is an address family selection (ParseFamily).
type FamilyVar struct {
	base
	def Family
}

// Family declares an address family setting.
func (g *Group) Family(name string, def Family, doc string) *FamilyVar {
	return &FamilyVar{base: g.declare(name, KindFamily, def.String(), doc), def: def}
}

// Get reads the value, WARNing with the group's prefix.
func (v *FamilyVar) Get(log Logger) Family { return v.GetFor(log, v.g.prefix) }

// GetFor reads the value on behalf of the transport whose prefix is given.
func (v *FamilyVar) GetFor(log Logger, prefix string) Family {
	s, ok := Value(v.s.Name)
	if !ok {
		return v.def
	}
	f, err := ParseFamily(s)
	if err != nil {
		warn(log, prefix, "ignoring %s=%s: %v; using %v", v.s.Name, s, err, v.def)
		return v.def
	}
	return f
}

// ListVar is an NCCL interface or HCA list (ParseList).
type ListVar struct {
	base
	max int
}

// List declares a list setting of at most max entries; unset means "no list".
func (g *Group) List(name string, max int, doc string) *ListVar {
	v := &ListVar{base: g.declare(name, KindList, "", doc), max: max}
	v.setRange(fmt.Sprintf("at most %d entries", max))
	return v
}

// Get parses the value, WARNing each note with the group's prefix. set is
// false when the variable is unset or empty.
func (v *ListVar) Get(log Logger) (l List, set bool) { return v.GetFor(log, v.g.prefix) }

// GetFor parses the value on behalf of the transport whose prefix is given.
func (v *ListVar) GetFor(log Logger, prefix string) (l List, set bool) {
	s, ok := Value(v.s.Name)
	if !ok {
		return List{}, false
	}
	return v.Parse(log, prefix, s), true
}

// Parse parses s as this variable's value (for callers that already hold it),
// WARNing each note.
func (v *ListVar) Parse(log Logger, prefix, s string) List {
	l, notes := ParseList(s, v.max)
	for _, n := range notes {
		warn(log, prefix, "%s=%s: %s", v.s.Name, s, n)
	}
	return l
}
