package socket

import (
	"testing"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
	"github.com/libnccl-net-go/libnccl-net-go/nccl/nccltest"
)

// TestConformance runs the shared suite over loopback with the default
// stream layout (which depends on the CPU count), with every byte on the
// control stream (no data streams), with 4 streams moved by NCCL's thread
// alone and with helpers, and with many streams.
func TestConformance(t *testing.T) {
	for _, c := range []struct {
		name    string
		env     map[string]string
		maxSize int
	}{
		{"default", nil, 64 << 20},
		// The other layouts share all code above the wire; 16 MiB still
		// covers every striping and inline boundary.
		{"ctrl-only", map[string]string{envNThreads: "0"}, 16 << 20},
		{"4streams", map[string]string{envNThreads: "4", envHelpers: "0"}, 16 << 20},
		// Helper goroutines moving chunks beside NCCL's thread (the default
		// from 8 CPUs up).
		{"4streams-helpers", map[string]string{envNThreads: "4", envHelpers: "4"}, 16 << 20},
		{"3streams-2helpers", map[string]string{envNThreads: "3", envHelpers: "2", envInline: "0", envIdleInline: "0"}, 16 << 20},
		// NCCL's thread racing the helpers for every chunk, and stepping in
		// only after a long stall (its one try per period must not lose or
		// reorder bytes either).
		{"4streams-helpers-eager", map[string]string{envNThreads: "4", envHelpers: "4", envShareAfter: "0"}, 16 << 20},
		{"3streams-2helpers-share1us", map[string]string{envNThreads: "3", envHelpers: "2", envShareAfter: "1", envInline: "0", envIdleInline: "0"}, 16 << 20},
		{"8streams-inline0", map[string]string{envNThreads: "4", envNSocks: "2", envInline: "0", envIdleInline: "0"}, 16 << 20},
		{"3streams-inline1MiB", map[string]string{envNThreads: "3", envInline: "1048576", envMinChunk: "4096"}, 16 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			withEnv(t, c.env)
			nccltest.Run(t, func() nccl.Transport { return newLoopback() }, nccltest.Options{MaxSize: c.maxSize, RequireDevice: true})
		})
	}
}
