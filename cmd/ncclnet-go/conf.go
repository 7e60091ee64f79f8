package main

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strings"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
)

// NCCL reads two configuration files at its first use of a setting
// (src/misc/param.cc initEnvFunc): NCCL_CONF_FILE if set and non-empty,
// otherwise ~/.nccl.conf of the user in the password database (not $HOME),
// then /etc/nccl.conf. Each "NAME=VALUE" line is applied with setenv(...,
// overwrite=0), so the environment wins over both files and the user's file
// over /etc. The plugin reads its settings after NCCL did that, through C
// getenv, so the files configure the plugin as well. This tool applies the
// same rules to show what the plugin would see inside NCCL.

var (
	etcConf  = "/etc/nccl.conf"
	userHome = func() string {
		if u, err := user.Current(); err == nil {
			return u.HomeDir
		}
		return ""
	}
	// environ and environNames are the process environment (tests replace
	// them).
	environ      = os.LookupEnv
	environNames = func() []string {
		var n []string
		for _, kv := range os.Environ() {
			name, _, _ := strings.Cut(kv, "=")
			n = append(n, name)
		}
		return n
	}
)

// srcEnv is the source of a value taken from the process environment.
const srcEnv = "env"

// confFile is one parsed configuration file.
type confFile struct {
	path   string
	vals   map[string]string
	order  []string
	err    error // reading it failed (absent files are not an error)
	exists bool
}

// readConf parses a file the way setEnvFile does: lines starting with '#'
// are skipped, a line without '=' is ignored, the name is everything before
// the first '=' and the value everything after it (no trimming; a trailing
// newline is dropped), both cut at 1023 bytes.
func readConf(path string) confFile {
	f := confFile{path: path, vals: map[string]string{}}
	b, err := os.ReadFile(path)
	if err != nil {
		if !os.IsNotExist(err) {
			f.err = err
		}
		return f
	}
	f.exists = true
	// getline: lines end at '\n' only (a '\r' stays in the value).
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.IndexByte(line, '=')
		if i <= 0 {
			continue // no '=', or an empty name setenv refuses
		}
		name, val := cut1023(line[:i]), cut1023(line[i+1:])
		if _, dup := f.vals[name]; !dup {
			f.order = append(f.order, name)
		}
		// setenv(overwrite=0) on a name the same file set earlier keeps the
		// first value.
		if _, dup := f.vals[name]; !dup {
			f.vals[name] = val
		}
	}
	return f
}

func cut1023(s string) string {
	if len(s) > 1023 {
		return s[:1023]
	}
	return s
}

// ncclConf is the environment NCCL would give the plugin: the process
// environment, then the configuration files in NCCL's order.
type ncclConf struct {
	files []confFile
}

func loadConf() *ncclConf {
	c := &ncclConf{}
	if p, ok := environ("NCCL_CONF_FILE"); ok && p != "" {
		c.files = append(c.files, readConf(p))
	} else if h := userHome(); h != "" {
		c.files = append(c.files, readConf(filepath.Join(h, ".nccl.conf")))
	}
	c.files = append(c.files, readConf(etcConf))
	return c
}

// lookup returns name's value and where it comes from: "env", or the path of
// the configuration file that set it.
func (c *ncclConf) lookup(name string) (string, string, bool) {
	if v, ok := environ(name); ok {
		return v, srcEnv, true
	}
	for _, f := range c.files {
		if v, ok := f.vals[name]; ok {
			return v, f.path, true
		}
	}
	return "", "", false
}

// install makes the nccl packages read settings as the plugin would inside
// NCCL.
func (c *ncclConf) install() {
	ncclenv.SetLookup(func(name string) (string, bool) {
		v, _, ok := c.lookup(name)
		return v, ok
	})
}

// environment is the process environment with the files' values added
// (for the selftest helper, which is not NCCL and does not read them).
func (c *ncclConf) environment(base []string) []string {
	have := map[string]bool{}
	for _, kv := range base {
		if i := strings.IndexByte(kv, '='); i > 0 {
			have[kv[:i]] = true
		}
	}
	out := append([]string(nil), base...)
	for _, f := range c.files {
		for _, n := range f.order {
			if !have[n] {
				have[n] = true
				out = append(out, n+"="+f.vals[n])
			}
		}
	}
	return out
}

// warnProblems says which configuration files exist but cannot be read.
func (c *ncclConf) warnProblems(cl *cli, cmd string) {
	for _, f := range c.files {
		if f.err != nil {
			fmt.Fprintf(cl.stderr, "ncclnet-go %s: cannot read %s: %v (NCCL skips it too)\n", cmd, f.path, f.err)
		}
	}
}
