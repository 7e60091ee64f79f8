package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/internal/diag"
)

// hostHasRDMA: the kernel lists RDMA devices (then ib may well be usable).
func hostHasRDMA() bool {
	e, err := os.ReadDir("/sys/class/infiniband")
	return err == nil && len(e) > 0
}

// On a host without RDMA devices (CI, this machine) the plugin falls back to
// socket, and devices says why ib is not usable.
func TestDevicesOnThisHostNamesSocketAndWhyNotIB(t *testing.T) {
	if hostHasRDMA() {
		t.Skip("this host has RDMA devices (/sys/class/infiniband): the fallback to socket cannot be observed; the Soft-RoCE lane checks the ib side")
	}
	testEnv(t, map[string]string{"NCCL_SOCKET_IFNAME": "lo"})
	out, errOut, code := runCmd(t, "devices")
	require.Equal(t, 0, code, "%s%s", out, errOut)
	assert.Contains(t, out, "transport: socket\n")
	assert.Contains(t, out, "why: ib is tried first and not usable, so the plugin falls back to socket\n")
	assert.Regexp(t, `(?m)^ib \(priority 10\): not usable: no usable device: (libibverbs\.so(\.1)? reports no RDMA devices|.*install rdma-core)`, out)
	assert.Regexp(t, `(?m)^socket \(priority 100\): used$`, out)
	assert.Regexp(t, `(?m)^    \[0\] lo  .*address 127\.0\.0\.1`, out)
	assert.Regexp(t, `(?m)^    lo +up +127\.0\.0\.1.* -> device 0 \(listens on 127\.0\.0\.1\)$`, out)
}

func TestDevicesHonoursNCCLConfFiles(t *testing.T) {
	etc, home := testEnv(t, map[string]string{"NCCL_SOCKET_IFNAME": "lo"})
	require.NoError(t, os.WriteFile(etc, []byte("# site defaults\nNCCL_IB_DISABLE=1\nNCCL_GO_TRANSPORT=ib\n"), 0o644))
	require.NoError(t, os.WriteFile(home+"/.nccl.conf", []byte("NCCL_GO_TRANSPORT=socket\n"), 0o644))
	out, _, code := runCmd(t, "devices")
	require.Equal(t, 0, code, out)
	assert.Contains(t, out, "transport: socket\nwhy: NCCL_GO_TRANSPORT=socket\n", "~/.nccl.conf is applied before /etc/nccl.conf")
	assert.Contains(t, out, "ib (priority 10): not usable: no usable device: NCCL_IB_DISABLE=1", "/etc/nccl.conf still sets what ~/.nccl.conf does not")

	// The environment wins over both files.
	testEnv(t, map[string]string{"NCCL_SOCKET_IFNAME": "lo", "NCCL_GO_TRANSPORT": "ib", "NCCL_IB_DISABLE": "1"})
	out, _, code = runCmd(t, "devices")
	assert.Equal(t, 1, code, "a forced, unusable transport fails init")
	assert.Contains(t, out, "transport: none: the plugin's init would fail: no usable transport (ib: no usable device: NCCL_IB_DISABLE=1)")
}

func TestDevicesJSON(t *testing.T) {
	testEnv(t, map[string]string{"NCCL_SOCKET_IFNAME": "=lo", "NCCL_IB_DISABLE": "1"})
	out, _, code := runCmd(t, "devices", "--json")
	require.Equal(t, 0, code, out)
	var r diag.Report
	require.NoError(t, json.Unmarshal([]byte(out), &r), out)
	assert.Equal(t, "socket", r.Transport)
	require.Len(t, r.Transports, 2)
	assert.Equal(t, "ib", r.Transports[0].Name)
	assert.Equal(t, "no usable device: NCCL_IB_DISABLE=1", r.Transports[0].Reason)
	s := r.Transports[1]
	assert.True(t, s.Selected)
	require.Len(t, s.Devices, 1)
	assert.Equal(t, "lo", s.Devices[0].Name)
	assert.Equal(t, "127.0.0.1", s.Devices[0].Address)
	var names []string
	for _, i := range s.Interfaces {
		names = append(names, i.Name)
		if i.Name != "lo" {
			assert.False(t, i.Used)
			assert.NotEmpty(t, i.Why, i.Name)
		}
	}
	assert.Contains(t, names, "lo")
}

func TestDevicesUnknownForcedTransport(t *testing.T) {
	testEnv(t, map[string]string{"NCCL_GO_TRANSPORT": "shm"})
	out, _, code := runCmd(t, "devices")
	assert.Equal(t, 1, code)
	assert.True(t, strings.HasPrefix(out, "transport: none: the plugin's init would fail: NCCL_GO_TRANSPORT=shm names no transport of this plugin; use one of ib, socket or unset it\n"), out)
}

// A one-character NCCL_SOCKET_IFNAME is set, and ignored as NCCL ignores it;
// the report says so (until 2026-11-28 its note said the variable was unset).
func TestDevicesSaysAOneCharacterIfNameIsIgnored(t *testing.T) {
	testEnv(t, map[string]string{"NCCL_SOCKET_IFNAME": "x", "NCCL_IB_DISABLE": "1"})
	out, _, _ := runCmd(t, "devices")
	assert.Contains(t, out, "  note: NCCL_SOCKET_IFNAME=x is ignored (NCCL ignores a value of one character), so NCCL's default search takes ib*")
	assert.NotContains(t, out, "NCCL_SOCKET_IFNAME is unset")

	testEnv(t, map[string]string{"NCCL_IB_DISABLE": "1"})
	out, _, _ = runCmd(t, "devices")
	assert.Contains(t, out, "  note: NCCL_SOCKET_IFNAME is unset: NCCL's default search takes ib*")
}
