package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// helperName is the C program that loads the library (a Go program cannot
// dlopen a Go c-shared library: two Go runtimes in one process).
const helperName = "ncclnet-go-selftest"

func runSelftest(c *cli, args []string) error {
	fs := newFlags(c, "selftest", "[--transport ib|socket] [--size BYTES] [--iters N] [--lat-size BYTES] [--lat-iters N] [--timeout DURATION] [--plugin NAME|PATH] [--helper PATH] [--json] [-v]", `
A node health check for a job prologue: two processes load the installed
libnccl-net-go through its C ABI exactly as NCCL does (dlopen, then the
ncclNetPlugin_vN table), connect, move --iters messages of --size bytes each
way with every byte verified, then time a verified ping-pong. Prints GB/s per
direction and the round-trip latency; exit status 0 means PASS, 1 FAIL.

The library is what NCCL_NET_PLUGIN names (from the environment, else
NCCL_CONF_FILE or ~/.nccl.conf, then /etc/nccl.conf), else "go"; --plugin
overrides it. It is resolved as NCCL resolves it: a path, or a name NCCL
turns into libnccl-net-<name>.so on the library search path; a
comma-separated list is tried in order and the first library that loads is
tested. The processes see the environment NCCL would give the plugin (the
configuration files fill in unset variables), minus the metrics exposure
variables: a health check must not take a job's metrics ports.

--timeout bounds the whole test, not each step: a step after a slow one
gets only what is left. A process still working when the test has run that
long fails, naming the step it was in (one stuck inside a plugin call is
killed 2 s later).

SIGTERM or Ctrl-C stops the test at once: the processes are killed and
reaped, the step each was in is printed, and the exit status is 143 (130
for SIGINT).`)
	transport := fs.String("transport", "", "force the transport, `ib|socket` (sets NCCL_GO_TRANSPORT); default: the one the plugin picks")
	plugin := fs.String("plugin", "", "library to load, a `NAME|PATH` as NCCL_NET_PLUGIN takes it (default: NCCL_NET_PLUGIN, else go)")
	size := fs.String("size", "64M", "`BYTES` per message, suffix K, M or G (at most 1G, NCCL's largest message)")
	iters := fs.Int("iters", 8, "`N` messages each way")
	latSize := fs.String("lat-size", "8", "`BYTES` per ping-pong message")
	latIters := fs.Int("lat-iters", 1000, "`N` ping-pong round trips")
	timeout := fs.Duration("timeout", 120*time.Second, "fail when the test takes longer than this `DURATION` (5s to 24h)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	verbose := fs.Bool("v", false, "print the library's source and what the plugin logged even when the test passes")
	helper := fs.String("helper", "", "`PATH` of the "+helperName+" program (default: next to ncclnet-go, else in ../libexec/ncclnet-go, else in /usr/libexec/ncclnet-go)")
	if err := fs.parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	switch *transport {
	case "", "ib", "socket":
	default:
		return usagef("--transport %q: use ib or socket", *transport)
	}
	sizeN, err := parseSize(*size)
	if err != nil {
		return usagef("--size %s: %v", *size, err)
	}
	latSizeN, err := parseSize(*latSize)
	if err != nil {
		return usagef("--lat-size %s: %v", *latSize, err)
	}
	if *iters < 1 || *iters > 1000000 {
		return usagef("--iters %d: use 1 to 1000000", *iters)
	}
	if *latIters < 1 || *latIters > 100000 {
		return usagef("--lat-iters %d: use 1 to 100000", *latIters)
	}
	// The helper's own limits: what passes here, it accepts.
	if *timeout < minSelftestTimeout || *timeout > maxSelftestTimeout {
		return usagef("--timeout %v: use 5s to 24h", *timeout)
	}
	conf := loadConf()
	lib, err := selftestPlugin(conf, fs, *plugin)
	var fail failure
	if errors.As(err, &fail) && *asJSON {
		if jerr := printJSON(c.stdout, map[string]any{"pass": false, "result": "fail", "reason": fail.msg,
			"plugin": lib.value, "plugin_source": lib.source()}); jerr != nil {
			return jerr
		}
	}
	if err != nil {
		return err
	}
	// A check that fails before the helper said PASS or FAIL is a failure
	// too: --json prints it, for the script that reads stdout.
	failed := func(err error) error {
		if *asJSON {
			if jerr := printJSON(c.stdout, map[string]any{"pass": false, "result": "fail", "reason": oneLine(err.Error()),
				"plugin": lib.value, "plugin_source": lib.source()}); jerr != nil {
				return jerr
			}
		}
		return err
	}
	if entries := pluginEntries(lib.value); len(entries) == 1 && strings.Contains(entries[0], "/") {
		if _, err := os.Stat(entries[0]); err != nil {
			if lib.origin == "--plugin" {
				return failed(fmt.Errorf("--plugin %s: %v", entries[0], errors.Unwrap(err)))
			}
			return failed(fmt.Errorf("NCCL_NET_PLUGIN=%s (%s): %v", entries[0], lib.origin, errors.Unwrap(err)))
		}
	}
	h, err := findHelper(c.exe, *helper)
	if err != nil {
		return failed(err)
	}
	// Numbers go to the helper as plain decimal, never as the text given:
	// it reads sizes with C's strtoull (base 0: "010" is octal) and knows
	// no lower-case "m"/"g", so re-reading the text could test another
	// size than the one checked here, or refuse one accepted here.
	argv := []string{"run", "--plugin", lib.value, "--size", strconv.FormatInt(sizeN, 10), "--iters", strconv.Itoa(*iters),
		"--lat-size", strconv.FormatInt(latSizeN, 10), "--lat-iters", strconv.Itoa(*latIters),
		"--timeout", strconv.FormatFloat(timeout.Round(time.Millisecond).Seconds(), 'f', 3, 64)}
	env := conf.environment(os.Environ())
	env = withoutVars(env, "NCCL_GO_METRICS_PORT", "NCCL_GO_METRICS_TEXTFILE_DIR")
	if *transport != "" {
		env = append(withoutVars(env, "NCCL_GO_TRANSPORT"), "NCCL_GO_TRANSPORT="+*transport)
	}
	start := time.Now()
	cmd := exec.Command(h, argv...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// The helper bounds itself; this bound only catches a helper that
	// cannot even do that.
	sig, timedOut, runErr := runHelper(c, cmd, *timeout+time.Minute)
	res := parseResult(stdout.String())
	if sig != nil {
		return selftestInterrupted(c, sig, time.Since(start), res, stderr.String(), *asJSON, *verbose)
	}
	var exit *exec.ExitError
	if res == nil && !timedOut && errors.As(runErr, &exit) && exit.ExitCode() == 2 {
		return selftestHelperUsage(c, h, stderr.String(), *asJSON)
	}
	if res == nil {
		msg := "the helper printed no result"
		if runErr != nil {
			msg = fmt.Sprintf("%s failed: %v", h, runErr)
		}
		if timedOut {
			msg = fmt.Sprintf("%s did not finish within %v", h, *timeout+time.Minute)
		}
		if s := strings.TrimSpace(stderr.String()); s != "" {
			fmt.Fprintln(c.stderr, s)
		}
		return failed(errors.New(msg))
	}
	pass := res["result"] == "pass" && runErr == nil
	if *transport != "" && pass && res["transport"] != *transport {
		pass = false
		res["result"], res["reason"] = "fail", fmt.Sprintf("asked for transport %s, the plugin used %s", *transport, res["transport"])
	}
	if *asJSON {
		out := map[string]any{"pass": pass}
		for k, v := range res {
			out[k] = resultValue(k, v)
		}
		out["plugin"], out["plugin_source"] = lib.value, lib.source()
		if err := printJSON(c.stdout, out); err != nil {
			return err
		}
	} else {
		printSelftest(c, res, pass, lib, *verbose)
	}
	if !pass || *verbose {
		if s := strings.TrimSpace(stderr.String()); s != "" {
			fmt.Fprintf(c.stderr, "plugin log:\n%s\n", s)
		}
	}
	if !pass {
		return failure{}
	}
	return nil
}

// The helper's limits for --timeout (its --timeout SEC takes 5 to 86400).
const (
	minSelftestTimeout = 5 * time.Second
	maxSelftestTimeout = 24 * time.Hour
)

// pluginChoice is the library selftest loads and where that came from.
type pluginChoice struct {
	value string // as NCCL_NET_PLUGIN takes it: a name, a path, or a list of them
	// origin is "--plugin", "default", or where NCCL_NET_PLUGIN was set:
	// "env" or a configuration file's path.
	origin string
}

// source says where the value came from, for people and for --json.
func (p pluginChoice) source() string {
	if p.origin == "--plugin" || p.origin == "default" {
		return p.origin
	}
	return "NCCL_NET_PLUGIN (" + p.origin + ")"
}

func (p pluginChoice) String() string { return fmt.Sprintf("%q from %s", p.value, p.source()) }

// selftestPlugin picks the library as a job's NCCL would: --plugin, else
// NCCL_NET_PLUGIN from the environment or the configuration files, else
// "go". (NCCL itself, with NCCL_NET_PLUGIN unset, loads libnccl-net.so,
// which may be another vendor's plugin; the check is of libnccl-net-go.)
func selftestPlugin(conf *ncclConf, fs *flags, flagValue string) (pluginChoice, error) {
	explicit := false
	fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "plugin" })
	if explicit {
		if len(pluginEntries(flagValue)) == 0 {
			return pluginChoice{}, usagef("--plugin %q: give a library name or path (NCCL loads no plugin with this value)", flagValue)
		}
		return pluginChoice{flagValue, "--plugin"}, nil
	}
	v, src, ok := conf.lookup("NCCL_NET_PLUGIN")
	if !ok {
		return pluginChoice{"go", "default"}, nil
	}
	p := pluginChoice{v, src}
	if len(pluginEntries(v)) == 0 {
		// A job with this setting would not load libnccl-net-go at all.
		return p, failure{fmt.Sprintf("NCCL_NET_PLUGIN=%q (%s): NCCL loads no net plugin with this value, so jobs here would not use libnccl-net-go; set NCCL_NET_PLUGIN=go, or pass --plugin to test the library anyway", v, src)}
	}
	return p, nil
}

// pluginEntries is NCCL_NET_PLUGIN as NCCL splits it (src/plugin/net.cc):
// "none" (any case) means no plugin, otherwise the value is a list of names
// or paths separated by commas, empty entries dropped, nothing trimmed.
func pluginEntries(v string) []string {
	if strings.EqualFold(v, "none") {
		return nil
	}
	var out []string
	for _, e := range strings.Split(v, ",") {
		if e != "" {
			out = append(out, e)
		}
	}
	return out
}

// selftestHelperUsage reports a helper that refused the arguments
// ncclnet-go gave it: they were checked here, so the helper is most likely
// from another version of the package.
func selftestHelperUsage(c *cli, helper, stderr string, asJSON bool) error {
	why := oneLine(stderr)
	if why == "" {
		why = "exit status 2, no message"
	}
	msg := fmt.Sprintf("%s refused its arguments: %s; it may belong to another version of ncclnet-go (install the package again, or pass --helper PATH)", helper, why)
	if asJSON {
		if err := printJSON(c.stdout, map[string]any{"pass": false, "result": "usage", "reason": msg}); err != nil {
			return err
		}
	}
	return usageError{msg}
}

// helperGrace is how long a helper told to stop may take to stop and reap
// its processes and say where they were, before its whole process group is
// killed; and how long after that kill ncclnet-go waits for it.
const helperGrace = 2 * time.Second

// helpers are the process groups of the helpers running now: a second
// SIGINT or SIGTERM kills them before ncclnet-go exits (main).
var helpers struct {
	sync.Mutex
	pgids map[int]bool
}

func trackHelper(pgid int, on bool) {
	helpers.Lock()
	defer helpers.Unlock()
	if helpers.pgids == nil {
		helpers.pgids = map[int]bool{}
	}
	if on {
		helpers.pgids[pgid] = true
	} else {
		delete(helpers.pgids, pgid)
	}
}

// killHelpers kills every running helper's process group and reaps what it
// can within helperGrace (main, at a second signal, just before it exits).
func killHelpers() {
	helpers.Lock()
	n := len(helpers.pgids)
	for pgid := range helpers.pgids {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
	helpers.Unlock()
	if n > 0 {
		reapOrphans(helperGrace)
	}
}

// reapOrphans waits for this process's ended children: the processes of a
// killed helper's group were re-parented to ncclnet-go (a child subreaper,
// see runHelper) when the helper died with them, and must not stay zombies
// (in a container whose PID 1 does not reap, they would). It returns when no
// child is left or after limit. Only call it when no exec.Cmd waits for a
// child still running.
func reapOrphans(limit time.Duration) {
	end := time.Now().Add(limit)
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG|unix.WALL, nil)
		switch {
		case err == syscall.EINTR || pid > 0:
			continue
		case err != nil: // ECHILD: none left
			return
		case time.Now().After(end):
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// runHelper runs the selftest helper in a process group of its own (the
// helper, its two processes and anything they start) and waits for it. The
// helper dies with ncclnet-go (Pdeathsig), and its processes with it. The
// first SIGINT or SIGTERM (c.interrupt) is passed on to the helper, which
// kills and reaps its processes and prints the step each was in; what is
// left of the group after helperGrace is killed. It returns the signal that
// interrupted the run (nil when none), whether limit ran out, and how the
// helper ended.
func runHelper(c *cli, cmd *exec.Cmd, limit time.Duration) (sig os.Signal, timedOut bool, err error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// Processes of the group that lose their parent (the helper, killed
	// with them) become ncclnet-go's children, which it reaps, rather than
	// init's.
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	// A process of the group that outlived the helper must not keep Wait
	// reading its output.
	cmd.WaitDelay = helperGrace
	if err := cmd.Start(); err != nil {
		return nil, false, err
	}
	pgid := cmd.Process.Pid
	trackHelper(pgid, true)
	defer trackHelper(pgid, false)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	limitTimer := time.NewTimer(limit)
	defer limitTimer.Stop()
	stop := func() error {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		select {
		case err := <-done:
			reapOrphans(helperGrace)
			return err
		case <-time.After(helperGrace):
			return fmt.Errorf("%s (pid %d) did not end after SIGKILL", cmd.Path, pgid)
		}
	}
	select {
	case err = <-done:
		return nil, false, err
	case <-limitTimer.C:
		return nil, true, stop()
	case <-c.interrupt:
	}
	sig = c.received()
	_ = cmd.Process.Signal(sig)
	select {
	case err = <-done:
		// It reaped its processes; anything they started goes too.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		reapOrphans(helperGrace)
	case <-time.After(helperGrace):
		err = stop()
	}
	return sig, false, err
}

// selftestInterrupted reports a run stopped by a signal: where the two
// processes were when the helper stopped them.
func selftestInterrupted(c *cli, sig os.Signal, elapsed time.Duration, res map[string]string, log string, asJSON, verbose bool) error {
	where := ""
	if res != nil && strings.HasPrefix(res["reason"], "interrupted") {
		where = res["where"]
	}
	if asJSON {
		out := map[string]any{"pass": false, "result": "interrupted", "signal": signalName(sig),
			"reason": "interrupted by " + signalName(sig), "seconds": math.Round(elapsed.Seconds()*10) / 10}
		if where != "" {
			out["where"] = where
		}
		if err := printJSON(c.stdout, out); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(c.stdout, "ncclnet-go selftest: INTERRUPTED by %s after %.1f s; its processes were stopped\n", signalName(sig), elapsed.Seconds())
		if where != "" {
			fmt.Fprintf(c.stdout, "  step      %s\n", where)
		}
	}
	if verbose {
		if s := strings.TrimSpace(log); s != "" {
			fmt.Fprintf(c.stderr, "plugin log:\n%s\n", s)
		}
	}
	return interrupted{sig}
}

func printSelftest(c *cli, r map[string]string, pass bool, lib pluginChoice, verbose bool) {
	w := c.stdout
	if !pass {
		fmt.Fprintf(w, "ncclnet-go selftest: FAIL: %s\n", r["reason"])
		if r["where"] != "" {
			rank := r["rank"]
			if rank == "-" || rank == "" {
				rank = "before the processes started"
			} else {
				rank = "process " + rank
			}
			fmt.Fprintf(w, "  step      %s (%s)\n", r["where"], rank)
		}
		if r["library"] != "" {
			fmt.Fprintf(w, "  library   %s\n", r["library"])
		}
		fmt.Fprintf(w, "  plugin    %s\n", lib)
		return
	}
	fmt.Fprintf(w, "ncclnet-go selftest: PASS\n")
	if verbose {
		fmt.Fprintf(w, "  plugin     %s\n", lib)
	}
	fmt.Fprintf(w, "  library    %s (NCCL net name %q, API %s)\n", r["library"], r["net"], r["api"])
	fmt.Fprintf(w, "  transport  %s, device 0 = %s (%s Mbps)\n", r["transport"], r["device"], r["speed_mbps"])
	size, _ := strconv.Atoi(r["bytes"])
	fmt.Fprintf(w, "  bandwidth  %s GB/s process 1->0, %s GB/s 0->1 (%s x %s each way, every byte verified)\n",
		r["gbps_1to0"], r["gbps_0to1"], r["iters"], fmtBytes(size))
	ls, _ := strconv.Atoi(r["lat_size"])
	fmt.Fprintf(w, "  latency    round trip %s us median, %s us p99 (%s ping-pongs of %s, verified)\n",
		r["rtt_median_us"], r["rtt_p99_us"], r["lat_iters"], fmtBytes(ls))
}

// parseResult reads the helper's last "result=..." line: key=value words,
// where a failure's reason runs to the end of the line and its step (where=,
// the last word before reason=) may have spaces.
func parseResult(out string) map[string]string {
	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "result=") {
			line = l
		}
	}
	if line == "" {
		return nil
	}
	m := map[string]string{}
	if i := strings.Index(line, " reason="); i >= 0 {
		m["reason"] = strings.TrimSpace(line[i+len(" reason="):])
		line = line[:i]
		if j := strings.Index(line, " where="); j >= 0 {
			m["where"] = strings.TrimSpace(line[j+len(" where="):])
			line = line[:j]
		}
	}
	// A value may have spaces (a library path such as
	// "/opt/my plugins/libnccl-net-go.so"): a word that does not start a
	// key=value pair continues the previous value.
	last := ""
	for _, w := range strings.Fields(line) {
		if k, v, ok := strings.Cut(w, "="); ok && resultKey.MatchString(k) {
			m[k], last = v, k
		} else if last != "" {
			m[last] += " " + w
		}
	}
	return m
}

// resultKey is what the helper prints before "=": a lower-case word.
var resultKey = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// numericResults are the helper's keys whose values are numbers; every
// other value (a device, a library, a net name) is text under --json, even
// when it reads as a number: an interface may be named "0", "1e3" or "nan",
// and NaN is not JSON.
var numericResults = map[string]bool{
	"rank": true, "bytes": true, "iters": true, "lat_size": true, "lat_iters": true, "speed_mbps": true,
	"gbps_1to0": true, "gbps_0to1": true, "rtt_median_us": true, "rtt_p99_us": true, "messages": true,
}

// resultValue is one of the helper's values as --json prints it.
func resultValue(k, v string) any {
	if numericResults[k] {
		if f, err := strconv.ParseFloat(v, 64); err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
			return f
		}
	}
	return v
}

// findHelper looks for the helper where make and the packages install it.
func findHelper(exe, flagPath string) (string, error) {
	if flagPath != "" {
		if err := isExecutable(flagPath); err != nil {
			return "", fmt.Errorf("--helper %s: %v", flagPath, err)
		}
		return flagPath, nil
	}
	var tried []string
	if exe != "" {
		if real, err := filepath.EvalSymlinks(exe); err == nil {
			exe = real
		}
		dir := filepath.Dir(exe)
		tried = append(tried, filepath.Join(dir, helperName), filepath.Join(dir, "..", "libexec", "ncclnet-go", helperName))
	}
	tried = append(tried, filepath.Join("/usr/libexec/ncclnet-go", helperName))
	for _, p := range tried {
		if isExecutable(p) == nil {
			return filepath.Clean(p), nil
		}
	}
	return "", fmt.Errorf("cannot find %s (looked for %s); install the package again, or pass --helper PATH", helperName, strings.Join(uniq(tried), ", "))
}

func isExecutable(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return errors.Unwrap(err)
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return errors.New("not an executable file")
	}
	return nil
}

func uniq(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range s {
		x = filepath.Clean(x)
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

func withoutVars(env []string, names ...string) []string {
	out := env[:0:0]
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		drop := false
		for _, n := range names {
			drop = drop || k == n
		}
		if !drop {
			out = append(out, kv)
		}
	}
	return out
}

// parseSize reads a byte count with an optional K, M or G (binary) suffix,
// 1 byte to 1 GiB (NCCL never sends more in one message).
func parseSize(s string) (int64, error) {
	mult := int64(1)
	t := strings.TrimSpace(s)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'k', 'K':
			mult, t = 1<<10, t[:n-1]
		case 'm', 'M':
			mult, t = 1<<20, t[:n-1]
		case 'g', 'G':
			mult, t = 1<<30, t[:n-1]
		}
	}
	v, err := strconv.ParseInt(t, 10, 64)
	if err != nil || v < 1 || v > (1<<30)/mult {
		return 0, errors.New("expected 1 byte to 1G, with an optional K, M or G suffix")
	}
	return v * mult, nil
}

func fmtBytes(n int) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}
