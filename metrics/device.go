package metrics

import (
	"sync"
	"sync/atomic"

	"github.com/libnccl-net-go/libnccl-net-go/internal/clock"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Dir is the direction of a request or connection.
type Dir uint8

const (
	Send Dir = iota
	Recv
	numDirs
)

func (d Dir) String() string {
	if d == Send {
		return "send"
	}
	return "recv"
}

// ErrKind classifies failed requests and calls; it is the "kind" label.
type ErrKind uint8

const (
	ErrSystem       ErrKind = iota // ncclSystemError: network/OS failure, dead peer
	ErrRemote                      // ncclRemoteError: completion error from the fabric
	ErrInvalidUsage                // truncation and other misuse
	ErrInternal                    // plugin bug or NCCL misuse
	ErrTimeout                     // no progress for NCCL_GO_TIMEOUT
	ErrOther
	numErrKinds
)

var errKindNames = [numErrKinds]string{"system", "remote", "invalid_usage", "internal", "timeout", "other"}

func (k ErrKind) String() string { return errKindNames[k] }

// KindOf maps an ncclResult_t to its error kind.
func KindOf(r nccl.Result) ErrKind {
	switch r {
	case nccl.SystemError:
		return ErrSystem
	case nccl.RemoteError:
		return ErrRemote
	case nccl.InvalidUsage, nccl.InvalidArgument:
		return ErrInvalidUsage
	case nccl.InternalError:
		return ErrInternal
	case nccl.Timeout:
		return ErrTimeout
	}
	return ErrOther
}

// LatencyBuckets are the upper bounds, in seconds, of the completion-latency
// histogram: from 1 µs (small messages on a fast fabric) to 10 s (stalls).
// The counters are fixed-size arrays, so this is an array, not a slice.
var LatencyBuckets = [...]float64{
	1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4,
	1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
}

var latencyBoundsNs = func() (b [len(LatencyBuckets)]int64) {
	for i, s := range LatencyBuckets {
		b[i] = int64(s * 1e9)
	}
	return
}()

// histogram is a lock-free fixed-bucket histogram; counts[len(bounds)] is +Inf.
type histogram struct {
	counts [len(LatencyBuckets) + 1]atomic.Uint64
	sumNs  atomic.Int64
}

// observe is on the hot path: an open-coded binary search (sort.Search would
// cost an indirect call per probe) and two atomic adds.
func (h *histogram) observe(ns int64) {
	lo, hi := 0, len(latencyBoundsNs)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if latencyBoundsNs[m] < ns {
			lo = m + 1
		} else {
			hi = m
		}
	}
	h.counts[lo].Add(1)
	h.sumNs.Add(ns)
}

// dirCounters are one direction's counters. Send and receive are usually
// progressed by different threads, so each direction gets its own cache lines.
type dirCounters struct {
	bytes       atomic.Uint64
	msgs        atomic.Uint64
	inflight    atomic.Int64
	connsOpen   atomic.Int64
	connsOpened atomic.Uint64
	connsClosed atomic.Uint64
	stalls      atomic.Uint64
	errors      [numErrKinds]atomic.Uint64
	latency     histogram
	_           [64]byte
}

// Device holds one device's counters. Every method is a handful of atomic adds:
// the plugin calls them on NCCL's progress thread for every message, so they
// must never lock, allocate or look anything up.
type Device struct {
	Transport string
	Name      string
	Port      int

	dir     [numDirs]dirCounters
	flushes atomic.Uint64

	// Memory registration cache (transports with a cache report here).
	MRHits       atomic.Uint64
	MRMisses     atomic.Uint64
	MRRegistered atomic.Int64 // bytes currently registered
}

// RequestPosted counts a request handed to the transport.
func (d *Device) RequestPosted(dir Dir) { d.dir[dir].inflight.Add(1) }

// RequestDone counts a completed request of bytes bytes that was posted at
// startNs (an internal/clock.Now reading). startNs 0 means the
// post time is unknown and the request stays out of the latency histogram.
func (d *Device) RequestDone(dir Dir, bytes int, startNs int64) {
	c := &d.dir[dir]
	c.inflight.Add(-1)
	c.bytes.Add(uint64(bytes))
	c.msgs.Add(1)
	if startNs != 0 {
		c.latency.observe(clock.Now() - startNs)
	}
}

// RequestFailed counts a request that completed with an error.
func (d *Device) RequestFailed(dir Dir, kind ErrKind) {
	c := &d.dir[dir]
	c.inflight.Add(-1)
	c.errors[kind].Add(1)
}

// RequestAbandoned drops a request that will never be tested (its comm closed)
// or that moved no bytes (a flush).
func (d *Device) RequestAbandoned(dir Dir) { d.dir[dir].inflight.Add(-1) }

// CallFailed counts an error returned by a call that created no request
// (connect, accept, isend/irecv refusing input, ...).
func (d *Device) CallFailed(dir Dir, kind ErrKind) { d.dir[dir].errors[kind].Add(1) }

// ConnOpened / ConnClosed track connections (send comms and recv comms).
func (d *Device) ConnOpened(dir Dir) {
	d.dir[dir].connsOpen.Add(1)
	d.dir[dir].connsOpened.Add(1)
}

func (d *Device) ConnClosed(dir Dir) {
	d.dir[dir].connsOpen.Add(-1)
	d.dir[dir].connsClosed.Add(1)
}

// Flushed counts a GPU-direct flush.
func (d *Device) Flushed() { d.flushes.Add(1) }

// Stalled counts a request reported as stalled (once per request).
func (d *Device) Stalled(dir Dir) { d.dir[dir].stalls.Add(1) }

// Snapshot is a consistent-enough copy of a device's counters for exposition
// and logs (each counter is read atomically; the set is not a transaction).
type Snapshot struct {
	Transport, Name  string
	Port             int
	Bytes, Msgs      [2]uint64
	Inflight         [2]int64
	ConnsOpen        [2]int64
	ConnsOpened      [2]uint64
	ConnsClosed      [2]uint64
	Errors           [2][numErrKinds]uint64
	LatencyCounts    [2][]uint64 // per bucket (non-cumulative), last is +Inf
	LatencySumSec    [2]float64
	Flushes          uint64
	Stalls           [2]uint64
	MRHits, MRMisses uint64
	MRRegistered     int64
}

// Snapshot reads the counters.
func (d *Device) Snapshot() Snapshot {
	s := Snapshot{Transport: d.Transport, Name: d.Name, Port: d.Port}
	for dir := 0; dir < int(numDirs); dir++ {
		c := &d.dir[dir]
		s.Bytes[dir] = c.bytes.Load()
		s.Msgs[dir] = c.msgs.Load()
		s.Inflight[dir] = c.inflight.Load()
		s.ConnsOpen[dir] = c.connsOpen.Load()
		s.ConnsOpened[dir] = c.connsOpened.Load()
		s.ConnsClosed[dir] = c.connsClosed.Load()
		for k := range s.Errors[dir] {
			s.Errors[dir][k] = c.errors[k].Load()
		}
		s.LatencyCounts[dir] = make([]uint64, len(c.latency.counts))
		for i := range c.latency.counts {
			s.LatencyCounts[dir][i] = c.latency.counts[i].Load()
		}
		s.LatencySumSec[dir] = float64(c.latency.sumNs.Load()) / 1e9
		s.Stalls[dir] = c.stalls.Load()
	}
	s.Flushes = d.flushes.Load()
	s.MRHits, s.MRMisses, s.MRRegistered = d.MRHits.Load(), d.MRMisses.Load(), d.MRRegistered.Load()
	return s
}

var devices struct {
	sync.Mutex
	list []*Device
}

// ForDevice returns the counters of (transport, name, port), creating them on
// first use. The pointer is stable for the life of the process, so callers look
// it up once (at connect/accept) and keep it.
func ForDevice(transport, name string, port int) *Device {
	devices.Lock()
	defer devices.Unlock()
	for _, d := range devices.list {
		if d.Transport == transport && d.Name == name && d.Port == port {
			return d
		}
	}
	d := &Device{Transport: transport, Name: name, Port: port}
	devices.list = append(devices.list, d)
	return d
}

// Devices lists every device that has counters, in creation order.
func Devices() []*Device {
	devices.Lock()
	defer devices.Unlock()
	return append([]*Device(nil), devices.list...)
}
