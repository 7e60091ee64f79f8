package metrics

import (
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDocumentedMetricsMatchTheCode compares docs/metrics.md's table of
// metrics with what the collector exposes: every documented metric exists
// with the documented type and labels, and every exposed one is documented.
func TestDocumentedMetricsMatchTheCode(t *testing.T) {
	b, err := os.ReadFile("../docs/metrics.md")
	require.NoError(t, err)
	row := regexp.MustCompile("^\\| `(ncclnet_[a-z_]+)` \\| ([a-z]+)[^|]* \\| ([^|]*) \\|")
	type doc struct {
		typ    string
		labels []string
	}
	docs := map[string]doc{}
	for _, line := range strings.Split(string(b), "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		var labels []string
		for _, l := range strings.Split(m[3], ",") {
			l = strings.Trim(strings.TrimSpace(l), "`")
			if l == "device" { // "device" stands for transport, device and port
				labels = append(labels, "transport", "device", "port")
			} else if l != "" {
				labels = append(labels, l)
			}
		}
		labels = append(labels, "local_rank")
		sort.Strings(labels)
		docs[m[1]] = doc{m[2], labels}
	}
	require.NotEmpty(t, docs)

	d := &Device{Transport: "ib", Name: "mlx5_0", Port: 1}
	mfs := gather(t, testRegistry(t, testInfo, 0, d))
	seen := map[string]bool{}
	for _, mf := range mfs {
		name := mf.GetName()
		seen[name] = true
		want, ok := docs[name]
		if !assert.True(t, ok, "%s is exposed but has no row in docs/metrics.md", name) {
			continue
		}
		assert.Equal(t, want.typ, strings.ToLower(mf.GetType().String()), "%s: type", name)
		for _, m := range mf.GetMetric() {
			var have []string
			for _, lp := range m.GetLabel() {
				have = append(have, lp.GetName())
			}
			sort.Strings(have)
			assert.Equal(t, want.labels, have, "%s: labels", name)
		}
	}
	for name := range docs {
		assert.True(t, seen[name], "%s is documented in docs/metrics.md but not exposed", name)
	}
}
