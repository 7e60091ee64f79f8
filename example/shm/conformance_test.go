package shm

import (
	"testing"
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
	"github.com/libnccl-net-go/libnccl-net-go/nccl/nccltest"
)

// TestConformance holds shm to the same in-process contract suite as every
// transport of this project (the C harness checks the built library).
func TestConformance(t *testing.T) {
	shmDir(t)
	opts := nccltest.Options{RequireDevice: true}
	if !testing.Short() && !raceEnabled {
		opts.MaxSize = nccl.MaxNetSize
		opts.Timeout = 5 * time.Minute // a 1 GiB pattern fill and compare on a small machine
	}
	nccltest.Run(t, New, opts)
}
