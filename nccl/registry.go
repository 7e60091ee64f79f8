package nccl

import (
	"fmt"
	"sort"
	"strings"
	"sync"
)

// Factory makes a fresh, uninitialised transport.
type Factory func() Transport

// Registration is one registered transport.
type Registration struct {
	Name     string  // as given to Register; NCCL_GO_TRANSPORT matches it in any case
	Priority int     // lower is tried first
	New      Factory // makes a fresh, uninitialised transport
}

var registry struct {
	sync.Mutex
	regs []Registration
}

// Register adds a transport. The plugin tries transports in ascending priority
// (the default library registers ib at 10 and socket at 100) and uses the first
// whose Init succeeds with at least one device; NCCL_GO_TRANSPORT=<name> forces
// one. Names are matched without regard to case, as NCCL matches NCCL_NET,
// and should equal the transport's Name(). Registering a name twice (in any
// case) panics: it is a programming error caught at load.
func Register(name string, priority int, f Factory) {
	registry.Lock()
	defer registry.Unlock()
	for _, r := range registry.regs {
		if strings.EqualFold(r.Name, name) {
			panic(fmt.Sprintf("nccl: transport %q registered twice", name))
		}
	}
	registry.regs = append(registry.regs, Registration{Name: name, Priority: priority, New: f})
	sort.SliceStable(registry.regs, func(i, j int) bool { return registry.regs[i].Priority < registry.regs[j].Priority })
}

// Unregister removes the registration called name and reports whether there
// was one. It is for tests and for programs that register transports at run
// time; the plugin picks its transport once, at init, so removing the one in
// use does not stop it.
func Unregister(name string) bool {
	registry.Lock()
	defer registry.Unlock()
	for i, r := range registry.regs {
		if strings.EqualFold(r.Name, name) {
			registry.regs = append(registry.regs[:i], registry.regs[i+1:]...)
			return true
		}
	}
	return false
}

// Transports lists registrations in the order the plugin tries them.
func Transports() []Registration {
	registry.Lock()
	defer registry.Unlock()
	return append([]Registration(nil), registry.regs...)
}

// Lookup returns the registration called name, in any case
// (NCCL_GO_TRANSPORT=IB finds "ib").
func Lookup(name string) (Registration, bool) {
	for _, r := range Transports() {
		if strings.EqualFold(r.Name, name) {
			return r, true
		}
	}
	return Registration{}, false
}
