package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// repoRoot is the repository, two levels up from this package.
var repoRoot, _ = filepath.Abs(filepath.Join("..", ".."))

// testEnv makes the command see exactly env as its environment and dir
// (a temporary directory) as the place of /etc/nccl.conf and the home
// directory, so no test reads the host's settings.
func testEnv(t *testing.T, env map[string]string) (etc, home string) {
	t.Helper()
	dir := t.TempDir()
	etc, home = filepath.Join(dir, "etc-nccl.conf"), filepath.Join(dir, "home")
	require.NoError(t, os.MkdirAll(home, 0o755))
	savedEnv, savedNames, savedEtc, savedHome := environ, environNames, etcConf, userHome
	environ = func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	environNames = func() []string {
		var n []string
		for k := range env {
			n = append(n, k)
		}
		sort.Strings(n)
		return n
	}
	etcConf, userHome = etc, func() string { return home }
	t.Cleanup(func() {
		environ, environNames, etcConf, userHome = savedEnv, savedNames, savedEtc, savedHome
		ncclenv.SetLookup(nil)
	})
	return etc, home
}

// runCmd runs the command in-process.
func runCmd(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(args, &cli{stdout: &o, stderr: &e, exe: filepath.Join(t.TempDir(), "ncclnet-go")})
	return o.String(), e.String(), code
}

func TestHelpOnEveryCommand(t *testing.T) {
	testEnv(t, nil)
	for _, c := range commands {
		for _, h := range []string{"--help", "-h"} {
			out, errOut, code := runCmd(t, c.name, h)
			assert.Equal(t, 0, code, "%s %s", c.name, h)
			assert.True(t, strings.HasPrefix(out, "usage: ncclnet-go "+c.name+" "), "%s %s: %q", c.name, h, out)
			assert.Contains(t, out, "\nflags:\n", c.name)
			assert.Empty(t, errOut, c.name)
		}
		out, _, code := runCmd(t, "help", c.name)
		assert.Equal(t, 0, code)
		assert.True(t, strings.HasPrefix(out, "usage: ncclnet-go "+c.name), "help %s", c.name)
	}
	out, _, code := runCmd(t, "--help")
	assert.Equal(t, 0, code)
	for _, c := range commands {
		assert.Contains(t, out, "  "+c.name+" ")
	}
}

// The top-level --help's exit-status line names every status a subcommand
// returns: 128 + the signal's number comes from selftest and from a
// top --once stopped before its table (TestTopOnceInterruptedIsNotSuccess),
// and the selftest helper's last fallback is /usr/libexec/ncclnet-go.
func TestHelpNamesEveryExitStatusAndHelperPlace(t *testing.T) {
	testEnv(t, nil)
	out, _, code := runCmd(t, "--help")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "128 + the signal's number")
	assert.Contains(t, out, "top --once stopped before its table")
	out, _, code = runCmd(t, "selftest", "--help")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "/usr/libexec/ncclnet-go")
}

func TestBadUsageIsOneLineAndStatus2(t *testing.T) {
	testEnv(t, nil)
	for _, args := range [][]string{
		{"devices", "--bogus"},
		{"devices", "extra"},
		{"env", "--json=maybe"},
		{"selftest", "--transport", "rdma"},
		{"selftest", "--size", "2G"},
		{"selftest", "--iters", "0"},
		{"selftest", "--timeout", "25h"},
		{"selftest", "--timeout", "4s"},
		{"top", "--interval", "1ms"},
		{"top", "not-an-address"},
		{"nosuchcommand"},
		{},
	} {
		out, errOut, code := runCmd(t, args...)
		assert.Equal(t, 2, code, "%q", args)
		if len(args) == 0 {
			continue // bare ncclnet-go prints the usage
		}
		assert.Empty(t, out, "%q", args)
		assert.Equal(t, 1, strings.Count(errOut, "\n"), "one line for %q: %q", args, errOut)
		assert.True(t, strings.HasPrefix(errOut, "ncclnet-go"), "%q", errOut)
	}
}

func TestPanicIsOneLine(t *testing.T) {
	testEnv(t, nil)
	saved := commands
	commands = append(append([]command(nil), commands...), command{"boom", "", func(*cli, []string) error { panic("kaboom") }})
	defer func() { commands = saved }()
	out, errOut, code := runCmd(t, "boom")
	assert.Equal(t, 1, code)
	assert.Empty(t, out)
	assert.Equal(t, "ncclnet-go: internal error: kaboom (please report it)\n", errOut)
}

// TestBinaryPrintsNoStackTrace runs the built program: failures end in one
// line, without a Go stack trace.
func TestBinaryPrintsNoStackTrace(t *testing.T) {
	bin := builtCommand(t)
	for _, args := range [][]string{{"selftest", "--plugin", "/nonexistent/libnccl-net-go.so"}, {"top", "--once", "--interval", "100ms", "127.0.0.1:1"}, {"devices", "--nope"}} {
		cmd := exec.Command(bin, args...)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		require.Error(t, err, "%q", args)
		assert.NotContains(t, e.String(), "goroutine ", "%q", args)
		assert.NotContains(t, e.String(), ".go:", "%q", args)
		assert.Equal(t, 1, strings.Count(e.String(), "\n"), "%q: %q", args, e.String())
	}
}

// program is this package built, once per test run.
var program struct {
	once     sync.Once
	dir, bin string
	err      string
}

func builtCommand(t *testing.T) string {
	t.Helper()
	program.once.Do(func() {
		dir, err := os.MkdirTemp("", "ncclnet-go-cmd")
		if err != nil {
			program.err = err.Error()
			return
		}
		program.dir, program.bin = dir, filepath.Join(dir, "ncclnet-go")
		if out, err := exec.Command("go", "build", "-o", program.bin, ".").CombinedOutput(); err != nil {
			program.err = "go build: " + err.Error() + "\n" + string(out)
		}
	})
	require.Empty(t, program.err)
	return program.bin
}

// The command must offer the transports the library offers, in its order.
func TestRegistrationsMatchTheLibrary(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(repoRoot, "cmd", "libnccl-net-go", "main.go"))
	require.NoError(t, err)
	re := regexp.MustCompile(`nccl\.Register\("([^"]+)",\s*(\d+),`)
	var lib []nccl.Registration
	for _, m := range re.FindAllStringSubmatch(string(src), -1) {
		p, _ := strconv.Atoi(m[2])
		lib = append(lib, nccl.Registration{Name: m[1], Priority: p})
	}
	require.NotEmpty(t, lib, "no nccl.Register calls found in cmd/libnccl-net-go/main.go")
	sort.SliceStable(lib, func(i, j int) bool { return lib[i].Priority < lib[j].Priority })
	var mine []nccl.Registration
	for _, r := range nccl.Transports() {
		mine = append(mine, nccl.Registration{Name: r.Name, Priority: r.Priority})
	}
	assert.Equal(t, lib, mine)
}

// artifacts are the built library and selftest helper: given by make
// (NCCLNET_GO_TEST_PLUGIN, NCCLNET_GO_TEST_HELPER), else built here once.
var artifacts struct {
	once           sync.Once
	lib, helper    string
	corrupt        string
	err, skip      string
	dir            string
	buildLog       string
	corruptBuildMu sync.Mutex
}

func TestMain(m *testing.M) {
	code := m.Run()
	if artifacts.dir != "" {
		os.RemoveAll(artifacts.dir)
	}
	if program.dir != "" {
		os.RemoveAll(program.dir)
	}
	os.Exit(code)
}

func built(t *testing.T) (lib, helper string) {
	t.Helper()
	artifacts.once.Do(func() {
		if _, err := exec.LookPath("gcc"); err != nil {
			artifacts.skip = "gcc is not installed: the library and the C helper cannot be built"
			return
		}
		dir, err := os.MkdirTemp("", "ncclnet-go-test")
		if err != nil {
			artifacts.err = err.Error()
			return
		}
		artifacts.dir = dir
		artifacts.lib = os.Getenv("NCCLNET_GO_TEST_PLUGIN")
		if artifacts.lib == "" {
			artifacts.lib = filepath.Join(dir, "libnccl-net-go.so")
			cmd := exec.Command(filepath.Join(repoRoot, "scripts", "build-plugin.sh"), "--name", "Go", "--out", artifacts.lib, "./cmd/libnccl-net-go")
			cmd.Dir = repoRoot
			if out, err := cmd.CombinedOutput(); err != nil {
				artifacts.err = "building the library: " + err.Error() + "\n" + string(out)
				return
			}
		}
		artifacts.helper = os.Getenv("NCCLNET_GO_TEST_HELPER")
		if artifacts.helper == "" {
			artifacts.helper = filepath.Join(dir, helperName)
			args := append([]string{"-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-I" + filepath.Join(repoRoot, "nccl", "include"),
				"-I" + filepath.Join(repoRoot, "harness"), "-pthread", "-o", artifacts.helper, filepath.Join("helper", "selftest.c")},
				harnessSources()...)
			if out, err := exec.Command("gcc", append(args, "-ldl")...).CombinedOutput(); err != nil {
				artifacts.err = "building the helper: " + err.Error() + "\n" + string(out)
				return
			}
		}
	})
	if artifacts.skip != "" {
		t.Skip(artifacts.skip)
	}
	require.Empty(t, artifacts.err)
	return artifacts.lib, artifacts.helper
}

// harnessSources are the conformance harness files the helper links (the
// same list as mk/tools.mk).
func harnessSources() []string {
	var out []string
	for _, f := range []string{"util.c", "netapi.c", "proc.c", "link.c"} {
		out = append(out, filepath.Join(repoRoot, "harness", f))
	}
	return out
}

// Every flag a command accepts is in its synopsis, with the argument its
// flags section shows: until 2026-11-29 `selftest --help` listed
// "--transport ib" (as if ib were the only value) under a synopsis of
// "[--transport ib|socket]", and top's synopsis said "--interval 2s" where
// its flags said DURATION.
func TestHelpSynopsisMatchesTheFlags(t *testing.T) {
	testEnv(t, nil)
	for _, c := range commands {
		out, _, code := runCmd(t, c.name, "--help")
		require.Equal(t, 0, code, c.name)
		synopsis, _, _ := strings.Cut(out, "\n")
		_, flagsSection, ok := strings.Cut(out, "\nflags:\n")
		require.True(t, ok, c.name)
		n := 0
		for _, line := range strings.Split(flagsSection, "\n") {
			if !strings.HasPrefix(line, "  -") {
				continue
			}
			n++
			head, _, _ := strings.Cut(strings.TrimSpace(line), "  ")
			assert.Contains(t, synopsis, "["+head+"]", "%s: the flag %q", c.name, head)
		}
		assert.NotZero(t, n, c.name)
	}
}
