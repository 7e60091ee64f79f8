package ib

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
)

// Init calls ibv_fork_init before it opens a device, as NCCL does: on a
// kernel that does not copy pinned pages at fork, that is what keeps a
// forked DataLoader worker from taking the NIC's writes.
func TestInitEnablesForkSupportFirst(t *testing.T) {
	setEnv(t)
	f := softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "simA_0"})
	f.AddDevice(softnic.DeviceConfig{Name: "simB_0"})
	f.SetForkUnsafeKernel(true)
	a := newHost(t, f, verbs.Features{}, "simA_0")
	calls, opensBefore := f.ForkInits()
	assert.Equal(t, 1, calls)
	assert.Equal(t, 0, opensBefore, "ibv_fork_init must come before the first ibv_open_device")
	assert.True(t, a.log.has("fork support enabled: registered memory is marked MADV_DONTFORK"), a.log)
	assert.False(t, a.log.has("WARN"), a.log)
	b := newHost(t, f, verbs.Features{}, "simB_0")
	sc, rc := connectPair(t, a, 0, b, 0)
	got, _ := transfer(t, sc, rc, []int{1000}, []int{1000})
	assert.Equal(t, pattern(1000, 0), got[0])

	// A current kernel needs nothing; Init says so.
	f = softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "simA_0"})
	a = newHost(t, f, verbs.Features{}, "simA_0")
	assert.True(t, a.log.has("fork support unneeded"), a.log)
}

// Another verbs user in the process that registered memory first makes
// ibv_fork_init fail. Init still succeeds (NCCL ignores the failure too),
// with a WARN that says what is at risk and what to set.
func TestForkInitTooLateWarns(t *testing.T) {
	setEnv(t)
	f := softnic.NewFabric()
	f.AddDevice(softnic.DeviceConfig{Name: "simA_0"})
	f.SetForkUnsafeKernel(true)
	ctx, err := f.Provider(verbs.Features{}).Open("simA_0")
	require.NoError(t, err)
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	mem := mmapBytes(t, 4096)
	mr, err := pd.RegMR(unsafe.Pointer(&mem[0]), uint64(uintptr(unsafe.Pointer(&mem[0]))), len(mem), verbs.AccessLocalWrite)
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, mr.Dereg())
		assert.NoError(t, pd.Dealloc())
		assert.NoError(t, ctx.Close())
	})

	a := newHost(t, f, verbs.Features{}, "simA_0")
	assert.Equal(t, 1, a.t.Devices(), "a failed ibv_fork_init does not fail Init")
	assert.True(t, a.log.has("WARN NET/GoIB : ibv_fork_init failed"), a.log)
	assert.True(t, a.log.has("EINVAL"), a.log)
	assert.True(t, a.log.has("RDMAV_FORK_SAFE=1"), a.log)
}
