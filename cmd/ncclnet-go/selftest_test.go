package main

import (
	"os"
	"os/exec"
	"path/filepath"
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
		"--size", "64K", "--iters", "2", "--timeout", "5s")
	assert.Equal(t, 1, code, "%s%s", out, errOut)
	assert.Less(t, time.Since(start), 30*time.Second, "the helper stops the ranks at --timeout")
	assert.Contains(t, out, "ncclnet-go selftest: FAIL: not finished after 5 s (--timeout 5)\n")
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
