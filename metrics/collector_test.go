package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/internal/clock"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// testRegistry exposes only the given devices, so expectations are exact.
func testRegistry(t *testing.T, info Info, rank int, devs ...*Device) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(newCollector(info, rank, func() []*Device { return devs })))
	return reg
}

func TestEveryMetricAfterKnownTraffic(t *testing.T) {
	d := newTestDevice(t, "ib", 1)
	reg := testRegistry(t, Info{PluginVersion: "1.2.3", APIVersion: "v10", Transport: "ib"}, 3, d)

	// 3 sends of 1 MiB + 7 bytes, 2 receives of 4096 bytes, one failed send, one
	// send still pending; one send comm and two recv comms, one of them closed.
	for i := 0; i < 4; i++ {
		d.RequestPosted(Send)
	}
	for i := 0; i < 3; i++ {
		d.RequestDone(Send, 1<<20+7, clock.Now())
	}
	d.RequestFailed(Send, KindOf(nccl.RemoteError))
	d.RequestPosted(Send)
	for i := 0; i < 2; i++ {
		d.RequestPosted(Recv)
		d.RequestDone(Recv, 4096, clock.Now())
	}
	d.RequestPosted(Recv)
	d.RequestAbandoned(Recv)
	d.CallFailed(Recv, KindOf(nccl.SystemError))
	d.CallFailed(Recv, KindOf(nccl.SystemError))
	d.CallFailed(Send, KindOf(nccl.Timeout))
	d.ConnOpened(Send)
	d.ConnOpened(Recv)
	d.ConnOpened(Recv)
	d.ConnClosed(Recv)
	d.Flushed()
	d.Flushed()
	d.Stalled(Recv)
	d.MRHits.Add(5)
	d.MRMisses.Add(2)
	d.MRRegistered.Add(3 << 20)

	mfs := gather(t, reg)
	lbl := func(dir string) []string {
		return []string{"transport", "ib", "device", d.Name, "port", "1", "local_rank", "3", "direction", dir}
	}
	dev := []string{"transport", "ib", "device", d.Name, "port", "1", "local_rank", "3"}

	assert.Equal(t, float64(3*(1<<20+7)), value(t, mfs, "ncclnet_bytes_total", lbl("send")...))
	assert.Equal(t, float64(2*4096), value(t, mfs, "ncclnet_bytes_total", lbl("recv")...))
	assert.Equal(t, 3.0, value(t, mfs, "ncclnet_messages_total", lbl("send")...))
	assert.Equal(t, 2.0, value(t, mfs, "ncclnet_messages_total", lbl("recv")...))
	assert.Equal(t, 1.0, value(t, mfs, "ncclnet_requests_in_flight", lbl("send")...))
	assert.Equal(t, 0.0, value(t, mfs, "ncclnet_requests_in_flight", lbl("recv")...))
	assert.Equal(t, 1.0, value(t, mfs, "ncclnet_connections_open", lbl("send")...))
	assert.Equal(t, 1.0, value(t, mfs, "ncclnet_connections_open", lbl("recv")...))
	assert.Equal(t, 1.0, value(t, mfs, "ncclnet_connections_opened_total", lbl("send")...))
	assert.Equal(t, 2.0, value(t, mfs, "ncclnet_connections_opened_total", lbl("recv")...))
	assert.Equal(t, 0.0, value(t, mfs, "ncclnet_connections_closed_total", lbl("send")...))
	assert.Equal(t, 1.0, value(t, mfs, "ncclnet_connections_closed_total", lbl("recv")...))
	assert.Equal(t, 1.0, value(t, mfs, "ncclnet_errors_total", append(lbl("send"), "kind", "remote")...))
	assert.Equal(t, 1.0, value(t, mfs, "ncclnet_errors_total", append(lbl("send"), "kind", "timeout")...))
	assert.Equal(t, 2.0, value(t, mfs, "ncclnet_errors_total", append(lbl("recv"), "kind", "system")...))
	assert.Equal(t, 0.0, value(t, mfs, "ncclnet_errors_total", append(lbl("recv"), "kind", "remote")...))
	assert.Equal(t, 0.0, value(t, mfs, "ncclnet_stalled_requests_total", lbl("send")...))
	assert.Equal(t, 1.0, value(t, mfs, "ncclnet_stalled_requests_total", lbl("recv")...))
	assert.Equal(t, 2.0, value(t, mfs, "ncclnet_flushes_total", dev...))
	assert.Equal(t, 5.0, value(t, mfs, "ncclnet_mr_cache_hits_total", dev...))
	assert.Equal(t, 2.0, value(t, mfs, "ncclnet_mr_cache_misses_total", dev...))
	assert.Equal(t, float64(3<<20), value(t, mfs, "ncclnet_mr_registered_bytes", dev...))
	assert.EqualValues(t, 3, sample(t, mfs, "ncclnet_request_duration_seconds", lbl("send")...).GetHistogram().GetSampleCount())
	assert.EqualValues(t, 2, sample(t, mfs, "ncclnet_request_duration_seconds", lbl("recv")...).GetHistogram().GetSampleCount())

	info := sample(t, mfs, "ncclnet_info", "version", "1.2.3", "nccl_net_api", "v10", "transport", "ib", "local_rank", "3")
	assert.Equal(t, 1.0, info.GetGauge().GetValue())
	assert.Contains(t, info.String(), "go1.")

	// Every family is present exactly once per device and direction.
	count, err := testutil.GatherAndCount(reg)
	require.NoError(t, err)
	assert.Equal(t, 1+2*(7+int(numErrKinds)+1)+4, count)

	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	require.NoError(t, err)
	assert.Empty(t, problems, "metric names and help must follow Prometheus conventions")
}

func TestLatencyHistogramBuckets(t *testing.T) {
	d := newTestDevice(t, "socket", 0)
	h := &d.dir[Send].latency
	// Bucket bounds are inclusive (le), so exactly 1 µs lands in the first.
	for _, ns := range []int64{1, 1000, 1001, 2_000_000, 10_000_000_000, 10_000_000_001, 60_000_000_000} {
		h.observe(ns)
	}
	reg := testRegistry(t, Info{}, 0, d)
	want := `
# HELP ncclnet_request_duration_seconds Time from posting a request (isend/irecv) to test reporting it done, including time waiting for the peer.
# TYPE ncclnet_request_duration_seconds histogram
ncclnet_request_duration_seconds_bucket{device="DEV",direction="send",local_rank="0",port="0",transport="socket",le="1e-06"} 2
ncclnet_request_duration_seconds_bucket{device="DEV",direction="send",local_rank="0",port="0",transport="socket",le="2.5e-06"} 3
ncclnet_request_duration_seconds_bucket{device="DEV",direction="send",local_rank="0",port="0",transport="socket",le="5e-06"} 3
ncclnet_request_duration_seconds_bucket{device="DEV",direction="send",local_rank="0",port="0",transport="socket",le="1e-05"} 3
ncclnet_request_duration_seconds_bucket{device="DEV",direction="send",local_rank="0",port="0",transport="socket",le="2.5e-05"} 3
ncclnet_request_duration_seconds_bucket{device="DEV",direction="send",local_rank="0",port="0",transport="socket",le="5e-05"} 3
ncclnet_request_duration_seconds_bucket{device="DEV",direction="send",local_rank="0",port="0",transport="socket",le="0.0001"} 3
ncclnet_request_duration_seconds_bucket{device="DEV",direction="send",local_rank="0",port="0",transport="socket",le="0.00025"} 3
ncclnet_request_duration_seconds_bucket{device="DEV",direction="send",local_rank="0",port="0",transport="socket",le="0.0005"} 3
ncclnet_request_duration_seconds_bucket{device="DEV",direction="send",local_rank="0",port="0",transport="socket",le="0.001"} 3
ncclnet_request_duration_seconds_bucket{device="DEV",direction="send",local_rank="0",port="0",transport="socket",le="0.0025"} 4
ncclnet_request_duration_seconds_bucket{device="DEV",direction="send",local_rank="0",port="0",transport="socket",le="0.005"} 4
ncclnet_request_duration_seconds_bucket{device="DEV",direction="send",local_rank="0",port="0",transport="socket",le="0.01"} 4
ncclnet_request_duration_seconds_bucket{device="DEV",direction="send",local_rank="0",port="0",transport="socket",le="0.025"} 4
ncclnet_request_duration_seconds_bucket{device="DEV",direction="send",local_rank="0",port="0",transport="socket",le="0.05"} 4
ncclnet_request_duration_seconds_bucket{device="DEV",direction="send",local_rank="0",port="0",transport="socket",le="0.1"} 4
ncclnet_request_duration_seconds_bucket{device="DEV",direction="send",local_rank="0",port="0",transport="socket",le="0.25"} 4
ncclnet_request_duration_seconds_bucket{device="DEV",direction="send",local_rank="0",port="0",transport="socket",le="0.5"} 4
ncclnet_request_duration_seconds_bucket{device="DEV",direction="send",local_rank="0",port="0",transport="socket",le="1"} 4
ncclnet_request_duration_seconds_bucket{device="DEV",direction="send",local_rank="0",port="0",transport="socket",le="2.5"} 4
ncclnet_request_duration_seconds_bucket{device="DEV",direction="send",local_rank="0",port="0",transport="socket",le="5"} 4
ncclnet_request_duration_seconds_bucket{device="DEV",direction="send",local_rank="0",port="0",transport="socket",le="10"} 5
ncclnet_request_duration_seconds_bucket{device="DEV",direction="send",local_rank="0",port="0",transport="socket",le="+Inf"} 7
ncclnet_request_duration_seconds_sum{device="DEV",direction="send",local_rank="0",port="0",transport="socket"} 80.002002003
ncclnet_request_duration_seconds_count{device="DEV",direction="send",local_rank="0",port="0",transport="socket"} 7
`
	want = strings.ReplaceAll(want, "DEV", d.Name)
	// Only the send series: the recv histogram of the same family is empty.
	mfs := gather(t, reg)
	m := sample(t, mfs, "ncclnet_request_duration_seconds", "direction", "recv")
	assert.Zero(t, m.GetHistogram().GetSampleCount())
	sendOnly := prometheus.GathererFunc(func() ([]*dtoFamily, error) {
		return filterDirection(mfs, "ncclnet_request_duration_seconds", "send"), nil
	})
	require.NoError(t, testutil.GatherAndCompare(sendOnly, strings.NewReader(want), "ncclnet_request_duration_seconds"))
}

func TestRequestDoneWithoutStartTimeSkipsHistogram(t *testing.T) {
	d := newTestDevice(t, "socket", 0)
	d.RequestPosted(Recv)
	d.RequestDone(Recv, 10, 0)
	s := d.Snapshot()
	assert.EqualValues(t, 10, s.Bytes[Recv])
	assert.EqualValues(t, 1, s.Msgs[Recv])
	var n uint64
	for _, c := range s.LatencyCounts[Recv] {
		n += c
	}
	assert.Zero(t, n)
}

func TestCountingIsAllocationFree(t *testing.T) {
	d := newTestDevice(t, "ib", 1)
	start := clock.Now()
	allocs := testing.AllocsPerRun(1000, func() {
		d.RequestPosted(Send)
		d.RequestDone(Send, 4096, start)
		d.RequestPosted(Recv)
		d.RequestFailed(Recv, ErrRemote)
		d.Flushed()
		d.Stalled(Send)
	})
	assert.Zero(t, allocs)
}

func TestConcurrentCountingIsExact(t *testing.T) {
	d := newTestDevice(t, "ib", 1)
	const workers, per = 4, 5000
	done := make(chan struct{})
	for w := 0; w < workers; w++ {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := 0; i < per; i++ {
				d.RequestPosted(Send)
				d.RequestDone(Send, 3, clock.Now())
			}
		}()
	}
	// Scrape while counting: the race detector checks the collector's reads.
	reg := testRegistry(t, Info{}, 0, d)
	for i := 0; i < 20; i++ {
		gather(t, reg)
	}
	for w := 0; w < workers; w++ {
		<-done
	}
	s := d.Snapshot()
	assert.EqualValues(t, workers*per*3, s.Bytes[Send])
	assert.EqualValues(t, workers*per, s.Msgs[Send])
	assert.Zero(t, s.Inflight[Send])
}

func TestKindOf(t *testing.T) {
	cases := map[nccl.Result]string{
		nccl.SystemError:     "system",
		nccl.RemoteError:     "remote",
		nccl.InvalidUsage:    "invalid_usage",
		nccl.InvalidArgument: "invalid_usage",
		nccl.InternalError:   "internal",
		nccl.Timeout:         "timeout",
		nccl.Success:         "other",
	}
	for r, want := range cases {
		assert.Equal(t, want, KindOf(r).String(), "%v", r)
	}
}

func TestSummary(t *testing.T) {
	d := newTestDevice(t, "ib", 2)
	d.RequestPosted(Send)
	d.RequestDone(Send, 3_500_000_000, clock.Now())
	d.RequestPosted(Recv)
	d.RequestDone(Recv, 999, clock.Now())
	d.CallFailed(Send, ErrSystem)
	d.Stalled(Recv)
	var line string
	for _, l := range Summary() {
		if strings.Contains(l, d.Name+" ") {
			line = l
		}
	}
	require.NotEmpty(t, line, "Summary must have a line per device")
	assert.Equal(t, "device "+d.Name+" port 2 (ib): sent 3.50 GB (3500000000 bytes) in 1 messages, received 999 B in 1 messages, 1 errors, 1 stalled requests", line)
}
