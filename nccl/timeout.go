package nccl

import (
	"net"
	"time"
)

// NCCL_GO_TIMEOUT is plugin-wide: every transport that can lose its peer
// silently bounds how long that goes unnoticed by it, so users set one value.
const (
	EnvTimeout     = "NCCL_GO_TIMEOUT"
	DefaultTimeout = 300 * time.Second
)

// PeerTimeout reads NCCL_GO_TIMEOUT (seconds, or a Go duration); 0 or less
// disables the transports' dead-peer checks.
func PeerTimeout(log Logger) time.Duration {
	return EnvDuration(log, EnvTimeout, DefaultTimeout, time.Second)
}

// KeepAlive is the TCP keepalive that notices a vanished peer host within
// about timeout: first probe after timeout/2, then 5 probes timeout/10
// apart (each at least a second). Not enabled for timeout <= 0.
func KeepAlive(timeout time.Duration) net.KeepAliveConfig {
	if timeout <= 0 {
		return net.KeepAliveConfig{Enable: false}
	}
	return net.KeepAliveConfig{Enable: true, Idle: max(timeout/2, time.Second), Interval: max(timeout/10, time.Second), Count: 5}
}
