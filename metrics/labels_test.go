package metrics

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A device or transport name that is not UTF-8 (Linux allows any byte but
// '/', ':' and white space in an interface name; a vendor transport names its
// devices as it likes) must not crash the process that hosts the plugin:
// client_golang's MustNewConstMetric panics on such a label value, inside a
// goroutine of Gather, so one scrape (or the textfile write at init) would
// kill the NCCL application. The series must still be exposed, with the
// bad bytes escaped, and the exposition must stay valid.
func TestNonUTF8NamesDoNotCrashAScrape(t *testing.T) {
	d := &Device{Transport: "socket", Name: "eth\xff0", Port: 0}
	d.RequestPosted(Send)
	d.RequestDone(Send, 42, 0)
	// Registered as newRegistry and startTextfile do: through
	// WrapRegistererWith, whose Collect runs ours in a goroutine of its own,
	// where a panic is not recovered but ends the process.
	reg := prometheus.NewPedanticRegistry()
	prometheus.WrapRegistererWith(jobLabels("job1"), reg).MustRegister(newCollector(
		Info{PluginVersion: "1\xfe", APIVersion: "v12", Transport: "vendor\xff"}, 0, func() []*Device { return []*Device{d} }))

	mfs := gather(t, reg)
	assert.Equal(t, 42.0, value(t, mfs, "ncclnet_bytes_total", "device", `eth\xff0`, "direction", "send"))
	assert.Equal(t, 1.0, value(t, mfs, "ncclnet_info", "transport", `vendor\xff`, "version", `1\xfe`))

	// The textfile path (run synchronously by Start at NCCL's init).
	path := filepath.Join(t.TempDir(), "x.prom")
	require.NoError(t, prometheus.WriteToTextfile(path, reg))
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	mfs = parseText(t, f)
	assert.Equal(t, 42.0, value(t, mfs, "ncclnet_bytes_total", "device", `eth\xff0`, "direction", "send"))
}

// Two names that differ only in their invalid bytes stay two series (no
// duplicate, which would fail the whole gather).
func TestNonUTF8NamesStayDistinct(t *testing.T) {
	a := &Device{Transport: "socket", Name: "eth\xfe", Port: 0}
	b := &Device{Transport: "socket", Name: "eth\xff", Port: 0}
	mfs := gather(t, testRegistry(t, testInfo, 0, a, b))
	sample(t, mfs, "ncclnet_bytes_total", "device", `eth\xfe`)
	sample(t, mfs, "ncclnet_bytes_total", "device", `eth\xff`)
}

// Eight processes of a node whose launcher sets no local-rank variable all
// take local rank 0, so every one but the first finds base + 0 taken. Moving
// the base port (all the WARN used to advise) collides again: the WARN must
// name NCCL_GO_METRICS_LOCAL_RANK. With a known local rank the port is taken
// by someone else, and the base port is the thing to change.
func TestPortInUseWithoutALocalRankNamesTheLocalRankVariable(t *testing.T) {
	stopAll(t)
	port := takenPort(t)

	setEnv(t, map[string]string{"NCCL_GO_METRICS_PORT": strconv.Itoa(port)})
	log := &recLogger{}
	Start(log, testInfo)
	Stop()
	warns := log.Warns()
	require.Len(t, warns, 1)
	assert.Contains(t, warns[0], "address already in use")
	assert.Contains(t, warns[0], "set NCCL_GO_METRICS_LOCAL_RANK")

	setEnv(t, map[string]string{"NCCL_GO_METRICS_PORT": strconv.Itoa(port), "LOCAL_RANK": "0"})
	log = &recLogger{}
	Start(log, testInfo)
	Stop()
	warns = log.Warns()
	require.Len(t, warns, 1)
	assert.NotContains(t, warns[0], "NCCL_GO_METRICS_LOCAL_RANK", "the local rank is known: only the base port can help")
}
