package socket

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Each stream helper holds an OS thread while its connection is open, and the
// Go runtime aborts the process past 10,000 threads: without a process-wide
// budget, a job with a few thousand connection ends at the default 4 helpers
// each was killed by its network plugin (measured: 152 ends with 64 helpers
// each held 9,626 threads). Connections past the budget get fewer helpers or
// none, still move their data, and give theirs back when they close.
func TestHelperBudgetBoundsTheProcess(t *testing.T) {
	old := helperBudget.limit
	helperBudget.limit = 6
	helperBudget.warned.Store(false)
	t.Cleanup(func() { helperBudget.limit = old; helperBudget.warned.Store(false) })
	require.Zero(t, helperBudget.used.Load(), "helpers left over by an earlier test")
	withEnv(t, map[string]string{envNThreads: "4", envHelpers: "4", envInline: "0", envIdleInline: "0"})
	log := &captureLog{}
	tr := initLoopback(t, log)

	s1, r1 := pair(t, tr)
	assert.Equal(t, 6, len(s1.helpers)+len(r1.helpers), "the first connection takes the whole budget of 6")
	assert.Equal(t, int64(6), helperBudget.used.Load())

	s2, r2 := pair(t, tr)
	assert.Zero(t, len(s2.helpers)+len(r2.helpers), "the budget is spent")
	exchange(t, s2, r2, 4<<20) // striped over 4 streams, all moved by NCCL's thread
	exchange(t, s1, r1, 4<<20)
	assert.Equal(t, 1, strings.Count(log.String(), "stream helpers, the most it keeps"), log.String())

	require.NoError(t, s1.Close())
	require.NoError(t, r1.Close())
	assert.Equal(t, int64(0), helperBudget.used.Load(), "closing gives the helpers back")
	s3, r3 := pair(t, tr)
	assert.Equal(t, 6, len(s3.helpers)+len(r3.helpers), "a later connection gets them again")
	exchange(t, s3, r3, 4<<20)
	require.NoError(t, s3.Close())
	require.NoError(t, r3.Close())
	require.NoError(t, s2.Close())
	require.NoError(t, r2.Close())
	assert.Equal(t, int64(0), helperBudget.used.Load())
}
