package plugin

import (
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/metrics"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// NCCL_GO_STALL_WARN (default 5 s, 0 disables): a request still pending after
// this long gets a WARN, then again at doubling intervals up to
// maxStallPeriod. NCCL's own watchdogs say nothing about which peer or device
// is stuck; this does.
const (
	defaultStallWarn = 5 * time.Second
	maxStallPeriod   = int64(5 * time.Minute)
)

// readStallWarn reads NCCL_GO_STALL_WARN in nanoseconds (0: off).
func readStallWarn() int64 {
	d := nccl.EnvDuration(log, "NCCL_GO_STALL_WARN", defaultStallWarn, time.Second)
	if d < 0 {
		d = 0
	}
	return int64(d)
}

// slowClose is how long a transport's Close may take before the glue WARNs:
// NCCL closes comms on its service thread at teardown and during
// ncclCommAbort, so a slow Close holds up the job's exit or recovery. The
// transports bound Close by NCCL_GO_TIMEOUT; the WARN says which one was slow.
const slowClose = time.Second

// now is the glue's clock (monotonic nanoseconds); tests replace it.
var now = metrics.Now
