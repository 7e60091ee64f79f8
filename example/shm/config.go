package shm

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/internal/timeout"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// logPrefix starts every log line and error message of this transport.
const logPrefix = "NET/GoShm"

// Every setting shm reads, declared once; read at Init, Listen, Connect and
// Accept (never on the data path), through the lookup the glue points at C
// getenv.
var env = ncclenv.NewGroup("example/shm", logPrefix)

var (
	settingDisable = env.Bool("NCCL_GO_SHM_DISABLE", false,
		"1: report no device, so NCCL falls back")
	settingDir = env.String("NCCL_GO_SHM_DIR", defaultDir,
		"directory (a tmpfs) for connection files; <dir>/ncclgo-shm-<pid>-<16 hex> must fit in 71 bytes")
	settingRing = env.Int("NCCL_GO_SHM_RING_SIZE", defaultRing,
		"bytes of each connection's data ring: a power of two").In(minRing, maxRing)
	settingSpeed = env.Int("NCCL_GO_SHM_SPEED", defaultSpeed,
		"Mbps advertised to NCCL's topology search").In(1, math.MaxInt32)
)

const (
	envDisable = "NCCL_GO_SHM_DISABLE"
	envDir     = "NCCL_GO_SHM_DIR"
	envRing    = "NCCL_GO_SHM_RING_SIZE"
	envSpeed   = "NCCL_GO_SHM_SPEED"

	defaultDir = "/dev/shm"
	// defaultSpeed is about what two memcpy passes through the ring sustain
	// (12-18 GB/s between two processes on a small VM, see docs/extending.md):
	// NCCL weighs devices by speed, so it should not promise a 400G NIC.
	defaultSpeed = 100000
)

func init() {
	// ringSizeSetting's rule, for `ncclnet-go env`.
	ncclenv.SetCheck(envRing, func(raw string) ncclenv.Verdict {
		v := settingRing.Check(raw)
		if n, err := strconv.ParseInt(v.Used, 10, 64); err == nil && !v.Invalid && n&(n-1) != 0 {
			return ncclenv.Verdict{Used: strconv.Itoa(defaultRing), InPart: v.InPart, Invalid: true,
				Why: fmt.Sprintf("%d is not a power of two from %d to %d; the plugin uses the default %d", n, minRing, maxRing, defaultRing)}
		}
		return v
	})
}

// ringSizeSetting is NCCL_GO_SHM_RING_SIZE: a power of two in [minRing,
// maxRing], else a WARN and the default.
func ringSizeSetting(log nccl.Logger) uint64 {
	n := settingRing.Get(log)
	if n&(n-1) != 0 {
		if log != nil {
			log.Warnf("%s : ignoring %s=%d: expected a power of two from %d to %d; using %d", logPrefix, envRing, n, minRing, maxRing, defaultRing)
		}
		n = defaultRing
	}
	return uint64(n)
}

// peerTimeout is NCCL_GO_TIMEOUT as shm uses it: it bounds the connection
// handshake (a listener that never accepts, a connector that never finishes),
// and a value <= 0 turns off dead-peer checks on the data path (the handshake
// bound then falls back to the default; no call may wait forever).
func peerTimeout(log nccl.Logger) time.Duration { return timeout.Read(log, logPrefix) }
