package ncclenv

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"
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

// scalar is what every single-valued setting shares: parse the value, check
// its range, WARN and fall back.
type scalar[T cmp.Ordered] struct {
	base
	def            T
	parse          func(string) (T, error)
	show           func(T) string
	lo, hi         T
	ranged, clamps bool
}

func (v *scalar[T]) setBounds(lo, hi T, clamps bool) {
	v.lo, v.hi, v.ranged, v.clamps = lo, hi, true, clamps
	v.setRange(fmt.Sprintf("[%s, %s]", v.show(lo), v.show(hi)))
}

// Default is the declared default.
func (v *scalar[T]) Default() T { return v.def }

// Get reads the value, WARNing with the group's prefix.
func (v *scalar[T]) Get(log Logger) T { return v.GetFor(log, v.g.prefix) }

// GetFor reads the value on behalf of the transport whose prefix is given.
func (v *scalar[T]) GetFor(log Logger, prefix string) T {
	s, ok := Value(v.s.Name)
	if !ok {
		return v.def
	}
	n, _ := v.read(s, log, prefix)
	return n
}

// read is the one reading of a value: GetFor's, which WARNs, and Check's,
// which reports (log nil).
func (v *scalar[T]) read(s string, log Logger, prefix string) (T, Verdict) {
	n, err := v.parse(s)
	var vd Verdict
	switch {
	case ReadInPart(err):
		warn(log, prefix, "reading %s=%s as %s: %v", v.s.Name, s, v.show(n), err)
		vd = Verdict{Used: v.show(n), InPart: true, Why: fmt.Sprintf("%v; the plugin uses %s", err, v.show(n))}
	case err != nil:
		warn(log, prefix, "ignoring %s=%s: %v; using the default %s", v.s.Name, s, err, v.show(v.def))
		return v.def, Verdict{Used: v.show(v.def), Invalid: true, Why: fmt.Sprintf("%v; the plugin uses the default %s", err, v.show(v.def))}
	default:
		vd = Verdict{Used: v.show(n)}
	}
	if v.ranged && (n < v.lo || n > v.hi) {
		use, what := v.def, "the default "
		if v.clamps {
			use, what = min(max(n, v.lo), v.hi), ""
		}
		warn(log, prefix, "ignoring %s=%s: must be in [%s, %s]; using %s", v.s.Name, s, v.show(v.lo), v.show(v.hi), v.show(use))
		why := fmt.Sprintf("%s must be in [%s, %s]; the plugin uses %s%s", v.show(n), v.show(v.lo), v.show(v.hi), what, v.show(use))
		if vd.InPart {
			why = strings.TrimSuffix(vd.Why, "; the plugin uses "+v.show(n)) + "; " + why
		}
		return use, Verdict{Used: v.show(use), InPart: vd.InPart, Invalid: true, Why: why}
	}
	return n, vd
}

// Check is the setting's registered check: what its reader makes of s. A
// package whose rule goes beyond the declaration builds its own on it
// (SetCheck).
func (v *scalar[T]) Check(s string) Verdict {
	_, vd := v.read(s, nil, "")
	return vd
}

// IntVar is an integer setting read as NCCL reads integers (ParseInt).
type IntVar struct{ scalar[int64] }

// Int declares an integer setting.
func (g *Group) Int(name string, def int64, doc string) *IntVar {
	show := func(n int64) string { return strconv.FormatInt(n, 10) }
	v := &IntVar{scalar[int64]{base: g.declare(name, KindInt, show(def), doc), def: def, parse: ParseInt, show: show}}
	setCheck(name, v.Check)
	return v
}

// In makes values outside [lo, hi] a WARN and the default.
func (v *IntVar) In(lo, hi int64) *IntVar { v.setBounds(lo, hi, false); return v }

// Clamp makes values outside [lo, hi] a WARN and the nearest bound.
func (v *IntVar) Clamp(lo, hi int64) *IntVar { v.setBounds(lo, hi, true); return v }

// ShowDefault sets how the registry shows the default (e.g. "auto" for a
// sentinel value).
func (v *IntVar) ShowDefault(text string) *IntVar { v.showDefault(text); return v }

// Uint64Var is an unsigned 64-bit setting (NCCL_SOCKET_MAGIC).
type Uint64Var struct{ scalar[uint64] }

// Uint64 declares an unsigned setting, shown in hex.
func (g *Group) Uint64(name string, def uint64, doc string) *Uint64Var {
	show := func(n uint64) string { return fmt.Sprintf("%#x", n) }
	v := &Uint64Var{scalar[uint64]{base: g.declare(name, KindUint64, show(def), doc), def: def, parse: ParseUint64, show: show}}
	setCheck(name, v.Check)
	return v
}

// BoolVar is a switch (ParseBool).
type BoolVar struct{ scalar[int] }

// Bool declares a switch.
func (g *Group) Bool(name string, def bool, doc string) *BoolVar {
	d := 0
	if def {
		d = 1
	}
	parse := func(s string) (int, error) {
		b, err := ParseBool(s)
		if b {
			return 1, err
		}
		return 0, err
	}
	v := &BoolVar{scalar[int]{base: g.declare(name, KindBool, strconv.Itoa(d), doc), def: d, parse: parse, show: strconv.Itoa}}
	setCheck(name, v.Check)
	return v
}

// Get reads the value, WARNing with the group's prefix.
func (v *BoolVar) Get(log Logger) bool { return v.scalar.Get(log) != 0 }

// DurationVar is a duration setting: a bare number in its unit, or a Go
// duration (ParseDuration).
type DurationVar struct{ scalar[time.Duration] }

// Duration declares a duration whose bare numbers are in unit.
func (g *Group) Duration(name string, def, unit time.Duration, doc string) *DurationVar {
	parse := func(s string) (time.Duration, error) { return ParseDuration(s, unit) }
	v := &DurationVar{scalar[time.Duration]{base: g.declare(name, KindDuration, def.String(), doc), def: def, parse: parse, show: time.Duration.String}}
	setCheck(name, v.Check)
	return v
}

// In makes values outside [lo, hi] a WARN and the default.
func (v *DurationVar) In(lo, hi time.Duration) *DurationVar { v.setBounds(lo, hi, false); return v }

// Clamp makes values outside [lo, hi] a WARN and the nearest bound.
func (v *DurationVar) Clamp(lo, hi time.Duration) *DurationVar { v.setBounds(lo, hi, true); return v }

// FamilyVar is an address family selection (ParseFamily).
type FamilyVar struct{ scalar[Family] }

// Family declares an address family setting.
func (g *Group) Family(name string, def Family, doc string) *FamilyVar {
	v := &FamilyVar{scalar[Family]{base: g.declare(name, KindFamily, def.String(), doc), def: def, parse: ParseFamily, show: Family.String}}
	setCheck(name, v.Check)
	return v
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
	setCheck(name, v.Check)
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

// Check is the list's registered check: entries skipped or read differently
// make it InPart (the rest of the list is used).
func (v *ListVar) Check(s string) Verdict {
	if _, notes := ParseList(s, v.max); len(notes) > 0 {
		return Verdict{Used: s, InPart: true, Why: strings.Join(notes, "; ")}
	}
	return Verdict{Used: s}
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
