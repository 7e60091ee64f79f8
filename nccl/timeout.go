package nccl

import (
	"net"
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/internal/timeout"
)

// NCCL_GO_TIMEOUT is plugin-wide: every transport that can lose its peer
// silently bounds how long that goes unnoticed by it, so users set one value.
// It lives in internal/timeout now; these names forward to it until the
// transports in this repository have switched.
const (
	// Deprecated: internal/timeout.Peer declares it.
	EnvTimeout = "NCCL_GO_TIMEOUT"
	// Deprecated: use internal/timeout.Default.
	DefaultTimeout = timeout.Default
)

// PeerTimeout reads NCCL_GO_TIMEOUT (seconds, or a Go duration); 0 or less
// disables the transports' dead-peer checks.
//
// Deprecated: not part of the transport contract; use internal/timeout.Read.
func PeerTimeout(log Logger) time.Duration {
	if log == nil {
		return timeout.Read(nil, legacyPrefix)
	}
	return timeout.Read(log, legacyPrefix)
}

// KeepAlive is the TCP keepalive that notices a vanished peer host within
// about d.
//
// Deprecated: a TCP helper, not part of the transport contract; use
// internal/timeout.KeepAlive.
func KeepAlive(d time.Duration) net.KeepAliveConfig { return timeout.KeepAlive(d) }
