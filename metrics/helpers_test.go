package metrics

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// recLogger records what the package logs, so tests can check WARNs.
type recLogger struct {
	mu    sync.Mutex
	warns []string
	infos []string
}

func (l *recLogger) Warnf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.warns = append(l.warns, fmt.Sprintf(format, args...))
}

func (l *recLogger) Infof(_ nccl.Subsys, format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.infos = append(l.infos, fmt.Sprintf(format, args...))
}

func (l *recLogger) Tracef(nccl.Subsys, string, ...any) {}

func (l *recLogger) Warns() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.warns...)
}

// setEnv makes the nccl env helpers see exactly vars for the rest of the test
// (the real environment may hold LOCAL_RANK and friends).
func setEnv(t *testing.T, vars map[string]string) {
	t.Helper()
	ncclenv.SetLookup(func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	})
	t.Cleanup(func() { ncclenv.SetLookup(nil) })
}

// stopAll ends any Start left by a failing test, so the next starts clean.
func stopAll(t *testing.T) {
	t.Cleanup(func() {
		state.Lock()
		n := state.refs
		state.Unlock()
		for ; n > 0; n-- {
			Stop()
		}
	})
}

var devSeq struct {
	sync.Mutex
	n int
}

// newTestDevice returns a device no other test touches.
func newTestDevice(t *testing.T, transport string, port int) *Device {
	devSeq.Lock()
	devSeq.n++
	n := devSeq.n
	devSeq.Unlock()
	return ForDevice(transport, fmt.Sprintf("%s_dev%d", strings.ReplaceAll(t.Name(), "/", "_"), n), port)
}

// sample finds the value of the series name{labels...} (labels given as
// key, value pairs; other labels are ignored) in families.
func sample(t *testing.T, families []*dto.MetricFamily, name string, labels ...string) *dto.Metric {
	t.Helper()
	require.Zero(t, len(labels)%2)
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			return m
		}
	}
	require.Failf(t, "series not found", "%s%v", name, labels)
	return nil
}

func value(t *testing.T, families []*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	m := sample(t, families, name, labels...)
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	require.Failf(t, "not a counter or gauge", "%s", name)
	return 0
}

func gather(t *testing.T, g prometheus.Gatherer) []*dto.MetricFamily {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	return mfs
}

// parseText parses a text exposition strictly (a truncated or garbled file
// fails here).
func parseText(t *testing.T, r io.Reader) []*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	byName, err := p.TextToMetricFamilies(r)
	require.NoError(t, err)
	out := make([]*dto.MetricFamily, 0, len(byName))
	for _, mf := range byName {
		out = append(out, mf)
	}
	return out
}

var httpClient = &http.Client{Timeout: 10 * time.Second}

func scrape(t *testing.T, addr string) []*dto.MetricFamily {
	t.Helper()
	resp, err := httpClient.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	return parseText(t, resp.Body)
}

// freePort returns a port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func currentExporter(t *testing.T) *exporter {
	t.Helper()
	state.Lock()
	defer state.Unlock()
	require.NotNil(t, state.exp, "metrics not started")
	return state.exp
}

type dtoFamily = dto.MetricFamily

// filterDirection keeps only family name's series with the given direction.
func filterDirection(mfs []*dto.MetricFamily, name, dir string) []*dto.MetricFamily {
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		out := &dto.MetricFamily{Name: mf.Name, Help: mf.Help, Type: mf.Type}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "direction" && lp.GetValue() == dir {
					out.Metric = append(out.Metric, m)
				}
			}
		}
		return []*dto.MetricFamily{out}
	}
	return nil
}
