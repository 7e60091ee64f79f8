package plugin

import (
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
)

// The glue's settings, read once at the first real init (setupLocked) and
// copied into each comm, so the data path reads none of them. NCCL_GO_TIMEOUT
// belongs to internal/timeout and NCCL_GO_METRICS to package metrics.
var env = ncclenv.NewGroup("plugin", "NET/Go")

var (
	settingTransport = env.String("NCCL_GO_TRANSPORT", "",
		"force one registered transport (ib, socket, shm ...); init fails instead of falling back").ShowDefault("unset (priority order)")
	settingStallWarn = env.Duration("NCCL_GO_STALL_WARN", defaultStallWarn, time.Second,
		"WARN about a request still pending this long after its post, then at doubling intervals; <= 0 disables")
	// NCCL's own. Above 0 NCCL never unloads the plugin, so it calls devices
	// and makes its virtual NICs only once per process and keeps asking for
	// them by index: the transport must then outlive every finalize.
	settingRefCount = env.Int("NCCL_NET_PLUGIN_REF_COUNT", 0,
		"NCCL's: above 0 NCCL never unloads the plugin; the transport (and its fused NICs) then stays up after the last finalize, for the next communicator")
	// NCCL's own: the glue reads it only to skip formatting lines NCCL drops.
	settingDebug = env.String("NCCL_DEBUG", "",
		"NCCL's log level; below INFO the glue does not even format its INFO/TRACE lines").ShowDefault("unset (WARN)")
)

// NCCL_GO_STALL_WARN's default, and the cap of its doubling interval.
const (
	defaultStallWarn = 5 * time.Second
	maxStallPeriod   = int64(5 * time.Minute)
)

// readStallWarn reads NCCL_GO_STALL_WARN in nanoseconds (0: off).
func readStallWarn() int64 {
	return int64(max(settingStallWarn.Get(log), 0))
}
