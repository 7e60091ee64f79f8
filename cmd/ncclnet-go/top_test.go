package main

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestExpandAddr(t *testing.T) {
	for in, want := range map[string][]string{
		"9400":                   {"http://127.0.0.1:9400/metrics"},
		":9400":                  {"http://127.0.0.1:9400/metrics"},
		"node1:9400-9402":        {"http://node1:9400/metrics", "http://node1:9401/metrics", "http://node1:9402/metrics"},
		"[::1]:9400":             {"http://[::1]:9400/metrics"},
		"http://x:1/custom/path": {"http://x:1/custom/path"},
		// The plugin serves /metrics only (until 2026-11-28 a URL without
		// a path was scraped as given, and answered 404).
		"http://x:1":   {"http://x:1/metrics"},
		"https://x:1/": {"https://x:1/metrics"},
	} {
		got, err := expandAddr(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, in := range []string{"node1", "node1:0", "node1:9402-9400", "node1:1-1000", "x:70000"} {
		_, err := expandAddr(in)
		assert.Error(t, err, in)
	}
}

// exposition is what a rank's /metrics serves after n scrapes: the sender
// moved 1 GB per scrape, one error and one stall appear on the second.
func exposition(rank string, n int64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# TYPE ncclnet_info gauge\nncclnet_info{go_version=\"go1.26\",local_rank=%q,nccl_net_api=\"v12\",transport=\"ib\",version=\"0.1.0\"} 1\n", rank)
	lbl := func(dir string) string {
		return fmt.Sprintf(`device="mlx5_0",direction=%q,local_rank=%q,port="1",transport="ib"`, dir, rank)
	}
	errs, stalls := int64(0), int64(0)
	if n >= 2 {
		errs, stalls = 1, 1
	}
	fmt.Fprintf(&b, "# TYPE ncclnet_bytes_total counter\nncclnet_bytes_total{%s} %d\nncclnet_bytes_total{%s} 0\n", lbl("send"), n*1e9, lbl("recv"))
	fmt.Fprintf(&b, "# TYPE ncclnet_messages_total counter\nncclnet_messages_total{%s} %d\nncclnet_messages_total{%s} 0\n", lbl("send"), n*1000, lbl("recv"))
	fmt.Fprintf(&b, "# TYPE ncclnet_requests_in_flight gauge\nncclnet_requests_in_flight{%s} 3\nncclnet_requests_in_flight{%s} 0\n", lbl("send"), lbl("recv"))
	fmt.Fprintf(&b, "# TYPE ncclnet_connections_open gauge\nncclnet_connections_open{%s} 2\nncclnet_connections_open{%s} 2\n", lbl("send"), lbl("recv"))
	fmt.Fprintf(&b, "# TYPE ncclnet_stalled_requests_total counter\nncclnet_stalled_requests_total{%s} %d\nncclnet_stalled_requests_total{%s} 0\n", lbl("send"), stalls, lbl("recv"))
	fmt.Fprintf(&b, "# TYPE ncclnet_errors_total counter\nncclnet_errors_total{%s,kind=\"remote\"} %d\n", lbl("send"), errs)
	fmt.Fprintf(&b, "# TYPE ncclnet_request_duration_seconds histogram\n")
	fmt.Fprintf(&b, "ncclnet_request_duration_seconds_bucket{%s,le=\"+Inf\"} %d\nncclnet_request_duration_seconds_sum{%s} %g\nncclnet_request_duration_seconds_count{%s} %d\n",
		lbl("send"), n*1000, lbl("send"), float64(n)*1000*250e-6, lbl("send"), n*1000)
	return b.String()
}

func TestTopOnce(t *testing.T) {
	testEnv(t, nil)
	var scrapes atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := scrapes.Add(1)
		fmt.Fprint(w, exposition("3", n))
	}))
	defer srv.Close()
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "up 1\n") }))
	defer other.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	out, errOut, code := runCmd(t, "top", "--once", "--interval", "200ms", host, strings.TrimPrefix(other.URL, "http://"), "127.0.0.1:1")
	require.Equal(t, 0, code, "%s%s", out, errOut)
	assert.NotContains(t, out, "\x1b[", "--once prints no terminal control codes")
	assert.Contains(t, out, "1 of 3 endpoint(s) up")
	lines := strings.Split(out, "\n")
	var row string
	for _, l := range lines {
		if strings.HasPrefix(l, host+" ") {
			row = l
		}
	}
	require.NotEmpty(t, row, out)
	f := strings.Fields(row)
	// ENDPOINT RANK DEVICE TRANSPORT SEND RECV MSG/s INFLIGHT CONNS LAT ERRORS [(+n)] STALLS [(+n)] SENT RECEIVED
	assert.Equal(t, []string{host, "3", "mlx5_0:1", "ib"}, f[:4])
	send, err := strconv.ParseFloat(f[4], 64)
	require.NoError(t, err)
	// 1 GB moved between the two scrapes, taken 200 ms apart (plus the
	// scrape itself): between 1 and 5 GB/s.
	assert.Greater(t, send, 1.0)
	assert.LessOrEqual(t, send, 5.0)
	assert.Equal(t, "0.000", f[5])
	assert.Equal(t, "3/0", f[7])
	assert.Equal(t, "2/2", f[8])
	assert.Equal(t, "250.0us", f[9], "mean latency of the requests completed between the scrapes")
	assert.Regexp(t, regexp.MustCompile(`  1 \(\+1\)  1 \(\+1\)  1\.9 GiB  0 B$`), row)
	assert.Regexp(t, `(?m)^`+regexp.QuoteMeta(strings.TrimPrefix(other.URL, "http://"))+` +- +- +- +answers, but exposes no ncclnet_info`, out)
	assert.Regexp(t, `(?m)^127\.0\.0\.1:1 +- +- +- +connection refused$`, out)

	_, errOut, code = runCmd(t, "top", "--once", "--interval", "100ms", "127.0.0.1:1")
	assert.Equal(t, 1, code, "no endpoint answered")
	assert.Contains(t, errOut, "no metrics endpoint answered")
}

func TestDeltaOfARestartedCounter(t *testing.T) {
	assert.Equal(t, 5.0, delta(15, 10))
	assert.Equal(t, 3.0, delta(3, 10), "a counter that went down was reset: all of it is new")
}

// A rank restarted between two scrapes: its new process completed 10
// requests of 0.5 s each (sum 5 s), the old one had 1000 requests summing
// 1 s. Only the count went down; the sum and the count are one histogram,
// so both restart together and AVG LAT is the new process's mean. The
// other direction restarted the other way round: its sum went down, its
// count did not.
func TestTopLatencyAfterARankRestart(t *testing.T) {
	k := devKey{"socket", "eth0", "0"}
	now := time.Now()
	prev := &scrape{target: "http://h:1/metrics", at: now.Add(-2 * time.Second), rank: "0",
		devs: map[devKey]*devStats{k: {latSum: [2]float64{1, 0}, latCount: [2]float64{1000, 0}}}}
	cur := &scrape{target: "http://h:1/metrics", at: now, rank: "0",
		devs: map[devKey]*devStats{k: {latSum: [2]float64{5, 0}, latCount: [2]float64{10, 0}}}}
	rows := (&scraper{}).rows([]*scrape{cur}, []*scrape{prev})
	require.Len(t, rows, 1)
	assert.Equal(t, 0.5, rows[0].latency, "count reset, sum grew: the new process's mean")

	prev.devs[k] = &devStats{latSum: [2]float64{0, 100}, latCount: [2]float64{0, 10}}
	cur.devs[k] = &devStats{latSum: [2]float64{0, 2}, latCount: [2]float64{0, 20}}
	rows = (&scraper{}).rows([]*scrape{cur}, []*scrape{prev})
	assert.Equal(t, 0.1, rows[0].latency, "sum reset, count grew: the new process's mean")

	// Without a restart the window is the difference.
	prev.devs[k] = &devStats{latSum: [2]float64{1, 0}, latCount: [2]float64{10, 0}}
	cur.devs[k] = &devStats{latSum: [2]float64{3, 0}, latCount: [2]float64{20, 0}}
	rows = (&scraper{}).rows([]*scrape{cur}, []*scrape{prev})
	assert.Equal(t, 0.2, rows[0].latency)
}

// Without ADDR, top scrapes where the ranks listen: at NCCL_GO_METRICS_BIND
// (not always loopback), and from a base port near 65535 as well (until
// 2026-11-28 it scraped 127.0.0.1 whatever the bind, and 9400 for a base
// above 65528).
func TestTopDefaultTargetFollowsBindAndHighPorts(t *testing.T) {
	serve := func(ln net.Listener) *httptest.Server {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, exposition("0", 1))
		}))
		srv.Listener.Close()
		srv.Listener = ln
		srv.Start()
		t.Cleanup(srv.Close)
		return srv
	}
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("cannot listen on 127.0.0.2 (%v): this host's loopback is not 127.0.0.0/8", err)
	}
	host := strings.TrimPrefix(serve(ln).URL, "http://")
	_, port, _ := strings.Cut(host, ":")
	testEnv(t, map[string]string{"NCCL_GO_METRICS_PORT": port, "NCCL_GO_METRICS_BIND": "127.0.0.2"})
	out, errOut, code := runCmd(t, "top", "--once", "--interval", "100ms", "--timeout", "500ms")
	require.Equal(t, 0, code, "%s%s", out, errOut)
	assert.Regexp(t, `(?m)^`+regexp.QuoteMeta(host)+` +0 +mlx5_0:1 +ib `, out, "the rank bound to NCCL_GO_METRICS_BIND")

	var high net.Listener
	for p := 65535; p > 65528 && high == nil; p-- {
		high, _ = net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
	}
	if high == nil {
		t.Skip("ports 65529-65535 are all taken on this host")
	}
	host = strings.TrimPrefix(serve(high).URL, "http://")
	_, port, _ = strings.Cut(host, ":")
	testEnv(t, map[string]string{"NCCL_GO_METRICS_PORT": port})
	out, errOut, code = runCmd(t, "top", "--once", "--interval", "100ms", "--timeout", "500ms")
	require.Equal(t, 0, code, "%s%s", out, errOut)
	assert.Regexp(t, `(?m)^`+regexp.QuoteMeta(host)+` +0 +mlx5_0:1 +ib `, out, "the rank at a base port above 65528")
	assert.NotContains(t, out, ":9400", "no silent fallback to the default base")
}

// Without ADDR, top scrapes the base port the plugin would use: the
// environment's NCCL_GO_METRICS_PORT, else the one in NCCL_CONF_FILE (or
// ~/.nccl.conf, /etc/nccl.conf), as NCCL hands it to the plugin.
func TestTopDefaultPortFromNCCLConf(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, exposition("0", 1))
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	_, port, _ := strings.Cut(host, ":")
	if p, _ := strconv.Atoi(port); p+7 > 65535 {
		t.Skipf("the test server got port %d: no room for the 7 ports after it", p)
	}
	conf := filepath.Join(t.TempDir(), "nccl.conf")
	require.NoError(t, os.WriteFile(conf, []byte("NCCL_GO_METRICS_PORT="+port+"\n"), 0o644))

	testEnv(t, map[string]string{"NCCL_CONF_FILE": conf})
	out, errOut, code := runCmd(t, "top", "--once", "--interval", "100ms", "--timeout", "500ms")
	require.Equal(t, 0, code, "%s%s", out, errOut)
	assert.Regexp(t, `(?m)^`+regexp.QuoteMeta(host)+` +0 +mlx5_0:1 +ib `, out, "the port nccl.conf sets")

	// The environment wins over the file, as in NCCL.
	testEnv(t, map[string]string{"NCCL_CONF_FILE": conf, "NCCL_GO_METRICS_PORT": "1"})
	out, errOut, code = runCmd(t, "top", "--once", "--interval", "100ms", "--timeout", "500ms")
	assert.Equal(t, 1, code, out)
	assert.Contains(t, errOut, "no metrics endpoint answered (127.0.0.1:1-8)")
	assert.NotContains(t, out, host)
}

// An invalid NCCL_GO_METRICS_PORT is said to be invalid, not replaced by the
// default ports (until 2026-11-28 top scraped 9400-9407 and asked whether
// NCCL_GO_METRICS_PORT was set). With ADDR, the variable does not matter.
func TestTopRefusesAnInvalidMetricsPort(t *testing.T) {
	for _, v := range []string{"abc", "0", "-5", "70000"} {
		testEnv(t, map[string]string{"NCCL_GO_METRICS_PORT": v})
		out, errOut, code := runCmd(t, "top", "--once", "--interval", "100ms", "--timeout", "200ms")
		assert.Equal(t, 2, code, "NCCL_GO_METRICS_PORT=%s: %s%s", v, out, errOut)
		assert.Empty(t, out, v)
		assert.Regexp(t, `^ncclnet-go top: NCCL_GO_METRICS_PORT=`+regexp.QuoteMeta(v)+` \(env\): .*; the plugin serves no metrics endpoint with it: fix it, or give ADDR \(see ncclnet-go top --help\)\n$`, errOut)
	}
	testEnv(t, map[string]string{"NCCL_GO_METRICS_PORT": "abc"})
	_, errOut, code := runCmd(t, "top", "--once", "--interval", "100ms", "127.0.0.1:1")
	assert.Equal(t, 1, code, errOut)
	assert.Contains(t, errOut, "no metrics endpoint answered (127.0.0.1:1)")
}

// An endpoint named twice is scraped and counted once (until 2026-11-28
// "top 19500 19500" listed it twice and doubled the totals).
func TestTopScrapesEachEndpointOnce(t *testing.T) {
	testEnv(t, nil)
	var scrapes atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, exposition("0", scrapes.Add(1)))
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	_, port, _ := strings.Cut(host, ":")
	out, errOut, code := runCmd(t, "top", "--once", "--interval", "200ms", host, host, "127.0.0.1:"+port, srv.URL)
	require.Equal(t, 0, code, "%s%s", out, errOut)
	assert.Contains(t, out, "1 of 1 endpoint(s) up")
	assert.Equal(t, 1, strings.Count(out, "\n"+host+" "), out)
	assert.Equal(t, int64(2), scrapes.Load(), "one scrape per round")
}

// Rows of endpoints that are down line up with the header, also when no
// endpoint is up (until 2026-11-28 the header's columns were as wide as
// their titles only).
func TestTopDownRowsLineUpWithTheHeader(t *testing.T) {
	testEnv(t, nil)
	out, _, code := runCmd(t, "top", "--once", "--interval", "100ms", "127.0.0.1:1", "127.0.0.1:2")
	assert.Equal(t, 1, code)
	var hdr, row string
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(l, "ENDPOINT "):
			hdr = l
		case strings.HasPrefix(l, "127.0.0.1:1 "):
			row = l
		}
	}
	require.NotEmpty(t, hdr, out)
	require.NotEmpty(t, row, out)
	assert.Equal(t, strings.Index(hdr, "RANK"), strings.Index(row, " -")+1, out)
	assert.Equal(t, strings.Index(hdr, "TRANSPORT"), strings.LastIndex(row, " -")+1, out)
	assert.Equal(t, strings.Index(hdr, "SEND GB/s"), strings.Index(row, "connection refused"), out)
}

// An endpoint that sends its headers and then too little of the body before
// --timeout is listed as timed out, like one that never answers: until
// 2026-11-29 it was "not a Prometheus text exposition: context deadline
// exceeded", which sends the operator after the wrong problem.
func TestTopSlowBodyIsTimedOut(t *testing.T) {
	testEnv(t, nil)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "# HELP ncclnet_info libnccl-net-go\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	out, _, code := runCmd(t, "top", "--once", "--interval", "100ms", "--timeout", "300ms", srv.URL)
	assert.Equal(t, 1, code, out)
	assert.Regexp(t, `\n127\.0\.0\.1:\d+ +- +- +- +timed out\n`, out)
}

// Label values and error texts come from whatever answers on a metrics port:
// a control character or a byte that is not UTF-8 in one was written to the
// operator's terminal as it came (an escape sequence could clear or redraw
// it, a newline broke the table). Each is shown as \xNN.
func TestTopShowsControlBytesEscaped(t *testing.T) {
	var b strings.Builder
	render(&b, []row{
		{target: "h:1", rank: "0", device: "eth\x1b[2J0", transport: "socket\nX", latency: math.NaN()},
		{target: "h:2", down: "bad \xff answer"},
	}, 2, time.Second, false)
	out := b.String()
	assert.NotContains(t, out, "\x1b", out)
	assert.Contains(t, out, `eth\x1b[2J0`, out)
	assert.Contains(t, out, `socket\x0aX`, out)
	assert.Contains(t, out, `bad \xff answer`, out)
	assert.Equal(t, 4, strings.Count(strings.TrimRight(out, "\n"), "\n"), "header, blank line, columns, two rows:\n%s", out)
	assert.Equal(t, "mlx5_0 ünï", printable("mlx5_0 ünï"), "printable text is left alone")
}

// A top --once stopped by a signal before its second scrape printed no
// table: until 2026-11-29 it still exited 0, which a script reads as a
// table of idle ranks.
func TestTopOnceInterruptedIsNotSuccess(t *testing.T) {
	testEnv(t, nil)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	stop := make(chan struct{})
	close(stop)
	var o, e bytes.Buffer
	code := run([]string{"top", "--once", "--interval", "10s", srv.URL},
		&cli{stdout: &o, stderr: &e, interrupt: stop, signal: func() os.Signal { return syscall.SIGTERM }})
	assert.Equal(t, 128+int(syscall.SIGTERM), code)
	assert.Empty(t, o.String(), "no table")
	assert.Contains(t, e.String(), "interrupted by SIGTERM before --once's second scrape")
}
