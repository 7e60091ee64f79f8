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
