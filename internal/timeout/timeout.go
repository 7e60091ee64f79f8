// Package timeout owns NCCL_GO_TIMEOUT, the plugin-wide bound on every wait
// that depends on a peer or the network (connect, handshakes, dead-peer
// detection, close), and the TCP keepalive derived from it. Every transport
// reads the one variable, so users set one value.
package timeout

import (
	"net"
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
)

// Default is NCCL_GO_TIMEOUT's default.
const Default = 300 * time.Second

var env = ncclenv.NewGroup("internal/timeout (socket, ib, shm, glue)", "NET/Go")

// Peer is NCCL_GO_TIMEOUT.
var Peer = env.Duration("NCCL_GO_TIMEOUT", Default, time.Second,
	"bound on every wait that depends on a peer: connect, handshakes, dead-peer detection, close; <= 0 disables dead-peer detection only")

// Read returns NCCL_GO_TIMEOUT, WARNing with the reading transport's prefix.
// A value <= 0 disables dead-peer detection only; waits that must end (connect,
// handshakes) use Bound instead.
func Read(log ncclenv.Logger, prefix string) time.Duration { return Peer.GetFor(log, prefix) }

// Bound is the limit for a wait that must end: d when positive, else the
// default, so that disabling dead-peer detection never makes a call block
// forever.
func Bound(d time.Duration) time.Duration {
	if d <= 0 {
		return Default
	}
	return d
}

// KeepAlive is the TCP keepalive that notices a vanished peer host within
// about d: first probe after d/2, then 5 probes d/10 apart (each at least a
// second, and at most the 32767 s Linux accepts: beyond it the setsockopt
// fails and Go's 15 s defaults stay). Not enabled for d <= 0.
func KeepAlive(d time.Duration) net.KeepAliveConfig {
	if d <= 0 {
		return net.KeepAliveConfig{Enable: false}
	}
	const maxKeep = 32767 * time.Second
	return net.KeepAliveConfig{Enable: true, Idle: min(max(d/2, time.Second), maxKeep), Interval: min(max(d/10, time.Second), maxKeep), Count: 5}
}
