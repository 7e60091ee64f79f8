package socket

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// TestDataPathAllocFree: irecv, isend and test allocate nothing, whether a
// message goes inline on the control stream or striped over data streams
// (helpers' goroutines included: AllocsPerRun counts the whole process).
func TestDataPathAllocFree(t *testing.T) {
	for _, c := range []struct {
		name string
		env  map[string]string
		size int
	}{
		{"inline", map[string]string{envNThreads: "0"}, 8},
		{"control-stream-1MiB", map[string]string{envNThreads: "0"}, 1 << 20},
		{"striped", map[string]string{envNThreads: "2", envIdleInline: "0", envHelpers: "0"}, 1 << 20},
		{"striped-helpers", map[string]string{envNThreads: "2", envIdleInline: "0", envHelpers: "2"}, 1 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, s, r := benchPair(t, c.env)
			src, dst := make([]byte, c.size), make([]byte, c.size)
			bufs := []nccl.RecvBuffer{{Data: bufPtr(dst), Size: c.size, Tag: 1}}
			sizes := make([]int, 1)
			var failed error
			round := func() {
				if failed != nil {
					return
				}
				rq, err := r.Irecv(bufs)
				if err != nil || rq == nccl.NoRequest {
					failed = nccl.Errorf(nccl.InternalError, "irecv: %v, %d", err, rq)
					return
				}
				sq, err := s.Isend(bufPtr(src), c.size, 1, 0)
				if err != nil || sq == nccl.NoRequest {
					failed = nccl.Errorf(nccl.InternalError, "isend: %v, %d", err, sq)
					return
				}
				for sd, rd := false, false; !sd || !rd; {
					if !sd {
						if sd, _, err = s.Test(sq); err != nil {
							failed = err
							return
						}
					}
					if !rd {
						if rd, err = r.Test(rq, sizes); err != nil {
							failed = err
							return
						}
					}
				}
			}
			allocs := testing.AllocsPerRun(50, round)
			require.NoError(t, failed)
			assert.Zero(t, allocs, "allocations per message on the data path")
			assert.Equal(t, c.size, sizes[0])
		})
	}
}
