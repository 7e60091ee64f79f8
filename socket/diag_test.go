package socket

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/internal/diag"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

type diagIfaces []Iface

func (f diagIfaces) Interfaces() ([]Iface, error) { return f, nil }

func diagIf(name string, up, running bool, addrs ...string) Iface {
	i := Iface{Name: name, Up: up, Running: running}
	for _, a := range addrs {
		if pf, err := netip.ParsePrefix(a); err == nil {
			i.Addrs = append(i.Addrs, pf)
			continue
		}
		p := netip.MustParseAddr(a)
		i.Addrs = append(i.Addrs, netip.PrefixFrom(p, p.BitLen()))
	}
	return i
}

var diagHost = diagIfaces{
	diagIf("lo", true, true, "127.0.0.1", "::1"),
	diagIf("eth0", true, true, "10.0.0.2/24"),
	diagIf("eth1", false, false, "10.0.1.2"),
	diagIf("eth2", true, false, "10.0.2.2"),
	diagIf("docker0", true, true, "172.17.0.1"),
}

func diagnoseSocket(t *testing.T, kv ...string) diag.Transport {
	t.Helper()
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	withEnv(t, m)
	r := diag.Diagnose([]nccl.Registration{{Name: "socket", Priority: 100, New: func() nccl.Transport {
		return &Transport{ifaces: diagHost, sysRoot: "testdata/sys"}
	}}}, diag.Options{})
	require.Len(t, r.Transports, 1)
	return r.Transports[0]
}

func ifaceByName(d diag.Transport, name string) diag.Interface {
	for _, i := range d.Interfaces {
		if i.Name == name {
			return i
		}
	}
	return diag.Interface{}
}

func TestExplainDefaultSearch(t *testing.T) {
	d := diagnoseSocket(t)
	require.True(t, d.Usable, d.Reason)
	require.Len(t, d.Devices, 1)
	assert.Equal(t, "eth0", d.Devices[0].Name)
	assert.Equal(t, "10.0.0.2", d.Devices[0].Address)
	eth0 := ifaceByName(d, "eth0")
	assert.True(t, eth0.Used)
	assert.True(t, eth0.Matches)
	require.NotNil(t, eth0.DeviceIndex)
	assert.Equal(t, 0, *eth0.DeviceIndex)
	assert.Equal(t, "not selected by NCCL's default search (^docker,lo,virbr)", ifaceByName(d, "lo").Why)
	assert.Equal(t, []string{"127.0.0.1", "::1"}, ifaceByName(d, "lo").Addrs)
	assert.Equal(t, "not selected by NCCL's default search (^docker,lo,virbr)", ifaceByName(d, "docker0").Why)
	assert.Equal(t, "down", ifaceByName(d, "eth1").Why)
	assert.Equal(t, "up but not RUNNING (no carrier)", ifaceByName(d, "eth2").Why)
	require.NotNil(t, d.Fusion)
	assert.False(t, d.Fusion.Supported, "socket has no makeVDevice")
}

func TestExplainIfnameMatchesNothing(t *testing.T) {
	d := diagnoseSocket(t, "NCCL_SOCKET_IFNAME", "=eth9")
	assert.False(t, d.Usable)
	assert.Contains(t, d.Reason, "no interface matches NCCL_SOCKET_IFNAME==eth9")
	assert.Equal(t, "not selected by NCCL_SOCKET_IFNAME==eth9", ifaceByName(d, "eth0").Why)
	assert.Contains(t, d.Log[0], "WARN NET/GoSocket : no interface matches NCCL_SOCKET_IFNAME==eth9", "the plugin's WARN is kept")
}

func TestExplainFamilyFilter(t *testing.T) {
	d := diagnoseSocket(t, "NCCL_SOCKET_IFNAME", "eth0,lo", "NCCL_SOCKET_FAMILY", "AF_INET6")
	assert.False(t, d.Usable, "eth0 has no IPv6 address and lo's ::1 is skipped")
	assert.Equal(t, "no usable IPv6 address (NCCL_SOCKET_FAMILY=AF_INET6)", ifaceByName(d, "eth0").Why)
	assert.True(t, ifaceByName(d, "eth0").Matches)

	d = diagnoseSocket(t, "NCCL_SOCKET_IFNAME", "lo")
	require.True(t, d.Usable)
	assert.True(t, ifaceByName(d, "lo").Used)
	assert.Equal(t, "127.0.0.1", ifaceByName(d, "lo").Address)
	assert.Equal(t, "not selected by NCCL_SOCKET_IFNAME=lo", ifaceByName(d, "eth0").Why)
}

func TestExplainCommIDSubnet(t *testing.T) {
	d := diagnoseSocket(t, "NCCL_COMM_ID", "10.0.0.9:29500")
	require.True(t, d.Usable, d.Reason)
	assert.True(t, ifaceByName(d, "eth0").Used)
	assert.Equal(t, "not selected by NCCL's default search (subnet of NCCL_COMM_ID=10.0.0.9:29500)", ifaceByName(d, "docker0").Why)
}
