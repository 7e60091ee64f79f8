package socket

import (
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// sockOpts are the per-connection settings, read when a connection is set
// up (listen or connect), never on the data path.
type sockOpts struct {
	sndBuf, rcvBuf int
	timeout        time.Duration // NCCL_GO_TIMEOUT
	live           livePolicy
	inline         int
	idleInline     int
	helpers        int // per end, decided by each end for itself
}

// readSockOpts reads the settings of a connection with streams data streams.
func readSockOpts(log nccl.Logger, streams int) sockOpts {
	o := sockOpts{
		sndBuf:     int(sndBuf.Get(log)),
		rcvBuf:     int(rcvBuf.Get(log)),
		timeout:    peerTimeout(log),
		inline:     inlineLimit(log),
		idleInline: idleInlineLimit(log),
		helpers:    helperCount(log, streams),
	}
	o.live = livePolicyFor(o.timeout)
	return o
}
