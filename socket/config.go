package socket

import (
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Settings. Every one is read here, through nccl.Env*, when a connection is
// set up (Init/Listen/Connect; NCCL applies nccl.conf with setenv after the
// library is loaded), never on the data path.
const (
	envIfname        = "NCCL_SOCKET_IFNAME"
	envFamily        = "NCCL_SOCKET_FAMILY"
	envMagic         = "NCCL_SOCKET_MAGIC"
	envNThreads      = "NCCL_SOCKET_NTHREADS"
	envNSocks        = "NCCL_NSOCKS_PERTHREAD"
	envSndBuf        = "NCCL_SOCKET_SNDBUF"
	envRcvBuf        = "NCCL_SOCKET_RCVBUF"
	envRetryCnt      = "NCCL_SOCKET_RETRY_CNT"
	envRetrySleep    = "NCCL_SOCKET_RETRY_SLEEP_MSEC"
	envInline        = "NCCL_SOCKET_INLINE"
	envMinChunk      = "NCCL_SOCKET_MIN_TASKSIZE"
	envHelloTimeout  = "NCCL_GO_SOCKET_HELLO_TIMEOUT"
	envIdleInline    = "NCCL_GO_SOCKET_IDLE_INLINE"
	envHelpers       = "NCCL_GO_SOCKET_HELPERS"
	defaultMagic     = 0x564ab9f2fc4b9d6c // NCCL's NCCL_SOCKET_MAGIC default
	defaultRetryCnt  = 34
	defaultRetrySlp  = 100 * time.Millisecond
	defaultHelloWait = 10 * time.Second

	// defaultNThreads × defaultNSocks streams on a host with at least
	// minCPUsForStreams CPUs, chosen with the harness bw benchmark
	// (docs/performance.md): on 16 cores 4 stream goroutines moved 1 MiB
	// messages at 3.0-4.8× one stream driven by NCCL's thread; 8 only added
	// context switches. On 2 cores the stream goroutines starve behind
	// NCCL's spinning progress threads and the same setting moved 0.3-0.4×
	// what the control stream alone did, so small hosts default to no data
	// streams.
	defaultNThreads   = 4
	defaultNSocks     = 1
	minCPUsForStreams = 8
	maxStreams        = 64
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
)

// parseMagic reads NCCL_SOCKET_MAGIC: decimal or 0x-hex, as NCCL's own
// parser; anything else is rejected with the reason.
func parseMagic(v string) (uint64, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return defaultMagic, nil
	}
	var n uint64
	var err error
	if len(v) > 2 && (v[:2] == "0x" || v[:2] == "0X") {
		n, err = strconv.ParseUint(v[2:], 16, 64)
	} else {
		n, err = strconv.ParseUint(v, 10, 64)
	}
	if err != nil {
		return 0, nccl.Errorf(nccl.InvalidArgument, "%s=%q is not a decimal or 0x-hex 64-bit number", envMagic, v)
	}
	return n, nil
}

// magic is the configured magic; a malformed value is a WARN and the default.
func magic(log nccl.Logger) uint64 {
	v, ok := nccl.LookupEnv(envMagic)
	if !ok {
		return defaultMagic
	}
	m, err := parseMagic(v)
	if err != nil {
		log.Warnf("NET/GoSocket : %v; using the default %#x", err, uint64(defaultMagic))
		return defaultMagic
	}
	return m
}

// streamCount is NCCL_SOCKET_NTHREADS × NCCL_NSOCKS_PERTHREAD, capped at 64.
// NCCL's "auto" (-2, or unset) picks our measured default; 0 threads means no
// data streams: every byte goes over the control stream on NCCL's thread.
func streamCount(log nccl.Logger) int {
	nt := nccl.EnvInt(log, envNThreads, -2)
	ns := nccl.EnvInt(log, envNSocks, -2)
	if nt == -2 {
		nt = autoThreads(runtime.NumCPU())
	}
	if ns == -2 {
		ns = defaultNSocks
	}
	if nt < 0 || ns < 0 {
		def := autoThreads(runtime.NumCPU())
		log.Warnf("NET/GoSocket : ignoring %s=%d / %s=%d: must be >= 0 (or -2 for auto); using %d × %d", envNThreads, nt, envNSocks, ns, def, defaultNSocks)
		nt, ns = def, defaultNSocks
	}
	n := nt * ns
	if n > maxStreams {
		log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/GoSocket : %s × %s = %d streams, capped at %d", envNThreads, envNSocks, n, maxStreams)
		n = maxStreams
	}
	return int(n)
}

// autoThreads is NCCL_SOCKET_NTHREADS's "auto" for a host with ncpu CPUs
// (runtime.NumCPU: the CPUs this process may run on).
func autoThreads(ncpu int) int64 {
	if ncpu < minCPUsForStreams {
		return 0
	}
	return defaultNThreads
}

// boundedInt reads an integer setting that must lie in [lo, hi]; a value
// outside is a WARN and the default.
func boundedInt(log nccl.Logger, name string, def, lo, hi int64) int {
	n := nccl.EnvInt(log, name, def)
	if n < lo || n > hi {
		log.Warnf("NET/GoSocket : ignoring %s=%d: must be in [%d, %d]; using %d", name, n, lo, hi, def)
		n = def
	}
	return int(n)
}

func inlineLimit(log nccl.Logger) int { return boundedInt(log, envInline, defaultInline, 0, maxInline) }

// idleInlineLimit is NCCL_GO_SOCKET_IDLE_INLINE; 0 turns the idle rule off.
func idleInlineLimit(log nccl.Logger) int {
	return boundedInt(log, envIdleInline, defaultIdleInline, 0, maxInline)
}

func minChunk(log nccl.Logger) int { return boundedInt(log, envMinChunk, defaultMinChunk, 4096, 1<<30) }

func helloTimeout(log nccl.Logger) time.Duration {
	d := nccl.EnvDuration(log, envHelloTimeout, defaultHelloWait, time.Second)
	if d <= 0 {
		d = defaultHelloWait
	}
	return d
}

// retry is NCCL's connect retry policy: on refused / unreachable / timed out,
// try again up to cnt times, sleeping sleep × attempt (linear backoff).
type retry struct {
	cnt   int
	sleep time.Duration
}

func retryPolicy(log nccl.Logger) retry {
	r := retry{cnt: int(nccl.EnvInt(log, envRetryCnt, defaultRetryCnt)),
		sleep: nccl.EnvDuration(log, envRetrySleep, defaultRetrySlp, time.Millisecond)}
	if r.cnt < 0 {
		r.cnt = 0
	}
	if r.sleep < 0 {
		r.sleep = 0
	}
	return r
}

// helperCount is NCCL_GO_SOCKET_HELPERS: goroutines per connection end that
// move striped chunks beside NCCL's thread (which moves them too: it never
// waits for a helper). Auto (unset or -2) is one per stream, at most
// defaultHelpers, on hosts with minCPUsForHelpers CPUs or more; none below,
// where every extra runnable thread takes a core from NCCL's.
func helperCount(log nccl.Logger, streams int) int {
	n := nccl.EnvInt(log, envHelpers, -2)
	if n == -2 {
		n = autoHelpers(runtime.NumCPU())
	}
	if n < 0 {
		log.Warnf("NET/GoSocket : ignoring %s=%d: must be >= 0 (or -2 for auto); using %d", envHelpers, n, autoHelpers(runtime.NumCPU()))
		n = autoHelpers(runtime.NumCPU())
	}
	return min(int(n), streams)
}

func autoHelpers(ncpu int) int64 {
	if ncpu < minCPUsForHelpers {
		return 0
	}
	return defaultHelpers
}

const (
	defaultHelpers    = 4
	minCPUsForHelpers = 8
)

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
	p.pingAfter = int64(timeout / 2)
	// Dead one check period before the timeout, so that the error comes
	// within it; never before a ping had its grace.
	p.deadAfter = max(p.timeout-p.period, p.pingAfter+p.grace)
	// The kernel probes an idle liveness stream every quarter timeout: a
	// live peer's answers keep the last ACK younger than pingAfter, so for
	// timeouts of 4 s and more no ping is ever written.
	p.keepIdle = int(min(max(timeout/4, time.Second), 32767*time.Second) / time.Second)
	p.keepCnt = 8
	return p
}

// setupBound is how long connection set-up may wait for a peer: connect,
// and a listener's half-open connections. NCCL_GO_TIMEOUT; when that is off
// (<= 0, which only disables dead-peer detection), its default, so that no
// set-up waits forever.
func setupBound(timeout time.Duration) time.Duration {
	if timeout > 0 {
		return timeout
	}
	return nccl.DefaultTimeout
}
