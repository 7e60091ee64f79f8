package metrics

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/forkguard"
	"github.com/libnccl-net-go/libnccl-net-go/internal/clock"
	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
)

var testInfo = Info{PluginVersion: "test", APIVersion: "v12", Transport: "socket"}

func TestOffByDefault(t *testing.T) {
	stopAll(t)
	setEnv(t, map[string]string{"LOCAL_RANK": "garbage"})
	log := &recLogger{}
	Start(log, testInfo)
	e := currentExporter(t)
	assert.Nil(t, e.server, "no endpoint unless NCCL_GO_METRICS_PORT is set")
	assert.Empty(t, e.textfile, "no file unless NCCL_GO_METRICS_TEXTFILE_DIR is set")
	assert.NotNil(t, gatherer())
	assert.Empty(t, log.Warns(), "nothing to warn about when metrics are not exposed")
	Stop()
	assert.Nil(t, gatherer())
}

func TestEndpointServesDeviceCounters(t *testing.T) {
	stopAll(t)
	port := freePort(t)
	setEnv(t, map[string]string{"NCCL_GO_METRICS_PORT": strconv.Itoa(port), "LOCAL_RANK": "0"})
	d := newTestDevice(t, "socket", 0)
	d.RequestPosted(Send)
	d.RequestDone(Send, 12345, clock.Now())

	log := &recLogger{}
	Start(log, testInfo)
	e := currentExporter(t)
	require.Equal(t, fmt.Sprintf("127.0.0.1:%d", port), e.addr)
	mfs := scrape(t, e.addr)
	assert.Equal(t, 12345.0, value(t, mfs, "ncclnet_bytes_total", "device", d.Name, "direction", "send"))
	assert.Equal(t, 1.0, value(t, mfs, "ncclnet_info", "version", "test", "nccl_net_api", "v12", "transport", "socket"))

	// Counters are read at scrape time: new traffic shows on the next scrape.
	d.RequestPosted(Send)
	d.RequestDone(Send, 5, clock.Now())
	mfs = scrape(t, e.addr)
	assert.Equal(t, 12350.0, value(t, mfs, "ncclnet_bytes_total", "device", d.Name, "direction", "send"))
	assert.Empty(t, log.Warns())

	Stop()
	_, err := net.Dial("tcp", e.addr)
	assert.Error(t, err, "the endpoint must be closed by the last Stop")
}

// A client that connects and says nothing (a port probe), or sends half a
// request, cannot hold Stop, which the glue's last finalize makes with its
// lock held; it took Go's whole 2 s shutdown budget until 2026-11-28.
func TestStopDoesNotWaitForSilentClients(t *testing.T) {
	stopAll(t)
	port := freePort(t)
	setEnv(t, map[string]string{"NCCL_GO_METRICS_PORT": strconv.Itoa(port), "LOCAL_RANK": "0"})
	Start(&recLogger{}, testInfo)
	e := currentExporter(t)
	silent, err := net.Dial("tcp", e.addr)
	require.NoError(t, err)
	defer silent.Close()
	half, err := net.Dial("tcp", e.addr)
	require.NoError(t, err)
	defer half.Close()
	_, err = half.Write([]byte("GET /metrics HTTP/1.1\r\n"))
	require.NoError(t, err)
	scrape(t, e.addr) // the server has accepted both by the time it answers this
	start := time.Now()
	Stop()
	assert.Less(t, time.Since(start), time.Second, "Stop waited for clients that sent no complete request")
}

func TestPortOffsetByLocalRank(t *testing.T) {
	stopAll(t)
	port := freePort(t)
	require.Greater(t, port, 5)
	for _, tc := range []struct {
		name string
		env  map[string]string
	}{
		{"NCCL_GO_METRICS_LOCAL_RANK wins", map[string]string{"NCCL_GO_METRICS_LOCAL_RANK": "5", "LOCAL_RANK": "1", "SLURM_LOCALID": "2"}},
		{"LOCAL_RANK", map[string]string{"LOCAL_RANK": "5", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}},
		{"OMPI_COMM_WORLD_LOCAL_RANK", map[string]string{"OMPI_COMM_WORLD_LOCAL_RANK": "5", "SLURM_LOCALID": "1"}},
		{"SLURM_LOCALID", map[string]string{"SLURM_LOCALID": "5", "MPI_LOCALRANKID": "1"}},
		{"MPI_LOCALRANKID", map[string]string{"MPI_LOCALRANKID": "5"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.env["NCCL_GO_METRICS_PORT"] = strconv.Itoa(port - 5)
			setEnv(t, tc.env)
			log := &recLogger{}
			Start(log, testInfo)
			defer Stop()
			e := currentExporter(t)
			assert.Equal(t, 5, e.localRank)
			require.Equal(t, fmt.Sprintf("127.0.0.1:%d", port), e.addr, "port = base + local rank")
			mfs := scrape(t, e.addr)
			assert.Equal(t, 1.0, value(t, mfs, "ncclnet_info", "local_rank", "5"))
			assert.Empty(t, log.Warns())
		})
	}
}

func TestLocalRankFallsBackPastBadValues(t *testing.T) {
	setEnv(t, map[string]string{"NCCL_GO_METRICS_LOCAL_RANK": "x", "LOCAL_RANK": "-1", "SLURM_LOCALID": "4"})
	log := &recLogger{}
	assert.Equal(t, 4, LocalRank(log))
	warns := log.Warns()
	require.Len(t, warns, 2)
	assert.Contains(t, warns[0], `NCCL_GO_METRICS_LOCAL_RANK="x"`)
	assert.Contains(t, warns[1], `LOCAL_RANK="-1"`)

	setEnv(t, map[string]string{})
	assert.Equal(t, 0, LocalRank(nil))
}

// takenPort is a port of 127.0.0.1 that a listener holds until t ends.
func takenPort(t *testing.T) int {
	t.Helper()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { busy.Close() })
	return busy.Addr().(*net.TCPAddr).Port
}

func TestPortInUseWarnsAndKeepsWorking(t *testing.T) {
	stopAll(t)
	port := takenPort(t)
	dir := t.TempDir()
	setEnv(t, map[string]string{
		"NCCL_GO_METRICS_PORT":         strconv.Itoa(port - 2),
		"NCCL_GO_METRICS_LOCAL_RANK":   "2",
		"NCCL_GO_METRICS_TEXTFILE_DIR": dir,
	})
	log := &recLogger{}
	Start(log, testInfo)
	defer Stop()

	warns := log.Warns()
	require.Len(t, warns, 1)
	assert.Contains(t, warns[0], fmt.Sprintf("127.0.0.1:%d", port))
	assert.Contains(t, warns[0], "NCCL_GO_METRICS_PORT")
	assert.Contains(t, warns[0], "address already in use")
	e := currentExporter(t)
	assert.Nil(t, e.server)
	// The rest of the exposition still works.
	assert.NotNil(t, gatherer())
	assert.FileExists(t, filepath.Join(dir, TextfileName(2, ProcessID())))
}

func TestBadSettingsWarn(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		warn string
	}{
		{map[string]string{"NCCL_GO_METRICS_PORT": "http"}, `NCCL_GO_METRICS_PORT="http"`},
		{map[string]string{"NCCL_GO_METRICS_PORT": "0"}, "NCCL_GO_METRICS_PORT=0 is not a port; set NCCL_GO_METRICS_PORT to a base port in 1..65535"},
		// Base 0 is the problem, not the port it gives (1 is in range).
		{map[string]string{"NCCL_GO_METRICS_PORT": "0", "LOCAL_RANK": "1"}, "NCCL_GO_METRICS_PORT=0 is not a port;"},
		{map[string]string{"NCCL_GO_METRICS_PORT": "65535", "LOCAL_RANK": "1"}, "gives port 65536"},
		{map[string]string{"NCCL_GO_METRICS_PORT": "9400", "NCCL_GO_METRICS_BIND": "192.0.2.1"}, "NCCL_GO_METRICS_BIND"},
		{map[string]string{"NCCL_GO_METRICS_TEXTFILE_DIR": "/nonexistent/dir"}, "NCCL_GO_METRICS_TEXTFILE_DIR=/nonexistent/dir"},
		{map[string]string{"NCCL_GO_METRICS_TEXTFILE_DIR": "/etc/hostname"}, "not a directory"},
	} {
		t.Run(tc.warn, func(t *testing.T) {
			stopAll(t)
			setEnv(t, tc.env)
			log := &recLogger{}
			Start(log, testInfo)
			defer Stop()
			warns := log.Warns()
			require.Len(t, warns, 1, "%v", warns)
			assert.Contains(t, warns[0], tc.warn)
			assert.Nil(t, currentExporter(t).server)
		})
	}
}

func TestStartStopRefcounted(t *testing.T) {
	stopAll(t)
	dir := t.TempDir()
	port := freePort(t)
	setEnv(t, map[string]string{"NCCL_GO_METRICS_PORT": strconv.Itoa(port), "NCCL_GO_METRICS_TEXTFILE_DIR": dir})
	file := filepath.Join(dir, TextfileName(0, ProcessID()))

	Stop() // without Start: nothing happens
	log := &recLogger{}
	Start(log, testInfo)
	e := currentExporter(t)
	Start(log, testInfo) // NCCL initialising again must not try to listen twice
	assert.Same(t, e, currentExporter(t))
	assert.Empty(t, log.Warns())

	Stop()
	scrape(t, e.addr) // still served: one Start is outstanding
	assert.FileExists(t, file)

	Stop()
	assert.NoFileExists(t, file, "the textfile is removed at the last Stop")
	_, err := net.Dial("tcp", e.addr)
	assert.Error(t, err)
	Stop()

	// A later init (NCCL re-initialising after finalize) exposes again.
	Start(log, testInfo)
	scrape(t, currentExporter(t).addr)
	assert.FileExists(t, file)
	Stop()
	assert.Empty(t, log.Warns())
}

// TestTextfileIsReplacedAtomically has readers check every version of the file
// they can see while the writer rewrites it as fast as it is allowed to: each
// must be a complete exposition (every family, ending in a newline, parsing
// strictly), and no temporary file may carry the .prom suffix the textfile
// collector reads.
func TestTextfileIsReplacedAtomically(t *testing.T) {
	stopAll(t)
	dir := t.TempDir()
	setEnv(t, map[string]string{
		"NCCL_GO_METRICS_TEXTFILE_DIR": dir,
		"NCCL_GO_METRICS_INTERVAL":     "0.1", // the minimum: 100 ms
		"OMPI_COMM_WORLD_LOCAL_RANK":   "6",
	})
	d := newTestDevice(t, "socket", 0)
	log := &recLogger{}
	Start(log, testInfo)
	file := filepath.Join(dir, TextfileName(6, ProcessID()))
	require.FileExists(t, file, "the first file is written at Start")

	// Enough traffic that the file is large (many devices), so a non-atomic
	// write would be caught half-way.
	for i := 0; i < 50; i++ {
		newTestDevice(t, "socket", i)
	}
	stopTraffic := make(chan struct{})
	var traffic sync.WaitGroup
	traffic.Add(1)
	go func() {
		defer traffic.Done()
		for {
			select {
			case <-stopTraffic:
				return
			default:
				d.RequestPosted(Recv)
				d.RequestDone(Recv, 7, clock.Now())
			}
		}
	}()

	wantFamilies := 14
	versions := map[string]bool{}
	// Bounded by reads, not time: a slow machine sees fewer versions, which is
	// checked below only as "more than one".
	for reads := 0; reads < 200000 && len(versions) < 5; reads++ {
		ents, err := os.ReadDir(dir)
		require.NoError(t, err)
		for _, ent := range ents {
			if strings.HasSuffix(ent.Name(), ".prom") {
				require.Equal(t, filepath.Base(file), ent.Name(), "only our file may end in .prom")
			}
		}
		b, err := os.ReadFile(file)
		require.NoError(t, err, "the file must never be missing while running")
		if versions[string(b)] {
			continue
		}
		versions[string(b)] = true
		require.True(t, bytes.HasSuffix(b, []byte("\n")), "truncated file")
		mfs := parseText(t, bytes.NewReader(b))
		require.Len(t, mfs, wantFamilies, "a family is missing: partial file")
		require.Equal(t, 1.0, value(t, mfs, "ncclnet_info", "local_rank", "6"))
		value(t, mfs, "ncclnet_bytes_total", "device", d.Name, "direction", "recv")
	}
	close(stopTraffic)
	traffic.Wait()
	assert.Greater(t, len(versions), 1, "the file must be rewritten every interval")

	// The final content has the exact byte count once traffic stopped.
	sent := d.Snapshot().Bytes[Recv]
	Stop()
	assert.NoFileExists(t, file)
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, ents, "no temporary files left behind")

	// And the exposition reports bytes exactly (write one more time directly).
	e := &exporter{log: log, treg: newRegistry(testInfo, 6, nil), textfile: file, interval: minInterval}
	require.True(t, e.writeTextfile(false))
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	mfs := parseText(t, bytes.NewReader(b))
	assert.Equal(t, float64(sent), value(t, mfs, "ncclnet_bytes_total", "device", d.Name, "direction", "recv"))
	assert.Empty(t, log.Warns())
}

func TestTextfileWriteFailureWarnsOnce(t *testing.T) {
	dir := t.TempDir()
	log := &recLogger{}
	e := &exporter{log: log, treg: newRegistry(testInfo, 0, nil), textfile: filepath.Join(dir, "gone", "x.prom"), interval: minInterval}
	ok := e.writeTextfile(false)
	require.False(t, ok)
	require.False(t, e.writeTextfile(!ok))
	assert.Len(t, log.Warns(), 1, "a run of failures is one WARN")
	require.NoError(t, os.Mkdir(filepath.Join(dir, "gone"), 0o755))
	assert.True(t, e.writeTextfile(true))
	assert.Len(t, log.Warns(), 1)
}

func TestStaleTextfilesOfExitedProcessesAreRemoved(t *testing.T) {
	stopAll(t)
	dir := t.TempDir()
	old := time.Now().Add(-time.Hour)
	write := func(name string, mtime time.Time) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte("ncclnet_info 1\n"), 0o644))
		require.NoError(t, os.Chtimes(p, mtime, mtime))
		return p
	}
	// A pid that surely does not exist: beyond the kernel's pid_max limit.
	deadOld := write("ncclnet_go_rank3_pid99999999.prom", old)
	deadFresh := write("ncclnet_go_rank4_pid99999998.prom", time.Now())
	deadTemp := write("ncclnet_go_rank3_pid99999999-0a1b.prom123456789", old) // died inside a write
	aliveTemp := write(TextfileName(6, strconv.Itoa(os.Getppid()))+"987654321", old)
	aliveOld := write(TextfileName(5, strconv.Itoa(os.Getppid())), old)
	other := write("node_gpu.prom", old)

	setEnv(t, map[string]string{"NCCL_GO_METRICS_TEXTFILE_DIR": dir})
	log := &recLogger{}
	Start(log, testInfo)
	defer Stop()
	assert.NoFileExists(t, deadOld, "exited process, not written for an hour")
	assert.FileExists(t, deadFresh, "recently written: may be a live process in another pid namespace")
	assert.NoFileExists(t, deadTemp, "an exited process's temporary file")
	assert.FileExists(t, aliveTemp, "a live process's temporary file")
	assert.FileExists(t, aliveOld, "its process is alive")
	assert.FileExists(t, other, "not ours")
	assert.Empty(t, log.Warns())
}

// TestTextfileChild is the second process of
// TestTwoProcessesWithOneLocalRankDoNotCollide; on its own it is skipped.
func TestTextfileChild(t *testing.T) {
	dir := os.Getenv("METRICS_TEXTFILE_CHILD_DIR")
	if dir == "" {
		t.Skip("only runs re-executed by TestTwoProcessesWithOneLocalRankDoNotCollide")
	}
	setEnv(t, map[string]string{"NCCL_GO_METRICS_TEXTFILE_DIR": dir})
	newTestDevice(t, "socket", 0)
	Start(&recLogger{}, testInfo)
	fmt.Println("child-ready")
	_, _ = io.Copy(io.Discard, os.Stdin) // until the parent is done reading
	Stop()
}

// Two processes with the same local rank (a launcher that sets none, two
// jobs on a node, one pod per GPU sharing the directory) write two files
// whose series differ, as node_exporter requires: it refuses series that
// another file already exposed.
func TestTwoProcessesWithOneLocalRankDoNotCollide(t *testing.T) {
	stopAll(t)
	dir := t.TempDir()
	setEnv(t, map[string]string{"NCCL_GO_METRICS_TEXTFILE_DIR": dir})
	newTestDevice(t, "socket", 0)
	Start(&recLogger{}, testInfo)
	defer Stop()

	exe, err := os.Executable()
	require.NoError(t, err)
	child := exec.Command(exe, "-test.run=^TestTextfileChild$", "-test.count=1")
	child.Env = append(os.Environ(), "METRICS_TEXTFILE_CHILD_DIR="+dir)
	stdin, err := child.StdinPipe()
	require.NoError(t, err)
	out, err := child.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, child.Start())
	defer func() { _ = stdin.Close(); _ = child.Wait() }()
	ready := bufio.NewScanner(out)
	for ready.Scan() && ready.Text() != "child-ready" {
	}

	files, err := filepath.Glob(filepath.Join(dir, "ncclnet_go_rank0_pid*.prom"))
	require.NoError(t, err)
	require.Len(t, files, 2, "one file per process")
	seen := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, mf := range parseText(t, bytes.NewReader(b)) {
			for _, m := range mf.GetMetric() {
				labels := make([]string, 0, len(m.GetLabel()))
				for _, l := range m.GetLabel() {
					labels = append(labels, l.GetName()+"="+l.GetValue())
				}
				sort.Strings(labels)
				key := mf.GetName() + "{" + strings.Join(labels, ",") + "}"
				if other, dup := seen[key]; dup && other != f {
					t.Fatalf("%s is in both %s and %s: node_exporter would drop one", key, filepath.Base(other), filepath.Base(f))
				}
				seen[key] = f
			}
		}
	}
}

// A child forked from the host process (a DataLoader worker) must not keep
// the endpoint's port: while it did, a restarted rank could not bind it, and
// the kernel accepted scrapes that nobody served.
func TestForkedChildDropsTheEndpoint(t *testing.T) {
	stopAll(t)
	port := freePort(t)
	setEnv(t, map[string]string{"NCCL_GO_METRICS_PORT": strconv.Itoa(port), "LOCAL_RANK": "0"})
	Start(&recLogger{}, testInfo)
	defer Stop()
	client, err := net.Dial("tcp", currentExporter(t).addr)
	require.NoError(t, err)
	defer client.Close()

	// This process's descriptors whose local port is the endpoint's: the
	// listener and, once the server accepted it, the client's connection.
	ours := func() []int {
		var fds []int
		ents, err := os.ReadDir("/proc/self/fd")
		require.NoError(t, err)
		for _, e := range ents {
			fd, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if sa, err := unix.Getsockname(fd); err == nil {
				if in4, ok := sa.(*unix.SockaddrInet4); ok && in4.Port == port {
					fds = append(fds, fd)
				}
			}
		}
		return fds
	}
	var fds []int
	for deadline := time.Now().Add(5 * time.Second); len(fds) < 2 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		fds = ours()
	}
	require.Len(t, fds, 2, "the listener and the accepted connection")
	open, err := forkguard.OpenInChild(fds)
	require.NoError(t, err)
	assert.Equal(t, []bool{false, false}, open)
}

// Every series carries the NCCL job, so that an alert compares a rank with
// its own job's ranks when one scrape job covers a whole cluster.
func TestJobLabelOnEverySeries(t *testing.T) {
	stopAll(t)
	long := strings.Repeat("j", maxJobLabel+1)
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string // "" : no nccl_job label at all
		warn string
	}{
		{"NCCL_GO_METRICS_JOB wins", map[string]string{"NCCL_GO_METRICS_JOB": "train-7", "SLURM_JOB_ID": "1234"}, "train-7", ""},
		{"SLURM_JOB_ID", map[string]string{"SLURM_JOB_ID": "1234", "PBS_JOBID": "9.pbs"}, "1234", ""},
		{"PBS_JOBID", map[string]string{"PBS_JOBID": "9.pbs", "LSB_JOBID": "5"}, "9.pbs", ""},
		{"LSB_JOBID", map[string]string{"LSB_JOBID": "5"}, "5", ""},
		{"FLUX_JOB_ID", map[string]string{"FLUX_JOB_ID": "f2Ks"}, "f2Ks", ""},
		{"torchrun's rdzv id", map[string]string{"TORCHELASTIC_RUN_ID": "exp3"}, "exp3", ""},
		{"torchrun's default rdzv id is no job", map[string]string{"TORCHELASTIC_RUN_ID": "none"}, "", ""},
		{"none set", map[string]string{}, "", ""},
		{"too long falls through", map[string]string{"NCCL_GO_METRICS_JOB": long, "SLURM_JOB_ID": "77"}, "77", "ignoring NCCL_GO_METRICS_JOB for the nccl_job label"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.env["NCCL_GO_METRICS_PORT"] = strconv.Itoa(freePort(t))
			setEnv(t, tc.env)
			log := &recLogger{}
			Start(log, testInfo)
			defer Stop()
			dev := newTestDevice(t, "socket", 1)
			dev.ConnOpened(Send)
			defer dev.ConnClosed(Send)
			mfs := scrape(t, currentExporter(t).addr)
			require.NotEmpty(t, mfs)
			for _, mf := range mfs {
				for _, m := range mf.GetMetric() {
					got, has := "", false
					for _, l := range m.GetLabel() {
						if l.GetName() == "nccl_job" {
							got, has = l.GetValue(), true
						}
					}
					assert.Equal(t, tc.want != "", has, "%s: nccl_job present", mf.GetName())
					assert.Equal(t, tc.want, got, mf.GetName())
				}
			}
			if tc.warn == "" {
				assert.Empty(t, log.Warns())
			} else {
				require.Len(t, log.Warns(), 1)
				assert.Contains(t, log.Warns()[0], tc.warn)
			}
		})
	}
}

// `ncclnet-go env` reports a job id the plugin skips, as the plugin reads it.
func TestJobCheckAgreesWithJob(t *testing.T) {
	for _, name := range []string{"NCCL_GO_METRICS_JOB", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"} {
		v, ok := ncclenv.Check(name, strings.Repeat("j", maxJobLabel+1))
		require.True(t, ok, name)
		assert.True(t, v.Invalid, "%s: %+v", name, v)
		assert.Contains(t, v.Why, "the plugin skips it")
		v, ok = ncclenv.Check(name, "4711")
		require.True(t, ok, name)
		assert.True(t, v.OK(), "%s: %+v", name, v)
		assert.Equal(t, "4711", v.Used)
	}
	v, _ := ncclenv.Check("NCCL_GO_METRICS_JOB", "\xff\xfe")
	assert.True(t, v.Invalid, "not UTF-8: %+v", v)
}

// gatherer returns the plugin's registry between Start and the last Stop (nil
// otherwise), whether or not an endpoint or textfile is configured.
func gatherer() prometheus.Gatherer {
	state.Lock()
	defer state.Unlock()
	if state.exp == nil {
		return nil
	}
	return state.exp.reg
}

// A textfile directory that never took a write (mounted read-only into the
// container, say) leaves no file behind, so the last Stop has nothing to
// remove. It used to try anyway and, where the removal failed with another
// error than "does not exist" (EROFS on a read-only mount, ENOTDIR here),
// WARN that node_exporter "will keep exporting its stale values", of a file
// that never existed.
func TestTextfileNeverWrittenIsNotReportedStale(t *testing.T) {
	dir := t.TempDir()
	notDir := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(notDir, nil, 0o644))
	log := &recLogger{}
	e := &exporter{log: log, treg: newRegistry(testInfo, 0, nil), textfile: filepath.Join(notDir, "x.prom"), interval: time.Hour,
		stop: make(chan struct{}), done: make(chan struct{})}
	go e.textfileLoop(!e.writeTextfile(false))
	e.close()
	require.Len(t, log.Warns(), 1, "%q", log.Warns())
	assert.Contains(t, log.Warns()[0], "cannot write "+e.textfile)

	// Once a write succeeded, a failed removal is still reported.
	log = &recLogger{}
	sub := filepath.Join(dir, "sub")
	require.NoError(t, os.Mkdir(sub, 0o755))
	e = &exporter{log: log, treg: newRegistry(testInfo, 0, nil), textfile: filepath.Join(sub, "x.prom"), interval: time.Hour,
		stop: make(chan struct{}), done: make(chan struct{})}
	go e.textfileLoop(!e.writeTextfile(false))
	require.FileExists(t, e.textfile)
	require.NoError(t, os.Remove(e.textfile))
	require.NoError(t, os.Mkdir(e.textfile, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(e.textfile, "keep"), nil, 0o644))
	e.close()
	require.Len(t, log.Warns(), 1, "%q", log.Warns())
	assert.Contains(t, log.Warns()[0], "cannot remove "+e.textfile)
}
