package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/metrics"
)

// envMetricsPort is the metrics exporter's base port variable.
const envMetricsPort = "NCCL_GO_METRICS_PORT"

func runTop(c *cli, args []string) error {
	fs := newFlags(c, "top", "[ADDR...] [--interval DURATION] [--timeout DURATION] [--once]", `
Scrapes the /metrics endpoints of running ranks (NCCL_GO_METRICS_PORT) and
shows, per rank and device: send and receive throughput, messages per
second, requests in flight, open connections, mean completion latency,
errors and stalled requests, refreshed every --interval until Ctrl-C.

ADDR is host:port, a port on this host, a range host:9400-9407 (a node's
ranks), or a URL. Without ADDR: this host's NCCL_GO_METRICS_PORT (default
9400; read as the plugin reads it inside NCCL: the environment, then
NCCL_CONF_FILE or ~/.nccl.conf, then /etc/nccl.conf) and the 7 ports after
it (up to 65535), one per local rank, at NCCL_GO_METRICS_BIND's address
(127.0.0.1 when unset or a wildcard). --once takes two scrapes
--interval apart, prints one table without terminal control codes, and exits
with status 1 if no endpoint answered, 128 + the signal's number if stopped
before its table.`)
	interval := fs.Duration("interval", 2*time.Second, "`DURATION` between refreshes (and between the two scrapes of --once)")
	once := fs.Bool("once", false, "print one table and exit (for scripts and tests)")
	timeout := fs.Duration("timeout", 2*time.Second, "`DURATION` allowed for one scrape")
	pos, err := fs.parseInterleaved(args)
	if err != nil {
		return err
	}
	if *interval < 100*time.Millisecond {
		return usagef("--interval %v: use at least 100ms", *interval)
	}
	if *timeout <= 0 {
		return usagef("--timeout %v: must be positive", *timeout)
	}
	if len(pos) == 0 {
		// The base port the plugin would use inside NCCL: the environment,
		// then NCCL_CONF_FILE (or ~/.nccl.conf) and /etc/nccl.conf.
		conf := loadConf()
		conf.install()
		defer ncclenv.SetLookup(nil)
		conf.warnProblems(c, "top")
		base := 9400
		if raw, src, ok := conf.lookup(envMetricsPort); ok && strings.TrimSpace(raw) != "" {
			v, _ := ncclenv.Check(envMetricsPort, raw)
			if v.Invalid {
				// Scraping the default ports instead would look for ranks
				// that, with this value, serve nothing.
				return usagef("%s=%s (%s): %s with it: fix it, or give ADDR", envMetricsPort, raw, src, v.Why)
			}
			base, _ = strconv.Atoi(v.Used)
		}
		// The ranks listen where NCCL_GO_METRICS_BIND says; a wildcard
		// answers on loopback too.
		host := metrics.BindAddress()
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			host = "127.0.0.1"
		}
		pos = []string{net.JoinHostPort(host, fmt.Sprintf("%d-%d", base, min(base+7, 65535)))}
	}
	var targets []string
	seen := map[string]bool{}
	for _, a := range pos {
		t, err := expandAddr(a)
		if err != nil {
			return usagef("%v", err)
		}
		// An endpoint named twice ("top 9400 9400-9407") would be listed
		// twice and counted twice in the totals.
		for _, u := range t {
			if !seen[u] {
				seen[u] = true
				targets = append(targets, u)
			}
		}
	}
	s := &scraper{client: &http.Client{Timeout: *timeout}}
	first := s.scrapeAll(targets)
	ansi := !*once && isTerminal(c.stdout)
	wait := func() bool {
		select {
		case <-time.After(*interval):
			return true
		case <-c.interrupt:
			return false
		}
	}
	if *once {
		// Interrupted before its table, --once printed nothing: a script
		// must not read that as success. (Interactive top is left with ^C,
		// which is its normal end: status 0.)
		if !wait() {
			sig := c.received()
			fmt.Fprintf(c.stderr, "ncclnet-go top: interrupted by %s before --once's second scrape: no table printed\n", signalName(sig))
			return interrupted{sig}
		}
		cur := s.scrapeAll(targets)
		rows := s.rows(cur, first)
		render(c.stdout, rows, len(targets), *interval, false)
		for _, sc := range cur {
			if sc.err == nil {
				return nil
			}
		}
		return failure{"no metrics endpoint answered (" + strings.Join(pos, " ") + "); is NCCL_GO_METRICS_PORT set for the job?"}
	}
	prev := first
	for wait() {
		cur := s.scrapeAll(targets)
		render(c.stdout, s.rows(cur, prev), len(targets), *interval, ansi)
		prev = cur
	}
	return nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// expandAddr turns one ADDR argument into scrape URLs.
func expandAddr(a string) ([]string, error) {
	if strings.HasPrefix(a, "http://") || strings.HasPrefix(a, "https://") {
		u, err := url.Parse(a)
		if err != nil || u.Hostname() == "" {
			return nil, fmt.Errorf("%q is not a URL", a)
		}
		if p := u.Port(); p != "" {
			if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
				return nil, fmt.Errorf("%q: port %s is outside 1..65535", a, p)
			}
		}
		// The plugin serves /metrics only; a bare http://host:port is 404.
		if u.Path == "" || u.Path == "/" {
			u.Path = "/metrics"
		}
		return []string{u.String()}, nil
	}
	host, ports := "127.0.0.1", a
	if i := strings.LastIndexByte(a, ':'); i >= 0 {
		host, ports = a[:i], a[i+1:]
		if host == "" {
			host = "127.0.0.1"
		}
		// An IPv6 address takes brackets ([::1]:9400): without them its
		// last group would be read as the port ("::1" as host ":", port 1).
		bare, bracketed := host, len(host) > 2 && host[0] == '[' && host[len(host)-1] == ']'
		if bracketed {
			bare = host[1 : len(host)-1]
		}
		switch {
		case !bracketed && strings.Contains(host, ":"):
			return nil, fmt.Errorf("%q is not host:port, a port, host:port-port or a URL (an IPv6 address goes in brackets, as in [::1]:9400)", a)
		case strings.ContainsAny(bare, "[]") || bracketed && !strings.Contains(bare, ":"):
			return nil, fmt.Errorf("%q is not host:port, a port, host:port-port or a URL", a)
		}
	}
	lo, hi := ports, ports
	if i := strings.IndexByte(ports, '-'); i >= 0 {
		lo, hi = ports[:i], ports[i+1:]
	}
	l, err1 := strconv.Atoi(lo)
	h, err2 := strconv.Atoi(hi)
	if err1 != nil || err2 != nil || l < 1 || h > 65535 || h < l {
		return nil, fmt.Errorf("%q is not host:port, a port, host:port-port or a URL", a)
	}
	if h-l >= 256 {
		return nil, fmt.Errorf("%q spans %d ports; at most 256", a, h-l+1)
	}
	var out []string
	for p := l; p <= h; p++ {
		out = append(out, "http://"+net.JoinHostPort(strings.Trim(host, "[]"), strconv.Itoa(p))+"/metrics")
	}
	return out, nil
}

// devKey identifies a device series set inside one process.
type devKey struct{ transport, device, port string }

// devStats are one device's counters at one scrape; [0] send, [1] recv.
type devStats struct {
	bytes, msgs, inflight, conns, stalls, latSum, latCount [2]float64
	errors                                                 float64
}

type scrape struct {
	target    string
	at        time.Time
	err       error
	rank      string
	transport string
	devs      map[devKey]*devStats
}

// maxScrapeBytes is the most top reads of one answer (a variable for tests).
var maxScrapeBytes int64 = 16 << 20

type scraper struct {
	client *http.Client
}

func (s *scraper) scrapeAll(targets []string) []*scrape {
	out := make([]*scrape, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = s.scrapeOne(t)
		}()
	}
	wg.Wait()
	return out
}

func (s *scraper) scrapeOne(target string) *scrape {
	sc := &scrape{target: target, at: time.Now(), devs: map[devKey]*devStats{}}
	ctx, cancel := context.WithTimeout(context.Background(), s.client.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		sc.err = err
		return sc
	}
	resp, err := s.client.Do(req)
	if err != nil {
		sc.err = shortNetErr(err)
		return sc
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		sc.err = fmt.Errorf("HTTP %s", resp.Status)
		return sc
	}
	// A plugin endpoint is a few KiB per device; a range (node7:9400-9407)
	// may hit some other service, whose answer must not fill top's memory.
	body := &io.LimitedReader{R: resp.Body, N: maxScrapeBytes + 1}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(body)
	if body.N == 0 {
		sc.err = fmt.Errorf("answers with more than %d MiB: not a libnccl-net-go endpoint", maxScrapeBytes>>20)
		return sc
	}
	if err != nil && ctx.Err() != nil {
		// An endpoint that answers slower than --timeout is not answering,
		// whether it is slow to accept, to send headers or to send the rest.
		sc.err = errors.New("timed out")
		return sc
	}
	if err != nil {
		sc.err = fmt.Errorf("not a Prometheus text exposition: %v", err)
		return sc
	}
	if _, ok := fams["ncclnet_info"]; !ok {
		sc.err = errors.New("answers, but exposes no ncclnet_info: not a libnccl-net-go endpoint")
		return sc
	}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			lb := map[string]string{}
			for _, l := range m.GetLabel() {
				lb[l.GetName()] = l.GetValue()
			}
			if sc.rank == "" {
				sc.rank = lb["local_rank"]
			}
			if name == "ncclnet_info" {
				sc.transport = lb["transport"]
				continue
			}
			if lb["device"] == "" {
				continue
			}
			k := devKey{lb["transport"], lb["device"], lb["port"]}
			d := sc.devs[k]
			if d == nil {
				d = &devStats{}
				sc.devs[k] = d
			}
			dir := 0
			if lb["direction"] == "recv" {
				dir = 1
			}
			v := value(m)
			switch name {
			case "ncclnet_bytes_total":
				d.bytes[dir] = v
			case "ncclnet_messages_total":
				d.msgs[dir] = v
			case "ncclnet_requests_in_flight":
				d.inflight[dir] = v
			case "ncclnet_connections_open":
				d.conns[dir] = v
			case "ncclnet_stalled_requests_total":
				d.stalls[dir] = v
			case "ncclnet_errors_total":
				d.errors += v
			case "ncclnet_request_duration_seconds":
				if h := m.GetHistogram(); h != nil {
					d.latSum[dir], d.latCount[dir] = h.GetSampleSum(), float64(h.GetSampleCount())
				}
			}
		}
	}
	return sc
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return math.NaN()
}

func shortNetErr(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		s := op.Err.Error()
		if i := strings.LastIndex(s, ": "); i >= 0 {
			s = s[i+2:]
		}
		return errors.New(s)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return errors.New("timed out")
	}
	return err
}

// row is one line of the table: a device of a rank, or a target that is down.
type row struct {
	target, rank, transport, device string
	down                            string
	sendBps, recvBps, msgps         float64
	inflight, conns                 [2]float64
	latency                         float64 // seconds, NaN when nothing completed
	errors, stalls                  float64
	newErrors, newStalls            float64
	sent, received                  float64
}

// rows computes rates between prev and cur scrapes of the same targets.
func (s *scraper) rows(cur, prev []*scrape) []row {
	var out []row
	for i, sc := range cur {
		host := strings.TrimSuffix(strings.TrimPrefix(sc.target, "http://"), "/metrics")
		if sc.err != nil {
			out = append(out, row{target: host, down: sc.err.Error()})
			continue
		}
		var p *scrape
		if i < len(prev) && prev[i].err == nil {
			p = prev[i]
		}
		keys := make([]devKey, 0, len(sc.devs))
		for k := range sc.devs {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(a, b int) bool {
			if keys[a].device != keys[b].device {
				return keys[a].device < keys[b].device
			}
			return keys[a].port < keys[b].port
		})
		if len(keys) == 0 {
			out = append(out, row{target: host, rank: sc.rank, transport: sc.transport, down: "up, no device yet (NCCL has not initialised the plugin)"})
		}
		for _, k := range keys {
			d := sc.devs[k]
			r := row{target: host, rank: sc.rank, transport: k.transport, device: devName(k.device, atoiOr0(k.port)),
				inflight: d.inflight, conns: d.conns, errors: d.errors, stalls: d.stalls[0] + d.stalls[1],
				sent: d.bytes[0], received: d.bytes[1], latency: math.NaN()}
			var pd *devStats
			if p != nil {
				pd = p.devs[k]
			}
			if pd != nil {
				dt := sc.at.Sub(p.at).Seconds()
				if dt > 0 {
					r.sendBps = delta(d.bytes[0], pd.bytes[0]) / dt
					r.recvBps = delta(d.bytes[1], pd.bytes[1]) / dt
					r.msgps = (delta(d.msgs[0], pd.msgs[0]) + delta(d.msgs[1], pd.msgs[1])) / dt
				}
				var n, sum float64
				for dir := 0; dir < 2; dir++ {
					dn, ds := histDelta(d.latSum[dir], d.latCount[dir], pd.latSum[dir], pd.latCount[dir])
					n, sum = n+dn, sum+ds
				}
				if n > 0 {
					r.latency = sum / n
				}
				r.newErrors = delta(d.errors, pd.errors)
				r.newStalls = delta(d.stalls[0]+d.stalls[1], pd.stalls[0]+pd.stalls[1])
			}
			out = append(out, r)
		}
	}
	return out
}

// delta is a counter's increase; a counter that went down belongs to a
// restarted process, whose whole value is new.
func delta(cur, prev float64) float64 {
	if cur < prev {
		return cur
	}
	return cur - prev
}

// histDelta is a histogram's increase in count and sum. The two are one
// histogram of one process: when either went down the process restarted, and
// both of its values are new (taking the reset on one alone would divide the
// new process's sum by the old one's count, or the other way round).
func histDelta(sum, count, prevSum, prevCount float64) (dCount, dSum float64) {
	if count < prevCount || sum < prevSum {
		return count, sum
	}
	return count - prevCount, sum - prevSum
}

func atoiOr0(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

func render(w io.Writer, rows []row, ntargets int, interval time.Duration, ansi bool) {
	var b strings.Builder
	if ansi {
		b.WriteString("\x1b[H\x1b[2J")
	}
	up := map[string]bool{}
	var tot row
	for _, r := range rows {
		if r.down == "" || r.rank != "" {
			up[r.target] = true
		}
		tot.sendBps += r.sendBps
		tot.recvBps += r.recvBps
		tot.errors += r.errors
		tot.stalls += r.stalls
	}
	fmt.Fprintf(&b, "ncclnet-go top  %s  %d of %d endpoint(s) up  rates over %v  total send %s recv %s  errors %s  stalls %s\n\n",
		time.Now().Format("15:04:05"), len(up), ntargets, interval, gbps(tot.sendBps), gbps(tot.recvBps),
		num(tot.errors), num(tot.stalls))
	cols := []string{"ENDPOINT", "RANK", "DEVICE", "TRANSPORT", "SEND GB/s", "RECV GB/s", "MSG/s", "INFLIGHT S/R", "CONNS S/R", "AVG LAT", "ERRORS", "STALLS", "SENT", "RECEIVED"}
	var table [][]string
	for _, r := range rows {
		if r.down != "" {
			table = append(table, []string{r.target, dash(r.rank), "-", dash(r.transport), r.down})
			continue
		}
		table = append(table, []string{r.target, r.rank, r.device, r.transport, gbps(r.sendBps), gbps(r.recvBps),
			num(r.msgps), num(r.inflight[0]) + "/" + num(r.inflight[1]), num(r.conns[0]) + "/" + num(r.conns[1]),
			latency(r.latency), withNew(r.errors, r.newErrors), withNew(r.stalls, r.newStalls), bytesH(r.sent), bytesH(r.received)})
	}
	for _, t := range table {
		for i := range t {
			t[i] = printable(t[i])
		}
	}
	width := make([]int, len(cols))
	for i, c := range cols {
		width[i] = len(c)
	}
	for _, t := range table {
		for i, c := range t {
			// A down row's last cell (the reason) spans the rest of the
			// line; its other cells line up with the columns.
			if i < len(t)-1 || len(t) == len(cols) {
				width[i] = max(width[i], len(c))
			}
		}
	}
	line := func(cells []string) {
		for i, c := range cells {
			if i == len(cells)-1 {
				b.WriteString(c)
				break
			}
			if i >= 4 && len(cells) == len(cols) {
				fmt.Fprintf(&b, "%*s  ", width[i], c)
			} else {
				fmt.Fprintf(&b, "%-*s  ", width[i], c)
			}
		}
		b.WriteString("\n")
	}
	line(cols)
	for _, t := range table {
		line(t)
	}
	io.WriteString(w, b.String())
	if !ansi {
		io.WriteString(w, "\n")
	}
}

// printable is a cell as the table shows it: label values and error texts
// come from whatever answers on a metrics port, and a control character (an
// escape sequence, a newline) or a byte that is not UTF-8 would redraw the
// operator's terminal or break the table's rows; each is shown as \xNN.
func printable(s string) string {
	if utf8.ValidString(s) && strings.IndexFunc(s, unicode.IsControl) < 0 {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 || unicode.IsControl(r) {
			for _, c := range []byte(s[i : i+n]) {
				fmt.Fprintf(&b, `\x%02x`, c)
			}
		} else {
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func gbps(bps float64) string { return strconv.FormatFloat(bps/1e9, 'f', 3, 64) }

func num(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

func withNew(total, fresh float64) string {
	if fresh > 0 {
		return num(total) + " (+" + num(fresh) + ")"
	}
	return num(total)
}

func latency(sec float64) string {
	switch {
	case math.IsNaN(sec):
		return "-"
	case sec < 1e-3:
		return strconv.FormatFloat(sec*1e6, 'f', 1, 64) + "us"
	case sec < 1:
		return strconv.FormatFloat(sec*1e3, 'f', 2, 64) + "ms"
	}
	return strconv.FormatFloat(sec, 'f', 2, 64) + "s"
}

func bytesH(b float64) string {
	const unit = 1024
	if b < unit {
		return num(b) + " B"
	}
	div, exp := float64(unit), 0
	for n := b / unit; n >= unit && exp < 4; n /= unit {
		div *= unit
		exp++
	}
	return strconv.FormatFloat(b/div, 'f', 1, 64) + " " + string("KMGTP"[exp]) + "iB"
}
