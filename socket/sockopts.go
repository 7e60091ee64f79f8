package socket

import (
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// sockOpts are the per-connection settings, read when a connection is set
// up (listen or connect), never on the data path.
type sockOpts struct {
	sndBuf, rcvBuf int
	// localSndBuf is the send buffer of a connection within this host
	// (NCCL_GO_SOCKET_LOCAL_SNDBUF); 0 when NCCL_SOCKET_SNDBUF decides.
	localSndBuf int
	timeout     time.Duration // NCCL_GO_TIMEOUT
	live        livePolicy
	inline      int
	idleInline  int
	helpers     int   // per end, decided by each end for itself
	shareAfter  int64 // ns; NCCL_GO_SOCKET_SHARE_AFTER
	quickAck    bool  // NCCL_GO_SOCKET_QUICKACK
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
		shareAfter: shareAfterNs(log),
		quickAck:   quickAck.Get(log),
	}
	o.live = livePolicyFor(o.timeout)
	if o.sndBuf <= 0 {
		o.localSndBuf = localSndBufFor(localSndBuf.Get(log), streams)
	}
	return o
}

// localSndBufFor resolves NCCL_GO_SOCKET_LOCAL_SNDBUF for a connection with
// streams data streams: auto bounds only a connection without them, where one
// socket carries every byte (config.go says what each layout measured).
func localSndBufFor(v int64, streams int) int {
	if v == auto {
		if streams > 0 {
			return 0
		}
		return defaultLocalSndBuf
	}
	return max(int(v), 0)
}

// sameHost reports whether the connected socket fd reaches a peer on this
// host: a loopback peer, or a peer whose address is the socket's own local
// address (the kernel routes a connection to one of our addresses over lo).
func sameHost(fd int) bool {
	la, err := unix.Getsockname(fd)
	if err != nil {
		return false
	}
	ra, err := unix.Getpeername(fd)
	if err != nil {
		return false
	}
	return sameHostAddrs(addrPortOf(la).Addr(), addrPortOf(ra).Addr())
}

func sameHostAddrs(local, peer netip.Addr) bool {
	local, peer = local.Unmap().WithZone(""), peer.Unmap().WithZone("")
	return peer.IsValid() && (peer.IsLoopback() || peer == local)
}

// procSys is where net.core.wmem_max is read; tests point it elsewhere.
var procSys = "/proc/sys"

// wmemMax is net.core.wmem_max, the most SO_SNDBUF may ask for without
// CAP_NET_ADMIN; 0 if unreadable.
func wmemMax() int {
	b, err := os.ReadFile(filepath.Join(procSys, "net", "core", "wmem_max"))
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

var localSndBufSkipped sync.Once

// setSockInt is setsockopt; tests make SO_SNDBUFFORCE fail with it, as it
// does for a process without CAP_NET_ADMIN.
var setSockInt = unix.SetsockoptInt

// boundLocalSndBuf gives the sending sockets of a connection within this
// host o.localSndBuf of send buffer. A socket whose buffer is set keeps it
// for good (the kernel stops autotuning it), so a value that
// net.core.wmem_max would cut down is not set at all: a send queue smaller
// than asked for costs bandwidth at 1 MiB (at 416 KiB, a ninth on the 2-core
// VM), where autotuning costs nothing. Cross-host connections keep
// autotuning: their queue must cover the path's bandwidth-delay product.
func boundLocalSndBuf(fds []int, o sockOpts, log nccl.Logger) {
	if o.localSndBuf <= 0 || len(fds) == 0 || !sameHost(fds[0]) {
		return
	}
	opt := unix.SO_SNDBUFFORCE
	if setSockInt(fds[0], unix.SOL_SOCKET, opt, o.localSndBuf) != nil {
		if m := wmemMax(); o.localSndBuf > m {
			localSndBufSkipped.Do(func() {
				log.Infof(nccl.SubsysNet, "NET/GoSocket : connections within this host keep the kernel's send buffer autotuning: "+
					"%s=%d is above net.core.wmem_max (%d) and the process may not exceed it (no CAP_NET_ADMIN); "+
					"raise net.core.wmem_max to bound their send queue", envLocalSndBuf, o.localSndBuf, m)
			})
			return
		}
		opt = unix.SO_SNDBUF
	}
	for _, fd := range fds {
		if err := setSockInt(fd, unix.SOL_SOCKET, opt, o.localSndBuf); err != nil {
			log.Infof(nccl.SubsysNet, "NET/GoSocket : setting the send buffer of a connection within this host to %d: %v", o.localSndBuf, err)
			return
		}
	}
}

// setAcks with delayed puts the receiving end of a one-way stream into the
// kernel's delayed-ACK ("ping-pong") mode, which the kernel enters by itself
// only on a connection whose end also sends data soon after receiving.
// Outside it, every read that empties the socket of a small message sends a
// pure ACK from inside that read: on NCCL's thread, on the round trip's
// critical path, and over loopback the sender's side of that ACK too. In it,
// the ACK goes with every second small message (or on the delayed-ACK timer),
// as on one connection carrying both directions. 8 B round trip on the 2-core
// VM: 4 -> 3 segments, about a sixth faster (docs/performance.md). Without
// delayed, the socket goes back to the kernel's rule.
func setAcks(fd int, delayed bool) error {
	v := 1
	if delayed {
		v = 0
	}
	return setSockInt(fd, unix.IPPROTO_TCP, unix.TCP_QUICKACK, v)
}
