package plugin

import (
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/internal/clock"
)

// NCCL_GO_STALL_WARN (config.go): a request still pending after that long gets
// a WARN, then again at doubling intervals up to maxStallPeriod. NCCL's own
// watchdogs say nothing about which peer or device is stuck; this does.

// slowClose is how long a transport's Close may take before the glue WARNs:
// NCCL closes comms on its service thread at teardown and during
// ncclCommAbort, so a slow Close holds up the job's exit or recovery. The
// transports bound Close by NCCL_GO_TIMEOUT; the WARN says which one was slow.
const slowClose = time.Second

// now is the glue's clock for Close (monotonic nanoseconds); tests replace it.
var now = clock.Now
