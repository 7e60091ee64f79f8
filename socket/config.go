package socket

import (
	"runtime"
	"strconv"
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclsock"
	"github.com/libnccl-net-go/libnccl-net-go/internal/timeout"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Settings. Every variable the transport reads is declared here, and read
// when a connection is set up (Init/Listen/Connect; NCCL applies nccl.conf
// with setenv after the library is loaded), never on the data path. The
// ones ib's handshake reads too (interfaces, family, magic, connect retries)
// belong to internal/ncclsock, NCCL_GO_TIMEOUT to internal/timeout.
const (
	envNThreads     = "NCCL_SOCKET_NTHREADS"
	envNSocks       = "NCCL_NSOCKS_PERTHREAD"
	envSndBuf       = "NCCL_SOCKET_SNDBUF"
	envRcvBuf       = "NCCL_SOCKET_RCVBUF"
	envInline       = "NCCL_SOCKET_INLINE"
	envMinChunk     = "NCCL_SOCKET_MIN_TASKSIZE"
	envHelloTimeout = "NCCL_GO_SOCKET_HELLO_TIMEOUT"
	envIdleInline   = "NCCL_GO_SOCKET_IDLE_INLINE"
	envHelpers      = "NCCL_GO_SOCKET_HELPERS"
	envLocalSndBuf  = "NCCL_GO_SOCKET_LOCAL_SNDBUF"
	envShareAfter   = "NCCL_GO_SOCKET_SHARE_AFTER"
	envQuickAck     = "NCCL_GO_SOCKET_QUICKACK"

	defaultHelloWait = 10 * time.Second

	// defaultNThreads × defaultNSocks streams on a host with at least
	// minCPUsForStreams CPUs, chosen with the harness bw benchmark
	// (docs/performance.md): on 16 cores 4 streams with a goroutine each
	// moved 1 MiB messages at 3.0-4.8× one stream driven by NCCL's thread;
	// 8 only added context switches. On 2 cores, 4 streams moved by NCCL's
	// thread alone cost a third of the bandwidth at 1 MiB and gained about a
	// tenth at 64 MiB, still short of TCP x4 ("Data streams on 2 cores"), so
	// small hosts default to no data streams.
	defaultNThreads   = 4
	defaultNSocks     = 1
	minCPUsForStreams = 8
	maxStreams        = 64
	maxThreads        = 16 // NCCL's MAX_THREADS for NCCL_SOCKET_NTHREADS
	// defaultInline: messages up to this size go inline on the control
	// stream, handled on NCCL's thread. Above it, the hand-off to stream
	// goroutines costs less than the single-stream copy.
	defaultInline = 16 << 10
	maxInline     = 1 << 20
	// defaultIdleInline: up to this size a message also goes inline when
	// the connection has nothing else in flight (NCCL's pipelines of one
	// chunk at a time, ping-pongs). Chosen with the harness lat benchmark
	// and real NCCL's broadcast (docs/socket.md).
	defaultIdleInline = 256 << 10
	// defaultMinChunk: a message is split in chunks of at least this many
	// bytes (NCCL_SOCKET_MIN_TASKSIZE, NCCL's default 64 KiB).
	defaultMinChunk = 64 << 10

	// defaultLocalSndBuf: SO_SNDBUF of the sending socket of a connection
	// within one host that has no data streams (the kernel doubles it: 1 MiB
	// of send queue). With nothing on the wire to cover, autotuning grows the
	// queue to tcp_wmem's maximum (4 MiB) and the bytes in flight leave the
	// cache before the receiver copies them; at 1 MiB a 64 MiB stream on the
	// 2-core VM moved 1.15-1.8x more (median of six rounds 1.5x), with no
	// change up to 4 MiB. A connection with data streams keeps autotuning:
	// on the 16-core GPU host the bound cost real NCCL a third of its
	// broadcast bandwidth at 64 KiB-64 MiB, though the harness gained from
	// it there at 16-64 MiB (docs/performance.md, "Send queue within one host").
	defaultLocalSndBuf = 512 << 10

	defaultHelpers    = 4
	minCPUsForHelpers = 8

	// defaultShareAfter: how long NCCL's thread leaves a stream that has a
	// helper to that helper before moving its chunks itself. Racing the
	// helpers for every chunk (0, the rule from 11-24 to 11-26) made NCCL's
	// thread win nearly every race: it sweeps the streams right after
	// queueing, before a woken helper runs, so the copies of eight 64 KiB
	// messages in flight ran on one thread (3.6 GB/s, 140 % CPU, on the
	// 16-core H200 host), where helpers doing every striped copy had moved
	// 7.75 GB/s and real NCCL's send/recv 2.2-2.5x NCCL Socket from 16 MiB
	// (1.1-1.2x with the race). Longer than a helper's wake-up on an idle
	// core, short next to a scheduler tick, so a helper that cannot run
	// (an oversubscribed host) costs a tenth of a millisecond, not a stall.
	defaultShareAfter = 100 * time.Microsecond

	// ackReassert: the receiving end of a control stream clears
	// TCP_QUICKACK again after this many reads that brought data. The kernel
	// leaves its delayed-ACK ("ping-pong") mode when its delayed-ACK timer
	// fires (a quiet stream with a message left unacknowledged for 40 ms
	// or more) or on a retransmitted segment, and a connection that never
	// sends data never enters it again by itself: NCCL's bursts, one per
	// collective with idle gaps between training steps, would leave it at
	// every gap. One setsockopt per 64 reads (a few percent of one read's
	// cost) bounds the time spent outside it without a clock read.
	ackReassert = 64
	// ackSmallMax: a control stream whose messages carried more than this
	// inline within the last ackReassert reads gets the kernel's ACK rule
	// back (setAckMode). At 64 KiB and below the two rules moved the same
	// (harness bw, 2-core VM); a 32 KiB ping-pong gained from delayed ACKs.
	ackSmallMax = 64 << 10

	// auto is NCCL's "pick for me" value of NCCL_SOCKET_NTHREADS and
	// NCCL_NSOCKS_PERTHREAD (and of our NCCL_GO_SOCKET_HELPERS).
	auto = -2
)

var env = ncclenv.NewGroup("socket", logPrefix)

var (
	nThreads = env.Int(envNThreads, auto,
		"data streams per connection, times NCCL_NSOCKS_PERTHREAD (at most 16, and 64 streams, as NCCL); 0: everything on the control stream; -2: auto").
		ShowDefault("auto (4 with >= 8 CPUs, else 0)")
	nSocks = env.Int(envNSocks, auto,
		"data streams per NCCL_SOCKET_NTHREADS; only the product matters; -2: auto (1)").
		ShowDefault("auto (1)")
	sndBuf = env.Int(envSndBuf, -1,
		"SO_SNDBUF of every socket, bytes; <= 0 leaves the kernel's autotuning").ShowDefault("-1 (kernel autotuning)")
	rcvBuf = env.Int(envRcvBuf, -1,
		"SO_RCVBUF of every socket, bytes; <= 0 leaves the kernel's autotuning").ShowDefault("-1 (kernel autotuning)")
	localSndBuf = env.Int(envLocalSndBuf, auto,
		"SO_SNDBUF of the sending sockets of a connection whose peer is on this host (loopback or one of its own addresses), bytes; 0 or -1 leaves the kernel's autotuning; -2: auto (512 KiB for a connection without data streams, autotuning for one with them); a NCCL_SOCKET_SNDBUF above 0 applies instead").
		In(auto, 1<<30).ShowDefault("auto (524288 without data streams, else autotuning)")
	inlineMax = env.Int(envInline, defaultInline,
		"messages up to this size travel inline on the control stream").In(0, maxInline)
	idleInlineMax = env.Int(envIdleInline, defaultIdleInline,
		"a message up to this size that is alone in flight also goes inline; 0: off").In(0, maxInline)
	minTask = env.Int(envMinChunk, defaultMinChunk,
		"smallest chunk of a message striped over the data streams").In(4096, 1<<30)
	helloWait = env.Duration(envHelloTimeout, defaultHelloWait, time.Second,
		"how long an accepted connection may stay silent before the listener drops it; <= 0: the default")
	helpers = env.Int(envHelpers, auto,
		"goroutines per connection end moving striped chunks beside NCCL's thread (at most one per stream); -2: auto").
		ShowDefault("auto (4 with >= 8 CPUs, else 0)")
	shareAfter = env.Duration(envShareAfter, defaultShareAfter, time.Microsecond,
		"how long a data stream with a helper may go without progress before NCCL's thread moves its chunks itself, microseconds; 0: at once (NCCL's thread races the helpers for every chunk)").
		In(0, time.Second)
	quickAck = env.Bool(envQuickAck, false,
		"1: the receiving end of a connection acknowledges every small message at once (the kernel's rule for a connection that only receives); 0: it delays the acknowledgement, as the kernel does for request-response traffic, and acknowledges every second small message")
)

// The shared settings' names, for the hints in WARNs.
var (
	envIfname     = ncclsock.IfName.Name()
	envFamily     = ncclsock.SockFamily.Name()
	envMagic      = ncclsock.Magic.Name()
	envRetryCnt   = ncclsock.RetryCount.Name()
	envRetrySleep = ncclsock.RetrySleep.Name()
	envTimeout    = timeout.Peer.Name()
)

// magic is NCCL_SOCKET_MAGIC, as NCCL's strtoull reads it; a malformed value
// is a WARN and the default.
func magic(log nccl.Logger) uint64 { return ncclsock.ReadMagic(log, logPrefix) }

// peerTimeout is NCCL_GO_TIMEOUT.
func peerTimeout(log nccl.Logger) time.Duration { return timeout.Read(log, logPrefix) }

// retryPolicy is NCCL's connect retry policy.
func retryPolicy(log nccl.Logger) ncclsock.Retry { return ncclsock.ReadRetry(log, logPrefix) }

// readAuto reads a count whose -2 means auto; any other negative value is
// a WARN and auto too. (Not a declared range: its WARN would say "using -2".)
func readAuto(log nccl.Logger, v *ncclenv.IntVar, autoValue int64) int64 {
	n := v.Get(log)
	if autoRefused(n) {
		log.Warnf("%s : ignoring %s=%d: must be >= 0, or -2 for auto; using auto (%d)", logPrefix, v.Name(), n, autoValue)
	}
	if n < 0 {
		return autoValue
	}
	return n
}

// autoRefused says whether readAuto WARNs about count n.
func autoRefused(n int64) bool { return n < 0 && n != auto }

func init() {
	// ncclnet-go env reports what readAuto WARNs about, on top of the
	// declared grammar.
	for _, v := range []*ncclenv.IntVar{nThreads, nSocks, helpers} {
		ncclenv.SetCheck(v.Name(), func(raw string) ncclenv.Verdict {
			vd := v.Check(raw)
			// Also when read in part ("-1k" is -1): readAuto sees the number.
			if n, err := strconv.ParseInt(vd.Used, 10, 64); !vd.Invalid && err == nil && autoRefused(n) {
				return ncclenv.Verdict{Used: "auto", Invalid: true, Why: "must be >= 0, or -2 for auto; the plugin uses auto"}
			}
			return vd
		})
	}
}

// streamCount is NCCL_SOCKET_NTHREADS × NCCL_NSOCKS_PERTHREAD with NCCL's
// caps, so that a value tuned for NCCL's socket transport opens as many
// streams here: at most 16 "threads", and past 64 streams the per-thread count
// drops to 64 / threads (12 × 6 is 12 × 5 = 60, as in NCCL). NCCL's "auto"
// (-2, or unset) picks our measured default; 0 threads means no data streams:
// every byte goes over the control stream on NCCL's thread.
func streamCount(log nccl.Logger) int {
	nt := readAuto(log, nThreads, autoThreads(usableCPUs()))
	ns := readAuto(log, nSocks, defaultNSocks)
	if nt > maxThreads {
		log.Warnf("%s : %s=%d is greater than the maximum allowed, using %d", logPrefix, envNThreads, nt, maxThreads)
		nt = maxThreads
	}
	if nt > 0 && ns > maxStreams/nt {
		log.Warnf("%s : %s × %s = %d×%d is more than %d streams; using %s=%d", logPrefix, envNThreads, envNSocks, nt, ns, maxStreams, envNSocks, maxStreams/nt)
		ns = maxStreams / nt
	}
	return int(nt * ns)
}

// numCPU is runtime.NumCPU; a variable so that a test can play a big host.
var numCPU = runtime.NumCPU

// usableCPUs is the CPU count the autos go by: the CPUs the Go runtime's
// threads may run on (runtime.NumCPU: the affinity mask of the thread that
// loaded the library), lowered to GOMAXPROCS. Under a cgroup CPU quota (a
// container's CPU limit) the runtime sets GOMAXPROCS to the quota (Go 1.25+)
// while NumCPU still counts every CPU of the node, and a pod limited to two
// CPUs on a 64-core node has no cores to spare for helpers.
func usableCPUs() int { return min(numCPU(), runtime.GOMAXPROCS(0)) }

// autoThreads is NCCL_SOCKET_NTHREADS's "auto" for a host with ncpu CPUs
// (usableCPUs).
func autoThreads(ncpu int) int64 {
	if ncpu < minCPUsForStreams {
		return 0
	}
	return defaultNThreads
}

func inlineLimit(log nccl.Logger) int { return int(inlineMax.Get(log)) }

// idleInlineLimit is NCCL_GO_SOCKET_IDLE_INLINE; 0 turns the idle rule off.
func idleInlineLimit(log nccl.Logger) int { return int(idleInlineMax.Get(log)) }

func minChunk(log nccl.Logger) int { return int(minTask.Get(log)) }

func helloTimeout(log nccl.Logger) time.Duration {
	d := helloWait.Get(log)
	if d <= 0 {
		d = defaultHelloWait
	}
	return d
}

// helperCount is NCCL_GO_SOCKET_HELPERS: goroutines per connection end that
// move striped chunks beside NCCL's thread (which never blocks on one, and
// moves a helper's stream itself when it stalls). Auto (unset or -2) is one per stream, at most
// defaultHelpers, on hosts with minCPUsForHelpers CPUs or more; none below,
// where every extra runnable thread takes a core from NCCL's.
func helperCount(log nccl.Logger, streams int) int {
	return min(int(readAuto(log, helpers, autoHelpers(usableCPUs()))), streams)
}

// shareAfterNs is NCCL_GO_SOCKET_SHARE_AFTER in nanoseconds.
func shareAfterNs(log nccl.Logger) int64 { return int64(shareAfter.Get(log)) }

func autoHelpers(ncpu int) int64 {
	if ncpu < minCPUsForHelpers {
		return 0
	}
	return defaultHelpers
}

// livePolicy is how a connection tells a live peer from a dead one, derived
// from NCCL_GO_TIMEOUT (docs/socket.md, "Liveness"). Every figure is in
// nanoseconds except the keepalive ones, which the kernel takes in seconds.
type livePolicy struct {
	timeout   int64 // <= 0: no dead-peer detection (closed peers are still seen)
	period    int64 // between two checks on NCCL's thread
	pingAfter int64 // no answer from the peer's kernel for this long: send a ping
	deadAfter int64 // no answer for this long, with a ping outstanding: dead
	grace     int64 // a ping younger than this is never held against the peer
	keepIdle  int   // TCP_KEEPIDLE = TCP_KEEPINTVL on the liveness stream, seconds
	keepCnt   int
}

const (
	// maxCheckPeriod bounds how late a killed peer (FIN or RST on the
	// liveness stream) is noticed; a check costs two syscalls.
	maxCheckPeriod = 100 * time.Millisecond
	minCheckPeriod = 10 * time.Millisecond
	// pingGrace covers the peer kernel's delayed ACK (at most 200 ms on
	// Linux, TCP_DELACK_MAX) plus a round trip.
	pingGrace = 250 * time.Millisecond
)

func livePolicyFor(timeout time.Duration) livePolicy {
	if timeout <= 0 {
		return livePolicy{period: int64(maxCheckPeriod)}
	}
	p := livePolicy{timeout: int64(timeout), grace: int64(pingGrace)}
	p.period = int64(min(max(timeout/10, minCheckPeriod), maxCheckPeriod))
	// The ping goes out as late as the verdict allows: an unanswered ping
	// stops the keepalive probes, which come at fixed intervals, and its own
	// retransmissions back off exponentially (0.2, 0.4, 0.8 s ...), so an
	// early ping could still be waiting for its next retransmission long
	// after the link came back, and the peer be declared dead though its
	// host answers again. Half the timeout for short timeouts, where
	// keepalive's 1 s granularity is too coarse.
	p.pingAfter = max(p.timeout/2, p.timeout-p.period-p.grace)
	// Dead one check period before the timeout, so that the error comes
	// within it; never before a ping had its grace.
	p.deadAfter = max(p.timeout-p.period, p.pingAfter+p.grace)
	// The kernel probes an idle liveness stream every quarter timeout: a
	// live peer's answers keep the last ACK younger than pingAfter, so for
	// timeouts of 2 s and more no ping is ever written.
	p.keepIdle = int(min(max(timeout/4, time.Second), 32767*time.Second) / time.Second)
	p.keepCnt = 8
	return p
}
