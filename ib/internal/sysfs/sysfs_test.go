package sysfs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/sysfs/sysfstest"
)

func TestFixtureTree(t *testing.T) {
	fs := New(sysfstest.Tree(t))
	p, err := fs.PCIPath("mlx5_0")
	require.NoError(t, err)
	assert.Equal(t, "/sys/devices/pci0000:00/0000:00:03.0/0000:03:00.0", p)
	p, err = fs.PCIPath("mlx5_1")
	require.NoError(t, err)
	assert.Equal(t, "/sys/devices/pci0000:00/0000:00:04.0/0000:04:00.1", p)
	_, err = fs.PCIPath("mlx5_9")
	assert.Error(t, err)

	n, name, err := fs.PortState("mlx5_0", 1)
	require.NoError(t, err)
	assert.Equal(t, 4, n)
	assert.Equal(t, "ACTIVE", name)
	n, name, err = fs.PortState("mlx5_1", 1)
	require.NoError(t, err)
	assert.Equal(t, []any{1, "DOWN"}, []any{n, name})

	ll, err := fs.LinkLayer("mlx5_1", 1)
	require.NoError(t, err)
	assert.Equal(t, "Ethernet", ll)

	nd, err := fs.NetDev("mlx5_1", 1, 1)
	require.NoError(t, err)
	assert.Equal(t, "eth3", nd)
	_, err = fs.NetDev("mlx5_0", 1, 0)
	assert.Error(t, err, "IB ports have no netdev")

	v, err := fs.RoCEVersion("mlx5_1", 1, 0)
	require.NoError(t, err)
	assert.Equal(t, 1, v)
	v, err = fs.RoCEVersion("mlx5_1", 1, 1)
	require.NoError(t, err)
	assert.Equal(t, 2, v)
	_, err = fs.RoCEVersion("mlx5_1", 1, 2)
	assert.ErrorContains(t, err, "unknown type")

	ok, which := fs.PeerMemory()
	assert.True(t, ok)
	assert.Equal(t, "/sys/module/nvidia_peermem/version", which)
	ok, _ = New("testdata/nopeer").PeerMemory()
	assert.False(t, ok)
}

func TestMalformedState(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "class/infiniband/x/ports/1")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "state"), []byte("garbage\n"), 0o644))
	_, _, err := New(root).PortState("x", 1)
	assert.ErrorContains(t, err, "malformed state")
	assert.Equal(t, "/sys", New("").Root)
}
