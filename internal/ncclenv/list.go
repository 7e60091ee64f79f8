package ncclenv

import (
	"fmt"
	"strconv"
	"strings"
)

// NCCL's list limits: MAX_IFS entries in NCCL_SOCKET_IFNAME, MAX_IB_DEVS in
// NCCL_IB_HCA. Entries past the limit are dropped, as NCCL drops them.
const (
	MaxIfs    = 16
	MaxIBDevs = 32
)

// Entry is one item of an NCCL interface or HCA list:
// <name>[:<port>[:<rail>[:<plane>]]]. An absent or empty number is -1, which
// for the port means "any port".
type Entry struct {
	Name  string
	Port  int
	Rail  int // NCCL 2.30: the rail this HCA port belongs to
	Plane int // NCCL 2.30: the plane inside the rail
}

func (e Entry) String() string {
	s := e.Name
	fields := []int{e.Port, e.Rail, e.Plane}
	last := -1
	for i, f := range fields {
		if f != -1 {
			last = i
		}
	}
	for i := 0; i <= last; i++ {
		s += ":"
		if fields[i] != -1 {
			s += strconv.Itoa(fields[i])
		}
	}
	return s
}

// List is a parsed NCCL_SOCKET_IFNAME / NCCL_IB_HCA value, as NCCL's
// parseStringList and matchIfList read it: a leading '^' excludes the
// entries instead of selecting them, a following '=' makes names exact
// instead of prefixes, entries are separated by commas (empty ones vanish).
type List struct {
	Exclude bool
	Exact   bool
	Entries []Entry
}

// ParseList parses s, keeping at most max entries. Anything NCCL would read
// differently from what the user probably meant comes back as a note (the
// caller WARNs each one); the list is still the one NCCL would use.
func ParseList(s string, max int) (List, []string) {
	var l List
	var notes []string
	if strings.HasPrefix(s, "^") {
		l.Exclude, s = true, s[1:]
	}
	if strings.HasPrefix(s, "=") {
		l.Exact, s = true, s[1:]
	}
	dropped := 0
	for _, item := range strings.Split(s, ",") {
		if item == "" {
			continue
		}
		fields := strings.Split(item, ":")
		if fields[0] == "" {
			notes = append(notes, fmt.Sprintf("entry %q has no name; NCCL skips it", item))
			continue
		}
		if len(l.Entries) == max {
			dropped++
			continue
		}
		if strings.ContainsAny(fields[0], " \t") {
			notes = append(notes, fmt.Sprintf("entry %q contains white space, which NCCL matches literally", item))
		}
		e := Entry{Name: fields[0], Port: -1, Rail: -1, Plane: -1}
		nums := []*int{&e.Port, &e.Rail, &e.Plane}
		what := []string{"port", "rail", "plane"}
		for i, f := range fields[1:] {
			if i == len(nums) {
				notes = append(notes, fmt.Sprintf("entry %q has more than %s:port:rail:plane; NCCL ignores the rest", item, fields[0]))
				break
			}
			if f == "" {
				continue
			}
			*nums[i] = atoi(f)
			if n, err := strconv.Atoi(f); err != nil || n != *nums[i] {
				notes = append(notes, fmt.Sprintf("%s %q in entry %q is not a decimal number; NCCL reads it as %d", what[i], f, item, *nums[i]))
			} else if i == 0 && n == 0 {
				notes = append(notes, fmt.Sprintf("port 0 in entry %q matches no port (ports are numbered from 1)", item))
			}
		}
		l.Entries = append(l.Entries, e)
	}
	if dropped > 0 {
		notes = append(notes, fmt.Sprintf("more than %d entries; NCCL uses the first %d and ignores %d", max, max, dropped))
	}
	return l, notes
}

// atoi is C's atoi: leading white space, an optional sign, then as many
// decimal digits as there are; no digits reads as 0.
func atoi(s string) int {
	s = strings.TrimLeft(s, " \t\n\v\f\r")
	neg := false
	if s != "" && (s[0] == '-' || s[0] == '+') {
		neg, s = s[0] == '-', s[1:]
	}
	n := 0
	for i := 0; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
		if n > (1<<31-1)/10 {
			break // C's atoi is undefined past INT_MAX; stop growing
		}
		n = n*10 + int(s[i]-'0')
	}
	if neg {
		return -n
	}
	return n
}

// Match reports whether port of the device or interface name is selected.
// port -1 means "any port" (interface lists never pass one). An empty list
// selects everything, so "^" alone selects nothing.
func (l List) Match(name string, port int) bool {
	_, ok := l.MatchEntry(name, port)
	return ok
}

// MatchEntry is Match that also returns the index of the entry that matched
// (-1 when none did, e.g. for an empty or an exclusion list that let the name
// through), so a caller can use the entry's rail and plane.
func (l List) MatchEntry(name string, port int) (entry int, selected bool) {
	hit := len(l.Entries) == 0
	entry = -1
	for i, e := range l.Entries {
		nameOK := name == e.Name || !l.Exact && strings.HasPrefix(name, e.Name)
		if nameOK && (port == -1 || e.Port == -1 || port == e.Port) {
			hit, entry = true, i
			break
		}
	}
	if l.Exclude {
		return -1, !hit
	}
	return entry, hit
}

func (l List) String() string {
	var b strings.Builder
	if l.Exclude {
		b.WriteByte('^')
	}
	if l.Exact {
		b.WriteByte('=')
	}
	for i, e := range l.Entries {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e.String())
	}
	return b.String()
}
