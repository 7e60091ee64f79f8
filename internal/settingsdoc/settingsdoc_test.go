package settingsdoc

import (
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	_ "github.com/libnccl-net-go/libnccl-net-go/example/shm"
	_ "github.com/libnccl-net-go/libnccl-net-go/ib"
	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	_ "github.com/libnccl-net-go/libnccl-net-go/internal/ncclsock"
	_ "github.com/libnccl-net-go/libnccl-net-go/internal/timeout"
	_ "github.com/libnccl-net-go/libnccl-net-go/metrics"
	_ "github.com/libnccl-net-go/libnccl-net-go/plugin"
	_ "github.com/libnccl-net-go/libnccl-net-go/socket"
)

const doc = "../../docs/configuration.md"

// documented returns the variables named in a table row's first cell of doc.
func documented(t *testing.T) map[string]bool {
	b, err := os.ReadFile(doc)
	require.NoError(t, err)
	cell := regexp.MustCompile("`([A-Z][A-Z0-9_]+)`")
	out := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "|") {
			continue
		}
		first := strings.SplitN(strings.TrimPrefix(line, "|"), "|", 2)[0]
		for _, m := range cell.FindAllStringSubmatch(first, -1) {
			out[m[1]] = true
		}
	}
	return out
}

func TestEveryDeclaredSettingIsDocumented(t *testing.T) {
	docs := documented(t)
	all := ncclenv.All()
	require.NotEmpty(t, all)
	for _, s := range all {
		assert.True(t, docs[s.Name], "%s (declared by %s) has no row in docs/configuration.md", s.Name, s.Owner)
		assert.NotEmpty(t, s.Doc, "%s has no one-line doc", s.Name)
	}
	// Rows for variables no package declares: NCCL's own, which the docs
	// explain because they decide whether and how NCCL uses the plugin
	// (internal/diag reads the merge ones raw, as NCCL does), and one the ib
	// transport no longer reads but still WARNs about. Any other documented
	// name must be declared, so a row cannot outlive its setting.
	notDeclared := map[string]bool{
		"NCCL_DEBUG_SUBSYS": true, "NCCL_NET": true, "NCCL_NET_PLUGIN": true, "NCCL_NET_GDR_LEVEL": true,
		"NCCL_NET_FORCE_MERGE": true, "NCCL_NET_MERGE_LEVEL": true, "NCCL_NET_MERGE_POLICY": true,
		"NCCL_GO_IB_CONNECT_TIMEOUT": true,
	}
	var pending []string
	for name := range docs {
		if _, ok := ncclenv.Find(name); !ok && strings.HasPrefix(name, "NCCL_") {
			assert.True(t, notDeclared[name], "%s has a row in docs/configuration.md but no package declares it", name)
			pending = append(pending, name)
		}
	}
	sort.Strings(pending)
	t.Logf("documented, not declared (NCCL's own or retired) (%d): %s", len(pending), strings.Join(pending, " "))
}

func TestNoSettingIsDeclaredTwice(t *testing.T) {
	assert.Empty(t, ncclenv.Duplicates())
}

// documentedDefaults returns the Default cell of each variable's row in the
// tables of doc whose second column is "Default".
func documentedDefaults(t *testing.T) map[string]string {
	b, err := os.ReadFile(doc)
	require.NoError(t, err)
	out := map[string]string{}
	inTable := false
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "|") {
			inTable = false
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			continue
		}
		first, second := strings.TrimSpace(cells[1]), strings.TrimSpace(cells[2])
		if first == "Variable" {
			inTable = second == "Default"
			continue
		}
		if inTable && strings.HasPrefix(first, "`") {
			out[strings.Trim(first, "`")] = strings.ReplaceAll(second, "`", "")
		}
	}
	return out
}

var (
	docNumber   = regexp.MustCompile(`(-?(?:0x[0-9a-fA-F]+|[0-9]+(?:\.[0-9]+)?))\s*(µs|us|ms|s|min|h)?\b`)
	docDuration = map[string]time.Duration{"µs": time.Microsecond, "us": time.Microsecond, "ms": time.Millisecond,
		"s": time.Second, "min": time.Minute, "h": time.Hour}
)

// TestDocumentedDefaultsMatch compares each row's Default cell with the
// declared default, so a changed default cannot leave the table behind: the
// first number in the cell must be the declared number (for a duration, the
// same length of time; a bare number may be in s, ms or µs, as the Values
// column says), and a word default (AF_INET, /dev/shm) must appear in it.
// Defaults that are prose ("auto (...)", "unset ...") are the rows' own
// business and are skipped.
func TestDocumentedDefaultsMatch(t *testing.T) {
	cells := documentedDefaults(t)
	checked := 0
	for _, s := range ncclenv.All() {
		cell, ok := cells[s.Name]
		if !ok || s.Default == "" || strings.HasPrefix(s.Default, "unset") || strings.HasPrefix(s.Default, "auto") {
			continue
		}
		want := strings.Fields(s.Default)[0]
		m := docNumber.FindStringSubmatch(cell)
		switch s.Kind {
		case ncclenv.KindDuration:
			d, err := time.ParseDuration(want)
			require.NoError(t, err, "%s: declared default %q", s.Name, s.Default)
			if !assert.NotNil(t, m, "%s: Default cell %q has no number; declared %v", s.Name, cell, d) {
				continue
			}
			n, err := strconv.ParseFloat(m[1], 64)
			require.NoError(t, err)
			units := []time.Duration{docDuration[m[2]]}
			if m[2] == "" {
				units = []time.Duration{time.Second, time.Millisecond, time.Microsecond}
			}
			match := false
			for _, u := range units {
				match = match || time.Duration(n*float64(u)) == d
			}
			assert.True(t, match, "%s: docs/configuration.md says %q, the declared default is %v", s.Name, cell, d)
		case ncclenv.KindInt, ncclenv.KindUint64, ncclenv.KindBool:
			if w := docNumber.FindString(want); w != want {
				continue // prose, e.g. "launcher's, else 0"
			}
			if !assert.NotNil(t, m, "%s: Default cell %q has no number; declared %q", s.Name, cell, s.Default) {
				continue
			}
			assert.Equal(t, want, m[1], "%s: docs/configuration.md says %q, the declared default is %q", s.Name, cell, s.Default)
		default:
			assert.Contains(t, cell, want, "%s: docs/configuration.md says %q, the declared default is %q", s.Name, cell, s.Default)
		}
		checked++
	}
	t.Logf("%d documented defaults match their declarations", checked)
	assert.Greater(t, checked, 30, "the Default cells were not found: did the tables' header change?")
}
