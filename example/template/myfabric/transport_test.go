package myfabric

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Start here; once the data path works, add the contract suite:
//
//	func TestConformance(t *testing.T) { nccltest.Run(t, New, nccltest.Options{}) }
func TestInitAndProperties(t *testing.T) {
	tr := New()
	require.NoError(t, tr.Init(nccl.InitContext{Log: nccl.DiscardLogger{}}))
	require.GreaterOrEqual(t, tr.Devices(), 1, "NCCL disables a plugin with no device")
	p, err := tr.Properties(0)
	require.NoError(t, err)
	assert.NotEmpty(t, p.Name)
	assert.NotZero(t, p.PtrSupport&nccl.PtrHost)
	_, err = tr.Properties(tr.Devices())
	assert.Equal(t, nccl.InvalidArgument, nccl.ResultOf(err))

	t.Setenv("NCCL_MYFABRIC_DISABLE", "1")
	assert.True(t, errors.Is(New().Init(nccl.InitContext{}), nccl.ErrNoDevice))
	require.NoError(t, tr.Finalize())
}

// A malformed setting is a WARN in your transport's name, and the default.
func TestSettingsWarnWithYourPrefix(t *testing.T) {
	t.Setenv("NCCL_MYFABRIC_DISABLE", "maybe")
	var out strings.Builder
	require.NoError(t, New().Init(nccl.InitContext{Log: &nccl.WriterLogger{W: &out}}))
	assert.True(t, strings.HasPrefix(out.String(), "WARN NET/MyFabric : ignoring NCCL_MYFABRIC_DISABLE=maybe"), out.String())
}
