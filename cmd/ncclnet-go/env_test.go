package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEnvFlagsMisspelledTimeout(t *testing.T) {
	testEnv(t, map[string]string{"NCCL_GO_TIMEOUTT": "600", "NCCL_GO_TIMEOUT": "30"})
	out, errOut, code := runCmd(t, "env")
	assert.Equal(t, 1, code, "an unknown NCCL_GO_* name fails the check")
	assert.Contains(t, out, "warning: NCCL_GO_TIMEOUTT is set (env) but libnccl-net-go reads no such variable; did you mean NCCL_GO_TIMEOUT?")
	assert.Regexp(t, `(?m)^NCCL_GO_TIMEOUT +30 +\S+ +env `, out)
	assert.Equal(t, "ncclnet-go env: 1 set NCCL_GO_* variable(s) the plugin does not know (a typo?): NCCL_GO_TIMEOUTT\n", errOut)

	testEnv(t, map[string]string{"NCCL_GO_TIMEOUT": "30", "NCCL_IB_OOO_RQ": "1"})
	out, _, code = runCmd(t, "env")
	assert.Equal(t, 0, code, out)
	assert.NotContains(t, out, "warning:")
	assert.Contains(t, out, "set, not read by libnccl-net-go (NCCL itself may read them): NCCL_IB_OOO_RQ\n")
}

func TestEnvSourcesFollowNCCL(t *testing.T) {
	etc, home := testEnv(t, map[string]string{"NCCL_SOCKET_IFNAME": "eth0"})
	// /etc/nccl.conf: a comment, a line without '=', a '\r' NCCL keeps, and a
	// second value of the same name, which setenv(overwrite=0) ignores.
	require.NoError(t, os.WriteFile(etc, []byte("#NCCL_GO_TIMEOUT=1\nnot a setting\nNCCL_SOCKET_IFNAME=ib0\nNCCL_IB_HCA=mlx5_0\r\nNCCL_GO_TIMEOUT=99\nNCCL_GO_TIMEOUT=98\nNCCL_GO_TIMEUOT=1\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(home, ".nccl.conf"), []byte("NCCL_GO_TIMEOUT=42\n"), 0o644))
	out, _, code := runCmd(t, "env", "--json")
	assert.Equal(t, 1, code, "the typo in /etc/nccl.conf counts")
	var r envReport
	require.NoError(t, json.Unmarshal([]byte(out), &r), out)
	byName := map[string]envSetting{}
	for _, s := range r.Settings {
		byName[s.Name] = s
	}
	assert.Equal(t, envSetting{Name: "NCCL_SOCKET_IFNAME", Value: "eth0", Set: true, Source: "env"}, pick(byName["NCCL_SOCKET_IFNAME"]))
	assert.Equal(t, envSetting{Name: "NCCL_GO_TIMEOUT", Value: "42", Set: true, Source: filepath.Join(home, ".nccl.conf")}, pick(byName["NCCL_GO_TIMEOUT"]), "~/.nccl.conf before /etc")
	assert.Equal(t, envSetting{Name: "NCCL_IB_HCA", Value: "mlx5_0\r", Set: true, Source: etc}, pick(byName["NCCL_IB_HCA"]))
	assert.Equal(t, []envWarning{{Name: "NCCL_GO_TIMEUOT", Source: etc, Suggestion: "NCCL_GO_TIMEOUT"}}, r.Unknown)
	assert.Equal(t, "5m0s", byName["NCCL_GO_TIMEOUT"].Default)
	assert.NotEmpty(t, byName["NCCL_GO_TIMEOUT"].Doc)

	// NCCL_CONF_FILE replaces ~/.nccl.conf (not /etc/nccl.conf).
	own := filepath.Join(t.TempDir(), "job.conf")
	require.NoError(t, os.WriteFile(own, []byte("NCCL_GO_TIMEOUT=7\n"), 0o644))
	etc2, _ := testEnv(t, map[string]string{"NCCL_CONF_FILE": own})
	require.NoError(t, os.WriteFile(etc2, []byte("NCCL_IB_HCA=mlx5_1\n"), 0o644))
	out, _, code = runCmd(t, "env", "--set", "--json")
	require.Equal(t, 0, code, out)
	r = envReport{}
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	byName = map[string]envSetting{}
	for _, s := range r.Settings {
		byName[s.Name] = s
	}
	assert.Equal(t, "7", byName["NCCL_GO_TIMEOUT"].Value)
	assert.Equal(t, own, byName["NCCL_GO_TIMEOUT"].Source)
	assert.Equal(t, etc2, byName["NCCL_IB_HCA"].Source)
	_, unset := byName["NCCL_GO_METRICS_PORT"]
	assert.False(t, unset, "--set lists only variables that are set")
}

// Settings whose package reads them by a rule beyond the declared grammar
// are checked by those readers: every WARN they would print at init is a
// problem env reports. NCCL_IB_ADDR_RANGE's family comes from nccl.conf
// here, as the plugin would take it.
func TestEnvFlagsWhatTheTransportsOwnReadersWarnAbout(t *testing.T) {
	testEnv(t, map[string]string{
		"NCCL_SOCKET_NTHREADS":   "-5",
		"NCCL_NSOCKS_PERTHREAD":  "-2",
		"NCCL_GO_SOCKET_HELPERS": "-7",
		"NCCL_IB_ADDR_FAMILY":    "ipv6",
		"NCCL_IB_HCA":            "mlx5_0:",
		"NCCL_COMM_ID":           "[::1",
	})
	out, errOut, code := runCmd(t, "env", "--set")
	assert.Equal(t, 1, code, out)
	for _, line := range []string{
		`invalid: NCCL_SOCKET_NTHREADS=-5 (env): must be >= 0, or -2 for auto; the plugin uses auto`,
		`invalid: NCCL_GO_SOCKET_HELPERS=-7 (env): must be >= 0, or -2 for auto; the plugin uses auto`,
		`invalid: NCCL_IB_ADDR_FAMILY=ipv6 (env): NCCL_IB_ADDR_FAMILY="ipv6" is neither AF_INET nor AF_INET6`,
		`invalid: NCCL_IB_HCA=mlx5_0: (env): entry "mlx5_0:" has an empty port`,
		`invalid: NCCL_COMM_ID=[::1 (env): not <host>:<port> or [<ipv6>]:<port>`,
	} {
		assert.Contains(t, out, "\n"+line)
	}
	assert.NotContains(t, out, ": NCCL_NSOCKS_PERTHREAD=", "-2 is auto, as written")
	assert.Equal(t, "ncclnet-go env: 5 setting(s) the plugin would ignore or read only in part: NCCL_COMM_ID, NCCL_GO_SOCKET_HELPERS, NCCL_IB_ADDR_FAMILY, NCCL_IB_HCA, NCCL_SOCKET_NTHREADS\n", errOut)

	// An IPv6 range is right for the family nccl.conf sets, wrong without it.
	etc, _ := testEnv(t, map[string]string{"NCCL_IB_ADDR_RANGE": "fd00::/8"})
	require.NoError(t, os.WriteFile(etc, []byte("NCCL_IB_ADDR_FAMILY=AF_INET6\n"), 0o644))
	out, errOut, code = runCmd(t, "env", "--set")
	assert.Equal(t, 0, code, "%s%s", out, errOut)
	testEnv(t, map[string]string{"NCCL_IB_ADDR_RANGE": "fd00::/8"})
	out, _, code = runCmd(t, "env", "--set")
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, `invalid: NCCL_IB_ADDR_RANGE=fd00::/8 (env): ignoring NCCL_IB_ADDR_RANGE="fd00::/8": it is an IPv6 range but NCCL_IB_ADDR_FAMILY is AF_INET`)

	// A mask with text after its number is used as far as strtol reads it:
	// read in part, not ignored (until 2026-11-28 env called it invalid).
	testEnv(t, map[string]string{"NCCL_IB_ADDR_RANGE": "10.1.2.3/8x"})
	out, errOut, code = runCmd(t, "env", "--set")
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, `read in part: NCCL_IB_ADDR_RANGE=10.1.2.3/8x (env): NCCL_IB_ADDR_RANGE="10.1.2.3/8x": NCCL reads the mask "8x" as 8 (strtol), so the range is 10.0.0.0/8`)
	assert.Contains(t, errOut, "NCCL_IB_ADDR_RANGE")
}

func pick(s envSetting) envSetting {
	return envSetting{Name: s.Name, Value: s.Value, Set: s.Set, Source: s.Source}
}

func TestEnvListsTheRegistry(t *testing.T) {
	testEnv(t, nil)
	out, _, code := runCmd(t, "env")
	require.Equal(t, 0, code)
	// Settings of the transports, the metrics, and the shared socket options.
	for _, name := range []string{"NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "NCCL_GO_METRICS_PORT", "NCCL_GO_TIMEOUT"} {
		assert.Regexp(t, `(?m)^`+name+` +- `, out)
	}
}

// A set value the plugin would ignore, or read only in part, fails the check
// and says what the plugin uses instead (until 2026-11-28 env listed
// NCCL_GO_TIMEOUT=abc as if it were in effect, with status 0).
func TestEnvFlagsValuesThePluginWouldNotUseAsWritten(t *testing.T) {
	testEnv(t, map[string]string{
		"NCCL_GO_TIMEOUT":              "abc",
		"NCCL_SOCKET_INLINE":           "99999999",
		"NCCL_GO_METRICS_PORT":         "-3",
		"NCCL_GO_SOCKET_IDLE_INLINE":   "256k",
		"NCCL_IB_QPS_PER_CONNECTION":   "500",
		"NCCL_SOCKET_RETRY_SLEEP_MSEC": "90000",
		"NCCL_GO_SOCKET_SHARE_AFTER":   "2000000",
		"NCCL_SOCKET_IFNAME":           "x",
		"NCCL_IB_DISABLE":              "maybe",
		"NCCL_GO_STALL_WARN":           "10",
		"NCCL_IB_HCA":                  "mlx5_0:1",
	})
	out, errOut, code := runCmd(t, "env", "--set")
	assert.Equal(t, 1, code, out)
	for _, line := range []string{
		`invalid: NCCL_GO_TIMEOUT=abc (env): "abc" is not a number of seconds or a duration such as 1.5s; the plugin uses the default 5m0s`,
		`invalid: NCCL_SOCKET_INLINE=99999999 (env): 99999999 must be in [0, 1048576]; the plugin uses the default 16384`,
		`invalid: NCCL_GO_METRICS_PORT=-3 (env): -3 is not a port; set NCCL_GO_METRICS_PORT to a base port in 1..65535 (each rank serves base + its local rank); the plugin serves no metrics endpoint`,
		`read in part: NCCL_GO_SOCKET_IDLE_INLINE=256k (env): NCCL reads only the number at the start of "256k" and ignores "k"; the plugin uses 256`,
		`invalid: NCCL_IB_QPS_PER_CONNECTION=500 (env): 500 must be in [1, 128]; the plugin uses 128`,
		`invalid: NCCL_SOCKET_RETRY_SLEEP_MSEC=90000 (env): 1m30s must be in [0s, 1m0s]; the plugin uses 1m0s`,
		`invalid: NCCL_GO_SOCKET_SHARE_AFTER=2000000 (env): 2s must be in [0s, 1s]; the plugin uses the default 100µs`,
		`invalid: NCCL_SOCKET_IFNAME=x (env): NCCL ignores a value of one character; the plugin uses NCCL's default interface search`,
		`invalid: NCCL_IB_DISABLE=maybe (env): "maybe" is not a boolean`,
	} {
		assert.Contains(t, out, "\n"+line, "")
	}
	assert.NotContains(t, out, ": NCCL_GO_STALL_WARN=")
	assert.NotContains(t, out, ": NCCL_IB_HCA=")
	assert.Equal(t, "ncclnet-go env: 9 setting(s) the plugin would ignore or read only in part: NCCL_GO_METRICS_PORT, NCCL_GO_SOCKET_IDLE_INLINE, NCCL_GO_SOCKET_SHARE_AFTER, NCCL_GO_TIMEOUT, NCCL_IB_DISABLE, NCCL_IB_QPS_PER_CONNECTION, NCCL_SOCKET_IFNAME, NCCL_SOCKET_INLINE, NCCL_SOCKET_RETRY_SLEEP_MSEC\n", errOut)

	out, _, code = runCmd(t, "env", "--json")
	assert.Equal(t, 1, code)
	var r envReport
	require.NoError(t, json.Unmarshal([]byte(out), &r), out)
	for _, s := range r.Settings {
		switch s.Name {
		case "NCCL_GO_TIMEOUT":
			assert.Equal(t, "invalid", s.Problem)
			assert.Contains(t, s.Why, "the plugin uses the default 5m0s")
		case "NCCL_GO_SOCKET_IDLE_INLINE":
			assert.Equal(t, "read in part", s.Problem)
		case "NCCL_GO_STALL_WARN", "NCCL_IB_HCA", "NCCL_GO_METRICS_BIND":
			assert.Empty(t, s.Problem, s.Name)
		}
	}

	testEnv(t, map[string]string{"NCCL_GO_TIMEOUT": "90s", "NCCL_GO_METRICS_PORT": "9400", "NCCL_SOCKET_IFNAME": "=eth0", "NCCL_IB_PCI_RELAXED_ORDERING": " 1 "})
	out, errOut, code = runCmd(t, "env", "--set")
	assert.Equal(t, 0, code, "%s%s", out, errOut)
}

// The report's lists are JSON arrays even when empty: a script iterates
// them (jq '.unknown[]', '.settings[]' with --set) without a special case.
// Until 2026-11-29 they were null (and not_read_by_plugin absent) on a host
// with nothing to report, and jq failed with "Cannot iterate over null".
func TestEnvJSONListsAreNeverNull(t *testing.T) {
	testEnv(t, nil)
	out, errOut, code := runCmd(t, "env", "--set", "--json")
	require.Equal(t, 0, code, errOut)
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &m), out)
	for _, k := range []string{"files", "settings", "unknown", "not_read_by_plugin"} {
		assert.IsType(t, []any{}, m[k], "%q in %s", k, out)
	}
}
