package metrics

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// Info describes the loaded plugin for the ncclnet_info metric.
type Info struct {
	PluginVersion string // libnccl-net-go version
	APIVersion    string // NCCL net API version NCCL asked for, e.g. "v10"
	Transport     string // transport chosen at init, e.g. "ib" or "socket"
}

const namespace = "ncclnet"

// Per-device label names. Kept small and stable: a device is (transport, name,
// port); direction and error kind are bounded enums. local_rank is a constant
// label so that eight processes sharing a node, and so possibly a device, never
// produce identical series (node_exporter's textfile collector rejects those).
var deviceLabels = []string{"transport", "device", "port"}

// collector turns the per-device atomic counters into Prometheus metrics at
// scrape time, so counting itself never touches client_golang.
type collector struct {
	info Info

	infoDesc      *prometheus.Desc
	bytes         *prometheus.Desc
	msgs          *prometheus.Desc
	inflight      *prometheus.Desc
	connsOpen     *prometheus.Desc
	connsOpened   *prometheus.Desc
	connsClosed   *prometheus.Desc
	errors        *prometheus.Desc
	latency       *prometheus.Desc
	stalls        *prometheus.Desc
	flushes       *prometheus.Desc
	mrHits        *prometheus.Desc
	mrMisses      *prometheus.Desc
	mrRegistered  *prometheus.Desc
	devices       func() []*Device
	latencyBounds []float64
}

func newCollector(info Info, localRank int, devices func() []*Device) *collector {
	constLabels := prometheus.Labels{"local_rank": strconv.Itoa(localRank)}
	dirLabels := append(append([]string(nil), deviceLabels...), "direction")
	errLabels := append(append([]string(nil), dirLabels...), "kind")
	desc := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "", name), help, labels, constLabels)
	}
	return &collector{
		info: info,
		infoDesc: desc("info", "libnccl-net-go build and runtime information; the value is always 1.",
			[]string{"version", "nccl_net_api", "go_version", "transport"}),
		bytes: desc("bytes_total",
			"Payload bytes of completed requests (for a receive, the size the sender sent).", dirLabels),
		msgs: desc("messages_total",
			"Completed requests (a grouped receive counts once).", dirLabels),
		inflight: desc("requests_in_flight",
			"Requests posted by NCCL and not yet reported complete.", dirLabels),
		connsOpen: desc("connections_open",
			"Connections currently open (send comms for direction=send, recv comms for recv).", dirLabels),
		connsOpened: desc("connections_opened_total",
			"Connections established (connect for send, accept for recv).", dirLabels),
		connsClosed: desc("connections_closed_total",
			"Connections closed by NCCL.", dirLabels),
		errors: desc("errors_total",
			"Failed requests and failed calls, by the kind of NCCL error returned.", errLabels),
		latency: desc("request_duration_seconds",
			"Time from posting a request (isend/irecv) to test reporting it done, including time waiting for the peer.", dirLabels),
		stalls: desc("stalled_requests_total",
			"Requests that stayed pending longer than NCCL_GO_STALL_WARN, and (direction=send) runs of isend calls the transport refused that long; each counted once.", dirLabels),
		flushes: desc("flushes_total",
			"GPU-direct flushes (iflush) issued.", deviceLabels),
		mrHits: desc("mr_cache_hits_total",
			"Memory registrations served from the transport's registration cache.", deviceLabels),
		mrMisses: desc("mr_cache_misses_total",
			"Memory registrations that had to register memory with the device.", deviceLabels),
		mrRegistered: desc("mr_registered_bytes",
			"Bytes of memory currently registered with the device.", deviceLabels),
		devices:       devices,
		latencyBounds: LatencyBuckets[:],
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.infoDesc, c.bytes, c.msgs, c.inflight, c.connsOpen,
		c.connsOpened, c.connsClosed, c.errors, c.latency, c.stalls, c.flushes, c.mrHits,
		c.mrMisses, c.mrRegistered} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	// New*, not MustNew*: an invalid value must cost its series (a gather
	// error, which promhttp and the textfile writer report), never a panic.
	// Ours would not even be recovered: WrapRegistererWith (nccl_job, and the
	// textfile's process label) runs Collect in a goroutine of its own, so a
	// scrape would kill the NCCL application.
	send := func(m prometheus.Metric, err error, desc *prometheus.Desc) {
		if err != nil {
			m = prometheus.NewInvalidMetric(desc, err)
		}
		ch <- m
	}
	m, err := prometheus.NewConstMetric(c.infoDesc, prometheus.GaugeValue, 1,
		labelValue(c.info.PluginVersion), labelValue(c.info.APIVersion), runtime.Version(), labelValue(c.info.Transport))
	send(m, err, c.infoDesc)
	for _, d := range c.devices() {
		s := d.Snapshot()
		port := strconv.Itoa(s.Port)
		transport, name := labelValue(s.Transport), labelValue(s.Name)
		counter := func(desc *prometheus.Desc, v uint64, extra ...string) {
			m, err := prometheus.NewConstMetric(desc, prometheus.CounterValue, float64(v),
				append([]string{transport, name, port}, extra...)...)
			send(m, err, desc)
		}
		gauge := func(desc *prometheus.Desc, v int64, extra ...string) {
			m, err := prometheus.NewConstMetric(desc, prometheus.GaugeValue, float64(v),
				append([]string{transport, name, port}, extra...)...)
			send(m, err, desc)
		}
		for dir := Dir(0); dir < numDirs; dir++ {
			ds := dir.String()
			counter(c.bytes, s.Bytes[dir], ds)
			counter(c.msgs, s.Msgs[dir], ds)
			gauge(c.inflight, s.Inflight[dir], ds)
			gauge(c.connsOpen, s.ConnsOpen[dir], ds)
			counter(c.connsOpened, s.ConnsOpened[dir], ds)
			counter(c.connsClosed, s.ConnsClosed[dir], ds)
			counter(c.stalls, s.Stalls[dir], ds)
			for k := ErrKind(0); k < numErrKinds; k++ {
				counter(c.errors, s.Errors[dir][k], ds, k.String())
			}
			// The histogram's count is the sum of its buckets rather than
			// s.Msgs: requests completed without a post time are not observed,
			// and the exposition must stay self-consistent.
			buckets := make(map[float64]uint64, len(c.latencyBounds))
			var cum uint64
			for i, ub := range c.latencyBounds {
				cum += s.LatencyCounts[dir][i]
				buckets[ub] = cum
			}
			cum += s.LatencyCounts[dir][len(c.latencyBounds)]
			m, err := prometheus.NewConstHistogram(c.latency, cum, s.LatencySumSec[dir], buckets,
				transport, name, port, ds)
			send(m, err, c.latency)
		}
		counter(c.flushes, s.Flushes)
		counter(c.mrHits, s.MRHits)
		counter(c.mrMisses, s.MRMisses)
		gauge(c.mrRegistered, s.MRRegistered)
	}
}

// labelValue makes a name usable as a label value: Prometheus requires UTF-8,
// and an interface name (any byte but '/', ':' and white space) or a vendor's
// device or transport name need not be. Valid names are kept as they are;
// each byte of an invalid sequence becomes \xNN, so distinct names stay
// distinct series.
func labelValue(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		if r == utf8.RuneError && n <= 1 {
			fmt.Fprintf(&b, `\x%02x`, s[0])
			n = 1
		} else {
			b.WriteString(s[:n])
		}
		s = s[n:]
	}
	return b.String()
}

// newRegistry returns a registry holding only the plugin's collector: the
// plugin lives inside the application's process, and the global default
// registry (which the application may use itself) must not be touched.
func newRegistry(info Info, localRank int, labels prometheus.Labels) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	prometheus.WrapRegistererWith(labels, reg).MustRegister(newCollector(info, localRank, Devices))
	return reg
}

// jobLabels is the nccl_job label for a job ("" is none: the label is left
// out rather than set empty, which Prometheus reads as absent anyway).
func jobLabels(job string) prometheus.Labels {
	if job == "" {
		return prometheus.Labels{}
	}
	return prometheus.Labels{"nccl_job": job}
}
