// Package ncclsock owns the NCCL socket settings that the socket transport and
// ib's out-of-band handshake share, with NCCL's meaning: which IP interfaces
// to use (NCCL_SOCKET_IFNAME, NCCL_SOCKET_FAMILY, the NCCL_COMM_ID subnet
// hint, NCCL's default search order), the handshake magic
// (NCCL_SOCKET_MAGIC) and the connect retry policy
// (NCCL_SOCKET_RETRY_CNT, NCCL_SOCKET_RETRY_SLEEP_MSEC).
package ncclsock

import (
	"fmt"
	"math"
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
)

var env = ncclenv.NewGroup("internal/ncclsock (socket, ib)", "NET/Go")

// DefaultMagic is NCCL's built-in NCCL_SOCKET_MAGIC.
const DefaultMagic = 0x564ab9f2fc4b9d6c

// The shared declarations. Read them with the functions below, which take the
// reading transport's log prefix.
var (
	IfName = env.List("NCCL_SOCKET_IFNAME", ncclenv.MaxIfs,
		"IP interfaces to use: comma-separated name prefixes, '^' excludes, '=' exact names; ignored when one character long")
	SockFamily = env.Family("NCCL_SOCKET_FAMILY", ncclenv.AnyFamily,
		"restrict the interfaces' address family: AF_INET or AF_INET6")
	CommID = env.String("NCCL_COMM_ID", "",
		"NCCL's bootstrap address <host>:<port>; without NCCL_SOCKET_IFNAME an interface in its subnet is preferred after ib*")
	Magic = env.Uint64("NCCL_SOCKET_MAGIC", DefaultMagic,
		"handshake magic (decimal or 0x hex, 64-bit); both ends must agree")
	RetryCount = env.Int("NCCL_SOCKET_RETRY_CNT", 34,
		"retries of a refused, unreachable or timed-out connect").Clamp(0, math.MaxInt32)
	RetrySleep = env.Duration("NCCL_SOCKET_RETRY_SLEEP_MSEC", 100*time.Millisecond, time.Millisecond,
		"connect back-off unit: retry n sleeps n times this").Clamp(0, time.Minute)
)

func init() {
	// Find ignores a one-character value, as NCCL does; the list's own check
	// would take it for a prefix.
	ncclenv.SetCheck(IfName.Name(), func(raw string) ncclenv.Verdict {
		if len(raw) == 1 {
			return ncclenv.Verdict{Used: "NCCL's default search", Invalid: true,
				Why: "NCCL ignores a value of one character; the plugin uses NCCL's default interface search"}
		}
		return IfName.Check(raw)
	})
	// subnetOfCommID's syntax rule; env does not resolve host names.
	ncclenv.SetCheck(CommID.Name(), func(raw string) ncclenv.Verdict {
		if len(raw) <= 1 {
			return ncclenv.Verdict{Used: raw}
		}
		if _, _, err := splitHostPort(raw); err != nil {
			return ncclenv.Verdict{Used: "none", Invalid: true, Why: fmt.Sprintf("not <host>:<port> or [<ipv6>]:<port> (%v); the plugin skips its subnet rule when choosing interfaces", err)}
		}
		return ncclenv.Verdict{Used: raw}
	})
}

// ReadMagic returns NCCL_SOCKET_MAGIC: an unsigned 64-bit number, decimal, 0x
// hex or 0-prefixed octal as NCCL's strtoull reads it; anything else is a WARN
// and the default.
func ReadMagic(log ncclenv.Logger, prefix string) uint64 { return Magic.GetFor(log, prefix) }

// ReadFamily returns NCCL_SOCKET_FAMILY (AF_INET or AF_INET6, exactly as NCCL
// compares them); anything else is a WARN and any family.
func ReadFamily(log ncclenv.Logger, prefix string) ncclenv.Family {
	return SockFamily.GetFor(log, prefix)
}

// Retry is NCCL's connect retry policy: on a refused, unreachable or timed-out
// connect, try again up to Count times, attempt n sleeping n × Sleep.
type Retry struct {
	Count int
	Sleep time.Duration
}

// ReadRetry returns the retry policy. Negative values are a WARN and 0.
func ReadRetry(log ncclenv.Logger, prefix string) Retry {
	return Retry{Count: int(RetryCount.GetFor(log, prefix)), Sleep: RetrySleep.GetFor(log, prefix)}
}
