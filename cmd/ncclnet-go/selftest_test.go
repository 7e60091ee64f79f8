package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSelftestSocketPasses(t *testing.T) {
	lib, helper := built(t)
	testEnv(t, nil)
	t.Setenv("NCCL_SOCKET_IFNAME", "lo")
	out, errOut, code := runCmd(t, "selftest", "--transport", "socket", "--plugin", lib, "--helper", helper,
		"--size", "1M", "--iters", "4", "--lat-iters", "100")
	require.Equal(t, 0, code, "%s%s", out, errOut)
	assert.Regexp(t, `^ncclnet-go selftest: PASS\n`, out)
	assert.Contains(t, out, "  library    "+mustReal(t, lib)+` (NCCL net name "Go", API v12)`)
	assert.Contains(t, out, "  transport  socket, device 0 = lo")
	assert.Regexp(t, `  bandwidth  \d+\.\d{3} GB/s process 1->0, \d+\.\d{3} GB/s 0->1 \(4 x 1 MiB each way, every byte verified\)`, out)
	assert.Regexp(t, `  latency    round trip \d+\.\d+ us median, \d+\.\d+ us p99 \(100 ping-pongs of 8 B, verified\)`, out)
}

// The plugin is found as NCCL finds it: a name becomes libnccl-net-<name>.so
// on the library search path.
func TestSelftestResolvesPluginNameLikeNCCL(t *testing.T) {
	lib, helper := built(t)
	testEnv(t, nil)
	dir := t.TempDir()
	require.NoError(t, os.Symlink(lib, filepath.Join(dir, "libnccl-net-go.so")))
	t.Setenv("LD_LIBRARY_PATH", dir)
	t.Setenv("NCCL_SOCKET_IFNAME", "lo")
	out, errOut, code := runCmd(t, "selftest", "--helper", helper, "--size", "64K", "--iters", "2", "--lat-iters", "10")
	require.Equal(t, 0, code, "%s%s", out, errOut)
	assert.Contains(t, out, "PASS")

	t.Setenv("LD_LIBRARY_PATH", t.TempDir())
	out, _, code = runCmd(t, "selftest", "--helper", helper, "--plugin", "go")
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "FAIL: cannot load the plugin: go: cannot open shared object file: No such file or directory; libnccl-net-go.so: cannot open shared object file")
}

// A plugin that corrupts data must fail the self-test: every byte is checked.
func TestSelftestDetectsCorruption(t *testing.T) {
	lib, helper := built(t)
	testEnv(t, nil)
	corrupt := filepath.Join(t.TempDir(), "libnccl-net-corrupt.so")
	gcc := exec.Command("gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-I"+filepath.Join(repoRoot, "nccl", "include"),
		"-fPIC", "-shared", "-o", corrupt, filepath.Join("testdata", "corrupt-plugin.c"), "-ldl")
	out, err := gcc.CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Setenv("CORRUPT_PLUGIN_REAL", lib)
	t.Setenv("NCCL_SOCKET_IFNAME", "lo")
	stdout, _, code := runCmd(t, "selftest", "--plugin", corrupt, "--helper", helper, "--size", "64K", "--iters", "2")
	assert.Equal(t, 1, code, stdout)
	assert.Contains(t, stdout, "ncclnet-go selftest: FAIL: message #0: byte 32768 differs from what was sent\n")
}

// testPlugin builds testdata/<name>.c into a plugin library.
func testPlugin(t *testing.T, name string) string {
	t.Helper()
	so := filepath.Join(t.TempDir(), "libnccl-net-"+name+".so")
	gcc := exec.Command("gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-I"+filepath.Join(repoRoot, "nccl", "include"),
		"-fPIC", "-shared", "-o", so, filepath.Join("testdata", name+".c"), "-ldl")
	out, err := gcc.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return so
}

// A registration slower than --timeout is reported in its own step, not in
// the connect/accept step before it.
func TestSelftestSlowRegistrationNamesItsStep(t *testing.T) {
	lib, helper := built(t)
	testEnv(t, nil)
	t.Setenv("REGMR_PLUGIN_REAL", lib)
	t.Setenv("REGMR_PLUGIN_SLEEP", "60")
	t.Setenv("NCCL_SOCKET_IFNAME", "lo")
	start := time.Now()
	out, errOut, code := runCmd(t, "selftest", "--plugin", testPlugin(t, "regmr-plugin"), "--helper", helper,
		"--size", "64K", "--iters", "2", "--timeout", "5500ms")
	assert.Equal(t, 1, code, "%s%s", out, errOut)
	assert.Less(t, time.Since(start), 30*time.Second, "the helper stops the ranks at --timeout")
	assert.Regexp(t, `ncclnet-go selftest: FAIL: not finished within --timeout 5\.5 s \(stopped after \d+\.\d s\)\n`, out)
	assert.Regexp(t, `\n  step      allocating and registering buffers \(2 x 131072 bytes\) \(process [01]\)\n`, out)
}

// The buffers hold the messages that are in flight at once, min(8, --iters),
// and no more: a registration of unused slots pins memory (ib) for nothing,
// 16 GiB per process for --size 1G --iters 1.
func TestSelftestRegistersOnlyTheSlotsItUses(t *testing.T) {
	lib, helper := built(t)
	testEnv(t, nil)
	plugin := testPlugin(t, "regmr-plugin")
	t.Setenv("REGMR_PLUGIN_REAL", lib)
	t.Setenv("NCCL_SOCKET_IFNAME", "lo")
	for _, c := range []struct {
		iters, max string
	}{{"1", "1048576"}, {"2", "2097152"}, {"20", "8388608"}} {
		t.Setenv("REGMR_PLUGIN_MAX", c.max)
		out, errOut, code := runCmd(t, "selftest", "--plugin", plugin, "--helper", helper,
			"--size", "1M", "--iters", c.iters, "--lat-iters", "10")
		assert.Equal(t, 0, code, "--iters %s, registrations of at most %s bytes: %s%s", c.iters, c.max, out, errOut)
	}
}

func TestSelftestForcedIBWithoutRDMAFails(t *testing.T) {
	if hostHasRDMA() {
		t.Skip("this host has RDMA devices; the Soft-RoCE lane runs the ib self-test")
	}
	lib, helper := built(t)
	testEnv(t, nil)
	t.Setenv("NCCL_SOCKET_IFNAME", "lo")
	out, errOut, code := runCmd(t, "selftest", "--transport", "ib", "--plugin", lib, "--helper", helper, "--size", "64K")
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "FAIL: init returned ncclSystemError; the plugin's last WARN: NET/Go : init failed: no usable transport (ib: no usable device:")
	assert.Contains(t, errOut, "plugin log:\n", "the plugin's WARNs are shown on failure")
}

func TestSelftestMetricsVariablesDoNotReachTheHelper(t *testing.T) {
	env := withoutVars([]string{"A=1", "NCCL_GO_METRICS_PORT=9400", "NCCL_GO_METRICS_PORTX=1", "NCCL_GO_METRICS_TEXTFILE_DIR=/x"},
		"NCCL_GO_METRICS_PORT", "NCCL_GO_METRICS_TEXTFILE_DIR")
	assert.Equal(t, []string{"A=1", "NCCL_GO_METRICS_PORTX=1"}, env)
}

func TestSelftestMissingPluginOrHelper(t *testing.T) {
	testEnv(t, nil)
	_, errOut, code := runCmd(t, "selftest", "--plugin", "/nonexistent/libnccl-net-go.so")
	assert.Equal(t, 1, code)
	assert.Equal(t, "ncclnet-go selftest: --plugin /nonexistent/libnccl-net-go.so: no such file or directory\n", errOut)
	_, errOut, code = runCmd(t, "selftest")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "cannot find ncclnet-go-selftest (looked for ")
}

func TestParseResult(t *testing.T) {
	assert.Nil(t, parseResult("noise\n"))
	assert.Equal(t, map[string]string{"result": "fail", "rank": "1", "where": "init", "reason": "x = y; z"},
		parseResult("junk\nresult=fail rank=1 where=init reason=x = y; z\n"))
	assert.Equal(t, map[string]string{"result": "fail", "rank": "0", "where": "receiving (rank 1 -> 0)", "reason": "r"},
		parseResult("result=fail rank=0 where=receiving (rank 1 -> 0) reason=r\n"), "a step has spaces")
	m := parseResult("result=pass library=/x.so gbps_1to0=1.500 gbps_0to1=2.000\n")
	assert.Equal(t, "1.500", m["gbps_1to0"])
	assert.Equal(t, "/x.so", m["library"])
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"1": 1, "64K": 65536, "64M": 64 << 20, "1G": 1 << 30, "1g": 1 << 30} {
		got, err := parseSize(in)
		assert.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, in := range []string{"0", "2G", "-1", "1T", "", "M"} {
		_, err := parseSize(in)
		assert.Error(t, err, in)
	}
}

func mustReal(t *testing.T, p string) string {
	r, err := filepath.EvalSymlinks(p)
	require.NoError(t, err)
	r, err = filepath.Abs(r)
	require.NoError(t, err)
	return r
}

// selftestJSON runs selftest --json and decodes what it printed.
func selftestJSON(t *testing.T, args ...string) (map[string]any, string, int) {
	t.Helper()
	out, errOut, code := runCmd(t, append([]string{"selftest", "--json"}, args...)...)
	var m map[string]any
	if out != "" {
		require.NoError(t, json.Unmarshal([]byte(out), &m), "%s", out)
	}
	return m, errOut, code
}

// The sizes the helper moves are the ones ncclnet-go read: lower-case
// suffixes and leading zeros mean what they mean to --help (until
// 2026-11-28 the helper re-read the text as C does: "1m" was refused, and
// "010" was octal 8).
func TestSelftestSizesMeanWhatTheCommandRead(t *testing.T) {
	lib, helper := built(t)
	testEnv(t, nil)
	t.Setenv("NCCL_SOCKET_IFNAME", "lo")
	for _, c := range []struct {
		size, latSize string
		bytes, lat    float64
	}{{"1m", "1k", 1 << 20, 1 << 10}, {"010", "08", 10, 8}} {
		m, errOut, code := selftestJSON(t, "--plugin", lib, "--helper", helper, "--size", c.size, "--lat-size", c.latSize,
			"--iters", "1", "--lat-iters", "10")
		require.Equal(t, 0, code, "--size %s --lat-size %s: %v %s", c.size, c.latSize, m, errOut)
		assert.Equal(t, c.bytes, m["bytes"], "--size %s", c.size)
		assert.Equal(t, c.lat, m["lat_size"], "--lat-size %s", c.latSize)
	}
}

// A helper that refuses its arguments is a usage problem (status 2), and
// --json still prints a result for the script that reads it.
func TestSelftestHelperRefusingItsArgumentsIsStatus2(t *testing.T) {
	testEnv(t, nil)
	fake := filepath.Join(t.TempDir(), helperName)
	require.NoError(t, os.WriteFile(fake, []byte("#!/bin/sh\necho 'ncclnet-go-selftest: unknown argument \"--frob\" (see --help)' >&2\nexit 2\n"), 0o755))
	m, errOut, code := selftestJSON(t, "--helper", fake)
	assert.Equal(t, 2, code, errOut)
	assert.Equal(t, false, m["pass"])
	assert.Equal(t, "usage", m["result"])
	assert.Contains(t, m["reason"], `unknown argument "--frob"`)
	assert.Contains(t, errOut, `unknown argument "--frob"`)
	assert.Contains(t, errOut, "--helper")
}

// budgetStep is one line of the helper's budget trace
// (NCCLNET_GO_SELFTEST_TRACE_BUDGET): a step one process entered, when, and
// the deadlines it ran under, in seconds from the start of the run.
type budgetStep struct {
	rank                   string
	at, deadline, watchdog float64
	step                   string
}

var budgetLine = regexp.MustCompile(`(?m)^selftest-budget rank=([01]) at_s=(\d+\.\d+) deadline_s=(\d+\.\d+) watchdog_s=(\d+\.\d+) step=(.+)$`)

func parseBudgetTrace(t *testing.T, log string) []budgetStep {
	t.Helper()
	var out []budgetStep
	for _, m := range budgetLine.FindAllStringSubmatch(log, -1) {
		num := func(s string) float64 {
			f, err := strconv.ParseFloat(s, 64)
			require.NoError(t, err, s)
			return f
		}
		out = append(out, budgetStep{m[1], num(m[2]), num(m[3]), num(m[4]), m[5]})
	}
	return out
}

// --timeout is one budget for the whole run, not one per step: every step of
// both processes runs under the deadline --timeout (its fraction included)
// from the start of the run, so the steps after a slow registration get only
// what is left of it. The helper reports the deadlines each step ran under;
// the test checks those, not the wall time, so a slow machine cannot fail it
// (the timeout leaves a minute of slack). (Until 2026-11-28 the requests'
// deadline was --timeout - 2 s, and a fraction of a second was dropped: 6.5s
// allowed 4 s.)
func TestSelftestTimeoutIsTheWholeBudget(t *testing.T) {
	const (
		timeout  = 60.5 // --timeout 60500ms
		grace    = 2.0  // the helper's WATCHDOG_GRACE: a rank stuck in a plugin call is killed this much later
		slow     = 2.0  // 2 registrations per process, REGMR_PLUGIN_SLEEP each
		slack    = 0.0015
		register = "allocating and registering buffers"
	)
	lib, helper := built(t)
	testEnv(t, nil)
	t.Setenv("REGMR_PLUGIN_REAL", lib)
	t.Setenv("REGMR_PLUGIN_SLEEP", "1")
	t.Setenv("NCCL_SOCKET_IFNAME", "lo")
	t.Setenv("NCCLNET_GO_SELFTEST_TRACE_BUDGET", "1")
	out, errOut, code := runCmd(t, "selftest", "-v", "--plugin", testPlugin(t, "regmr-plugin"), "--helper", helper,
		"--size", "64K", "--iters", "2", "--lat-iters", "10", "--timeout", "60500ms")
	require.Equal(t, 0, code, "%s%s", out, errOut)
	steps := parseBudgetTrace(t, errOut)
	require.NotEmpty(t, steps, "no budget trace in the plugin log:\n%s", errOut)
	after := map[string]int{} // steps each process entered after its slow registration
	for _, rank := range []string{"0", "1"} {
		registered := false
		for _, s := range steps {
			if s.rank != rank {
				continue
			}
			assert.InDelta(t, timeout, s.deadline, slack, "process %s, step %q at %.3f s: its deadline is not the run's", rank, s.step, s.at)
			assert.InDelta(t, timeout+grace, s.watchdog, slack, "process %s, step %q at %.3f s: the watchdog's limit is not the run's", rank, s.step, s.at)
			if registered {
				after[rank]++
				assert.GreaterOrEqual(t, s.at, slow, "process %s, step %q: entered before its registration could end", rank, s.step)
				assert.LessOrEqual(t, s.deadline-s.at, timeout-slow+slack,
					"process %s, step %q at %.3f s got %.3f s: more than what the slow registration left", rank, s.step, s.at, s.deadline-s.at)
			}
			registered = registered || strings.HasPrefix(s.step, register)
		}
		assert.True(t, registered, "process %s traced no registration step:\n%s", rank, errOut)
	}
	assert.Positive(t, after["0"], "process 0 traced no step after its registration:\n%s", errOut)
	assert.Positive(t, after["1"], "process 1 traced no step after its registration:\n%s", errOut)
}

// Without --plugin, selftest loads what the job's NCCL would: NCCL_NET_PLUGIN
// from the environment, else from the configuration files, a list tried in
// NCCL's order; and says where the choice came from (until 2026-11-28 it
// always loaded "go").
func TestSelftestLoadsWhatNCCLNetPluginNames(t *testing.T) {
	lib, helper := built(t)
	t.Setenv("NCCL_SOCKET_IFNAME", "lo")
	t.Setenv("LD_LIBRARY_PATH", t.TempDir()) // "go" alone would not load
	small := []string{"--helper", helper, "--size", "64K", "--iters", "2", "--lat-iters", "10"}

	testEnv(t, map[string]string{"NCCL_NET_PLUGIN": lib})
	out, errOut, code := runCmd(t, append([]string{"selftest", "-v"}, small...)...)
	require.Equal(t, 0, code, "%s%s", out, errOut)
	assert.Contains(t, out, "  plugin     \""+lib+"\" from NCCL_NET_PLUGIN (env)\n")

	etc, _ := testEnv(t, nil)
	require.NoError(t, os.WriteFile(etc, []byte("NCCL_NET_PLUGIN="+lib+"\n"), 0o644))
	m, errOut, code := selftestJSON(t, small...)
	require.Equal(t, 0, code, "%v %s", m, errOut)
	assert.Equal(t, lib, m["plugin"])
	assert.Equal(t, "NCCL_NET_PLUGIN ("+etc+")", m["plugin_source"])

	// NCCL tries the entries in order; the first that loads is used.
	testEnv(t, map[string]string{"NCCL_NET_PLUGIN": "nosuch," + lib})
	m, errOut, code = selftestJSON(t, small...)
	require.Equal(t, 0, code, "%v %s", m, errOut)
	assert.Equal(t, mustReal(t, lib), m["library"])

	testEnv(t, map[string]string{"NCCL_NET_PLUGIN": "nosuch,/nonexistent/libnccl-net-x.so"})
	out, _, code = runCmd(t, append([]string{"selftest"}, small...)...)
	assert.Equal(t, 1, code)
	assert.Contains(t, out, `FAIL: no library of the list "nosuch,/nonexistent/libnccl-net-x.so" loads: [nosuch] cannot load the plugin: nosuch: `)
	assert.Contains(t, out, `  plugin    "nosuch,/nonexistent/libnccl-net-x.so" from NCCL_NET_PLUGIN (env)`)

	// --plugin wins.
	testEnv(t, map[string]string{"NCCL_NET_PLUGIN": "nosuch"})
	m, errOut, code = selftestJSON(t, append([]string{"--plugin", lib}, small...)...)
	require.Equal(t, 0, code, "%v %s", m, errOut)
	assert.Equal(t, "--plugin", m["plugin_source"])

	testEnv(t, map[string]string{"NCCL_NET_PLUGIN": "/nonexistent/libnccl-net-go.so"})
	_, errOut, code = runCmd(t, append([]string{"selftest"}, small...)...)
	assert.Equal(t, 1, code)
	assert.Equal(t, "ncclnet-go selftest: NCCL_NET_PLUGIN=/nonexistent/libnccl-net-go.so (env): no such file or directory\n", errOut)

	// "none" loads no plugin in NCCL: the job would not use this one.
	testEnv(t, map[string]string{"NCCL_NET_PLUGIN": "None"})
	m, errOut, code = selftestJSON(t, small...)
	assert.Equal(t, 1, code)
	assert.Equal(t, false, m["pass"])
	assert.Contains(t, errOut, `NCCL_NET_PLUGIN="None" (env): NCCL loads no net plugin with this value`)
}

// fakeHelper is a selftest helper that prints line as its result.
func fakeHelper(t *testing.T, script string) string {
	t.Helper()
	fake := filepath.Join(t.TempDir(), helperName)
	require.NoError(t, os.WriteFile(fake, []byte("#!/bin/sh\n"+script+"\n"), 0o755))
	return fake
}

// The helper's text values stay text, whole: an interface may be named
// "nan" or "0" (until 2026-11-29 --json turned every value that parses as a
// number into one: "nan" made the JSON encoder fail, a PASS printed nothing
// and exited 1, and "0" became the number 0), and a library path may have
// spaces (it was cut at the first one, in the text report too).
func TestSelftestResultValuesKeepTheirText(t *testing.T) {
	testEnv(t, nil)
	for _, dev := range []string{"0", "nan", "1e3", "Inf"} {
		helper := fakeHelper(t, "echo 'result=pass library=/opt/my plugins/libnccl-net-go.so net=Go api=v12 transport=socket device="+dev+
			" speed_mbps=10000 bytes=1024 iters=1 gbps_1to0=1.500 gbps_0to1=2.000 lat_size=8 lat_iters=1 rtt_median_us=1.00 rtt_p99_us=2.00'")
		m, errOut, code := selftestJSON(t, "--helper", helper)
		require.Equal(t, 0, code, "device %s: %s", dev, errOut)
		assert.Equal(t, true, m["pass"])
		assert.Equal(t, dev, m["device"])
		assert.Equal(t, "/opt/my plugins/libnccl-net-go.so", m["library"])
		assert.Equal(t, "v12", m["api"])
		assert.Equal(t, 1024.0, m["bytes"])
		assert.Equal(t, 1.5, m["gbps_1to0"])

		out, errOut, code := runCmd(t, "selftest", "--helper", helper)
		require.Equal(t, 0, code, errOut)
		assert.Contains(t, out, "  library    /opt/my plugins/libnccl-net-go.so (NCCL net name \"Go\", API v12)\n")
		assert.Contains(t, out, "  transport  socket, device 0 = "+dev+" (10000 Mbps)\n")
	}
}

// --json prints a result on stdout for every failure, not only for the ones
// the helper reports: until 2026-11-29 a missing library or helper, or a helper
// that died without a result, left stdout empty for the script reading it.
func TestSelftestJSONOnEveryFailure(t *testing.T) {
	testEnv(t, nil)
	for _, c := range []struct {
		name   string
		args   []string
		reason string
	}{
		{"missing library", []string{"--plugin", "/nonexistent/libnccl-net-go.so"}, "--plugin /nonexistent/libnccl-net-go.so: no such file or directory"},
		{"missing helper", []string{"--helper", "/nonexistent/" + helperName}, "--helper /nonexistent/" + helperName + ": no such file or directory"},
		{"helper died", []string{"--helper", fakeHelper(t, "echo boom >&2; exit 3")}, "failed: exit status 3"},
		{"helper printed nothing", []string{"--helper", fakeHelper(t, "exit 0")}, "the helper printed no result"},
	} {
		m, errOut, code := selftestJSON(t, c.args...)
		assert.Equal(t, 1, code, c.name)
		require.NotNil(t, m, "%s: no JSON on stdout (stderr %q)", c.name, errOut)
		assert.Equal(t, false, m["pass"], c.name)
		assert.Equal(t, "fail", m["result"], c.name)
		assert.Contains(t, m["reason"], c.reason, c.name)
		assert.Contains(t, errOut, c.reason, "%s: stderr still says why", c.name)
	}
}
