package plugin

import (
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// stallWarn is NCCL_GO_STALL_WARN in nanoseconds (0 disables): a request still
// pending after this long gets a WARN, then again at doubling intervals up to
// maxStallPeriod. NCCL's own watchdogs say nothing about which peer or device
// is stuck; this does.
var stallWarn int64 = int64(5 * time.Second)

const maxStallPeriod = int64(5 * time.Minute)

func readStallSettings() {
	d := nccl.EnvDuration(log, "NCCL_GO_STALL_WARN", 5*time.Second, time.Second)
	if d < 0 {
		d = 0
	}
	stallWarn = int64(d)
}
