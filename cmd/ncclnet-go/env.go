package main

import (
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"

	// Every package that declares settings is linked, so the registry lists
	// all of them: the glue's, the metrics', the transports', and the shm
	// example's (which only libnccl-net-shm.so reads).
	_ "github.com/libnccl-net-go/libnccl-net-go/example/shm"
	_ "github.com/libnccl-net-go/libnccl-net-go/metrics"
	_ "github.com/libnccl-net-go/libnccl-net-go/plugin"
)

// envSetting is one row of `ncclnet-go env`.
type envSetting struct {
	Name    string `json:"name"`
	Value   string `json:"value,omitempty"`
	Set     bool   `json:"set"`
	Source  string `json:"source"` // env, a configuration file's path, or default
	Default string `json:"default"`
	Owner   string `json:"owner"`
	Kind    string `json:"kind"`
	Range   string `json:"range,omitempty"`
	Doc     string `json:"doc"`
	// Problem is "invalid" (the plugin ignores the value) or "read in part"
	// (it uses only part of it), with Why ending in what it uses instead;
	// empty when the plugin uses the value as written.
	Problem string `json:"problem,omitempty"`
	Why     string `json:"why,omitempty"`
}

// envWarning is a set NCCL_GO_* name nothing declares.
type envWarning struct {
	Name       string `json:"name"`
	Source     string `json:"source"`
	Suggestion string `json:"did_you_mean,omitempty"`
}

type envReport struct {
	Files    []string     `json:"files"` // configuration files read, in NCCL's order
	Settings []envSetting `json:"settings"`
	Unknown  []envWarning `json:"unknown"`
	// Foreign lists set NCCL_* variables the plugin does not read (NCCL
	// itself may): worth knowing when a setting seems to have no effect.
	// The lists are [] when empty, never null or absent: a script iterates
	// them (jq '.unknown[]') without a special case.
	Foreign []string `json:"not_read_by_plugin"`
}

// nameSource pairs a set variable with where it was set.
type nameSource struct{ name, source string }

func runEnv(c *cli, args []string) error {
	fs := newFlags(c, "env", "[--set] [--json]", `
Lists every NCCL_* and NCCL_GO_* variable libnccl-net-go reads (and the
launcher variables it takes the local rank from): its value, its default and
where the value comes from. NCCL applies NCCL_CONF_FILE (or ~/.nccl.conf)
and /etc/nccl.conf to the environment without overriding it, and the plugin
reads its settings after that, so the source is "env", the configuration
file that set it, or "default".

Each set value is read as the plugin reads it: one it would ignore (not a
number, out of range) or read only in part ("256k" is 256) is reported
with what the plugin uses instead, and the exit status is 1. A set
NCCL_GO_* variable the plugin does not know is almost always a typo: it is
reported with the closest known name, and the exit status is 1. Set NCCL_*
variables the plugin does not read are listed as well (NCCL itself may read
them).`)
	onlySet := fs.Bool("set", false, "list only the variables that are set")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if err := fs.parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	conf := loadConf()
	// A check may read another setting (NCCL_IB_ADDR_RANGE's family), which
	// must come from where the plugin would take it: the files too.
	conf.install()
	defer ncclenv.SetLookup(nil)
	r := buildEnvReport(conf, *onlySet)
	conf.warnProblems(c, "env")
	if *asJSON {
		if err := printJSON(c.stdout, r); err != nil {
			return err
		}
	} else {
		printEnv(c, r)
	}
	var msgs []string
	var bad []string
	for _, s := range r.Settings {
		if s.Problem != "" {
			bad = append(bad, s.Name)
		}
	}
	if len(bad) > 0 {
		msgs = append(msgs, fmt.Sprintf("%d setting(s) the plugin would ignore or read only in part: %s", len(bad), strings.Join(bad, ", ")))
	}
	if len(r.Unknown) > 0 {
		var n []string
		for _, u := range r.Unknown {
			n = append(n, u.Name)
		}
		msgs = append(msgs, fmt.Sprintf("%d set NCCL_GO_* variable(s) the plugin does not know (a typo?): %s", len(n), strings.Join(n, ", ")))
	}
	if len(msgs) > 0 {
		return failure{strings.Join(msgs, "; ")}
	}
	return nil
}

// setNames lists every NCCL_* and launcher name that is set, in the
// environment or a configuration file, with its source.
func setNames(conf *ncclConf) []nameSource {
	seen := map[string]bool{}
	var out []nameSource
	for _, name := range environNames() {
		if _, ok := environ(name); ok && !seen[name] {
			seen[name] = true
			out = append(out, nameSource{name, srcEnv})
		}
	}
	for _, f := range conf.files {
		for _, name := range f.order {
			if !seen[name] {
				seen[name] = true
				out = append(out, nameSource{name, f.path})
			}
		}
	}
	return out
}

func buildEnvReport(conf *ncclConf, onlySet bool) envReport {
	r := envReport{Files: []string{}, Settings: []envSetting{}, Unknown: []envWarning{}, Foreign: []string{}}
	for _, f := range conf.files {
		state := "absent"
		if f.exists {
			state = "read"
		} else if f.err != nil {
			state = "unreadable"
		}
		r.Files = append(r.Files, f.path+" ("+state+")")
	}
	for _, s := range ncclenv.All() {
		v, src, ok := conf.lookup(s.Name)
		if !ok {
			src = "default"
		}
		if onlySet && !ok {
			continue
		}
		row := envSetting{Name: s.Name, Value: v, Set: ok, Source: src, Default: s.Default,
			Owner: s.Owner, Kind: string(s.Kind), Range: s.Range, Doc: s.Doc}
		if ok {
			row.Problem, row.Why = checkSetting(s, v)
		}
		r.Settings = append(r.Settings, row)
	}
	set := setNames(conf)
	source := map[string]string{}
	var kv []string
	for _, ns := range set {
		source[ns.name] = ns.source
		kv = append(kv, ns.name+"=")
	}
	// The registry decides which NCCL_GO_* names are typos.
	for _, name := range ncclenv.Undeclared(kv) {
		r.Unknown = append(r.Unknown, envWarning{Name: name, Source: source[name], Suggestion: ncclenv.Suggest(name)})
	}
	for _, ns := range set {
		if _, known := ncclenv.Find(ns.name); !known && strings.HasPrefix(ns.name, "NCCL_") && !strings.HasPrefix(ns.name, ncclenv.OwnPrefix) {
			r.Foreign = append(r.Foreign, ns.name)
		}
	}
	sort.Slice(r.Unknown, func(i, j int) bool { return r.Unknown[i].Name < r.Unknown[j].Name })
	sort.Strings(r.Foreign)
	return r
}

func printEnv(c *cli, r envReport) {
	w := c.stdout
	fmt.Fprintf(w, "settings libnccl-net-go reads, as it would see them inside NCCL\n")
	fmt.Fprintf(w, "configuration files (NCCL's order; the environment wins): %s\n\n", strings.Join(r.Files, ", "))
	if len(r.Settings) == 0 {
		fmt.Fprintln(w, "(none)")
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if len(r.Settings) > 0 {
		fmt.Fprintln(tw, "NAME\tVALUE\tDEFAULT\tSOURCE\tREAD BY")
	}
	for _, s := range r.Settings {
		v := s.Value
		if !s.Set {
			v = "-"
		} else if v == "" {
			v = `""`
		}
		def := s.Default
		if def == "" {
			def = "unset"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Name, v, def, s.Source, s.Owner)
	}
	tw.Flush()
	problems := false
	for _, s := range r.Settings {
		if s.Problem != "" {
			if !problems {
				fmt.Fprintln(w)
				problems = true
			}
			fmt.Fprintf(w, "%s: %s=%s (%s): %s\n", s.Problem, s.Name, s.Value, s.Source, s.Why)
		}
	}
	for _, u := range r.Unknown {
		hint := ""
		if u.Suggestion != "" {
			hint = "; did you mean " + u.Suggestion + "?"
		}
		fmt.Fprintf(w, "\nwarning: %s is set (%s) but libnccl-net-go reads no such variable%s", u.Name, u.Source, hint)
	}
	if len(r.Unknown) > 0 {
		fmt.Fprintln(w)
	}
	if len(r.Foreign) > 0 {
		fmt.Fprintf(w, "\nset, not read by libnccl-net-go (NCCL itself may read them): %s\n", strings.Join(r.Foreign, " "))
	}
}
