package metrics

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/libnccl-net-go/libnccl-net-go/forkguard"
	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Settings (declared in config.go), read at Start: NCCL applies nccl.conf with
// setenv after the library is loaded.
const (
	envPort        = "NCCL_GO_METRICS_PORT"
	envBind        = "NCCL_GO_METRICS_BIND"
	envLocalRank   = "NCCL_GO_METRICS_LOCAL_RANK"
	envTextfileDir = "NCCL_GO_METRICS_TEXTFILE_DIR"
	envInterval    = "NCCL_GO_METRICS_INTERVAL"
	envJob         = "NCCL_GO_METRICS_JOB"

	// maxJobLabel bounds the nccl_job value: a job id, not a document.
	maxJobLabel = 128

	defaultBind     = "127.0.0.1"
	defaultInterval = 15 * time.Second
	// minInterval keeps a typo such as NCCL_GO_METRICS_INTERVAL=0.001 from
	// turning the writer into a busy loop.
	minInterval = 100 * time.Millisecond
	// minStaleAge is how long another process's textfile must have gone
	// unwritten before we delete it as stale.
	minStaleAge = 2 * time.Minute
	// shutdownWait bounds how long Stop waits for a scrape in progress. A
	// scrape reads atomics and is done in well under a millisecond; what
	// outlasts this is a client that connected and sent no (or half a)
	// request, a port probe or a stuck scraper, and the glue's finalize,
	// which holds its lock over Stop, must not wait on that.
	shutdownWait = 100 * time.Millisecond
)

// exporter is one Start..Stop lifetime of the exposition.
type exporter struct {
	log       nccl.Logger
	reg       *prometheus.Registry
	info      Info
	localRank int
	rankSet   bool   // localRank came from a variable, not the default 0
	job       string // nccl_job label; "" for none

	server   *http.Server
	addr     string // actual listen address, for logs and tests
	serveErr chan error

	textfile string               // full path of our .prom file; "" when off
	treg     *prometheus.Registry // what it holds: reg's series, labelled with ProcessID
	interval time.Duration
	stop     chan struct{}
	done     chan struct{}
	// wrote is set once a write of textfile succeeded: only then is there a
	// file for close to remove (a directory that never took one, read-only
	// say, is not left holding stale values).
	wrote atomic.Bool
}

var state struct {
	sync.Mutex
	refs int
	exp  *exporter
}

// Start begins exposing the metrics as configured by the environment. NCCL may
// init and finalize the plugin several times per process, so Start and Stop are
// reference counted: the first Start sets up the endpoint and textfile writer,
// later ones only count, and the matching last Stop tears them down. Failing to
// expose (port in use, unwritable directory) is a WARN, never an error: the
// plugin must keep moving data without its metrics endpoint.
func Start(log nccl.Logger, info Info) {
	if log == nil {
		log = nccl.DiscardLogger{}
	}
	state.Lock()
	defer state.Unlock()
	state.refs++
	if state.refs > 1 {
		return
	}
	state.exp = startExporter(log, info)
}

// Stop undoes one Start. The last one closes the endpoint, writes nothing more
// and removes the textfile (a file left behind would show a dead process's
// counters as current). Stop without a matching Start does nothing.
func Stop() {
	state.Lock()
	defer state.Unlock()
	if state.refs == 0 {
		return
	}
	state.refs--
	if state.refs > 0 {
		return
	}
	if state.exp != nil {
		state.exp.close()
		state.exp = nil
	}
}

// LocalRank is this process's rank on its node as the metrics see it:
// NCCL_GO_METRICS_LOCAL_RANK, else the launcher's variable, else 0.
func LocalRank(log nccl.Logger) int {
	r, _ := localRank(log)
	return r
}

// localRank is LocalRank; found is false when no variable gave a rank and 0
// is the default.
func localRank(log nccl.Logger) (rank int, found bool) {
	if log == nil {
		log = nccl.DiscardLogger{}
	}
	for _, v := range settingLocalRank {
		if r, set := envNonNegative(log, v.Name(), fmt.Sprintf("set %s to this process's rank on the node", envLocalRank)); set && r >= 0 {
			return r, true
		}
	}
	return 0, false
}

// Job is the NCCL job this process belongs to, for the nccl_job label:
// NCCL_GO_METRICS_JOB, else the batch system's job id, else "" (no label).
// The label is what lets one alert compare a rank with the other ranks of its
// own job when one Prometheus scrape job (or node_exporter, in textfile mode)
// covers every NCCL job of a cluster.
func Job(log nccl.Logger) string {
	if log == nil {
		log = nccl.DiscardLogger{}
	}
	for _, v := range settingJob {
		j := v.Get()
		if j == "" || (v.Name() == "TORCHELASTIC_RUN_ID" && j == "none") {
			continue
		}
		if !usableJobID(j) {
			log.Warnf("NET/Go : metrics: ignoring %s for the nccl_job label: not UTF-8 of at most %d bytes; set %s to the job's id", v.Name(), maxJobLabel, envJob)
			continue
		}
		return j
	}
	return ""
}

// BindAddress is NCCL_GO_METRICS_BIND (default 127.0.0.1), for tools that
// find this host's endpoints the way Start opens them.
func BindAddress() string {
	if b := settingBind.Get(); b != "" {
		return b
	}
	return defaultBind
}

// parseNonNegative reads v as an integer >= 0 (NCCL's integer grammar);
// partial is set when text after the number was ignored.
func parseNonNegative(v string) (n int64, partial error, ok bool) {
	n, err := ncclenv.ParseInt(v)
	if ncclenv.ReadInPart(err) {
		partial, err = err, nil
	}
	return n, partial, err == nil && n >= 0 && n <= 1<<31
}

// envNonNegative reads name as an integer >= 0. set reports whether it has a
// value at all; a value that is not such an integer gets a WARN (with hint)
// and n = -1.
func envNonNegative(log nccl.Logger, name, hint string) (n int, set bool) {
	v, ok := ncclenv.Value(name)
	if !ok {
		return -1, false
	}
	n64, partial, ok := parseNonNegative(v)
	if partial != nil {
		log.Warnf("NET/Go : metrics: reading %s=%q as %d: %v", name, v, n64, partial)
	}
	if !ok {
		log.Warnf("NET/Go : metrics: ignoring %s=%q: expected an integer >= 0; %s", name, v, hint)
		return -1, true
	}
	return int(n64), true
}

// checkNonNegative is envNonNegative's reading as a registry check (what
// `ncclnet-go env` shows); instead is what a refused value leaves.
func checkNonNegative(v, instead string) (int, ncclenv.Verdict) {
	n64, partial, ok := parseNonNegative(v)
	switch {
	case !ok:
		return -1, ncclenv.Verdict{Used: "none", Invalid: true, Why: "expected an integer >= 0; " + instead}
	case partial != nil:
		return int(n64), ncclenv.Verdict{Used: strconv.FormatInt(n64, 10), InPart: true, Why: fmt.Sprintf("%v; the plugin uses %d", partial, n64)}
	}
	return int(n64), ncclenv.Verdict{Used: strconv.FormatInt(n64, 10)}
}

// checkPort is the base port's reading (envNonNegative's, then listen's rule
// for local rank 0) as a registry check.
func checkPort(v string) ncclenv.Verdict {
	const none = "; the plugin serves no metrics endpoint"
	n, err := ncclenv.ParseInt(v)
	switch {
	case err != nil && !ncclenv.ReadInPart(err):
		return ncclenv.Verdict{Used: "none", Invalid: true, Why: err.Error() + none}
	case basePortProblem(n, 0) != "":
		return ncclenv.Verdict{Used: "none", Invalid: true, Why: basePortProblem(n, 0) + none}
	case err != nil:
		return ncclenv.Verdict{Used: strconv.FormatInt(n, 10), InPart: true, Why: fmt.Sprintf("%v; the plugin uses %d", err, n)}
	}
	return ncclenv.Verdict{Used: strconv.FormatInt(n, 10)}
}

// basePortProblem is the one rule for the base port, shared by listen and
// `ncclnet-go env`: "" when base + rank is a port, else what is wrong and
// what to set, to follow "NCCL_GO_METRICS_PORT=".
func basePortProblem(base int64, rank int) string {
	if base < 1 {
		// Not "gives port <rank>, outside 1..65535": with local rank 1
		// that port would be in range, and the message would contradict
		// itself.
		return fmt.Sprintf("%d is not a port; set %s to a base port in 1..65535 (each rank serves base + its local rank)",
			base, envPort)
	}
	if port := base + int64(rank); port > 65535 {
		return fmt.Sprintf("%d + local rank %d gives port %d, outside 1..65535; set %s to a base port such that base + local rank is valid",
			base, rank, port, envPort)
	}
	return ""
}

// usableJobID is the rule a job id meets to become the nccl_job label.
func usableJobID(j string) bool { return len(j) <= maxJobLabel && utf8.ValidString(j) }

// checkJob is Job's rule for one job-id variable as a registry check.
func checkJob(v string) ncclenv.Verdict {
	if !usableJobID(v) {
		return ncclenv.Verdict{Used: "none", Invalid: true,
			Why: fmt.Sprintf("not UTF-8 of at most %d bytes; the plugin skips it (the next job-id variable, else no nccl_job label)", maxJobLabel)}
	}
	return ncclenv.Verdict{Used: v}
}

func init() {
	ncclenv.SetCheck(envPort, checkPort)
	for _, v := range settingJob {
		ncclenv.SetCheck(v.Name(), checkJob)
	}
	for _, v := range settingLocalRank {
		ncclenv.SetCheck(v.Name(), func(raw string) ncclenv.Verdict {
			_, vd := checkNonNegative(raw, "the plugin skips it (the next local-rank variable, else 0)")
			return vd
		})
	}
}

func startExporter(log nccl.Logger, info Info) *exporter {
	// Off by default: without either variable nothing listens and nothing is
	// written; the registry still exists for Gatherer.
	port, _ := envNonNegative(log, settingPort.Name(), "no metrics endpoint")
	dir := settingTextfileDir.Get()
	rankLog := log
	if port < 0 && dir == "" {
		rankLog = nccl.DiscardLogger{} // a launcher's odd LOCAL_RANK is no concern then
	}
	rank, rankSet := localRank(rankLog)
	job := Job(rankLog)
	e := &exporter{log: log, reg: newRegistry(info, rank, jobLabels(job)), info: info, localRank: rank, rankSet: rankSet, job: job}
	if port >= 0 {
		e.listen(int64(port), settingBind.Get())
	}
	if dir != "" {
		e.startTextfile(dir)
	}
	return e
}

func (e *exporter) listen(base int64, bind string) {
	if p := basePortProblem(base, e.localRank); p != "" {
		e.log.Warnf("NET/Go : metrics: %s=%s; continuing without the metrics endpoint", envPort, p)
		return
	}
	port := base + int64(e.localRank)
	addr := net.JoinHostPort(bind, strconv.FormatInt(port, 10))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		hint := fmt.Sprintf("set %s to a free base port (the port used is base + local rank)", envPort)
		switch {
		case !errors.Is(err, syscall.EADDRINUSE):
			hint += fmt.Sprintf(" or %s to a local address", envBind)
		case !e.rankSet:
			// Every process of the node that finds no local-rank
			// variable takes rank 0 and so the same port: another base
			// collides again.
			names := make([]string, len(settingLocalRank))
			for i, v := range settingLocalRank {
				names[i] = v.Name()
			}
			hint = fmt.Sprintf("no local-rank variable is set (%s), so every process of this node uses local rank 0: set %s to this process's rank on the node, or %s",
				strings.Join(names, ", "), envLocalRank, hint)
		}
		e.log.Warnf("NET/Go : metrics: cannot listen on %s (%s=%d + local rank %d): %v; %s; continuing without the metrics endpoint",
			addr, envPort, base, e.localRank, err, hint)
		return
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{
		ErrorLog:      promLogger{e.log},
		ErrorHandling: promhttp.ContinueOnError,
		// A stuck scraper must not hold goroutines and sockets forever.
		Timeout: 10 * time.Second,
	}))
	e.server = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       60 * time.Second,
	}
	e.addr = ln.Addr().String()
	e.serveErr = make(chan error, 1)
	// The port must be free again when this rank dies, even if it forked
	// children (forkguard).
	go func() { e.serveErr <- e.server.Serve(forkguard.Listener(ln)) }()
	e.log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/Go : metrics: serving http://%s/metrics (local rank %d)", e.addr, e.localRank)
}

// TextfileName is the file a process writes in NCCL_GO_METRICS_TEXTFILE_DIR:
// the rank says which GPU's process wrote it, the process ID (ProcessID) keeps
// apart processes that share a rank, which pids alone do not across
// containers sharing the directory. No hostname: the directory is per node.
func TextfileName(localRank int, processID string) string {
	return fmt.Sprintf("ncclnet_go_rank%d_pid%s.prom", localRank, processID)
}

// ProcessID names this process in textfile mode: its pid and 32 random bits,
// fixed for the life of the process. Every series of its file carries it as
// the label process, so the files of two processes with the same local rank
// (a launcher that sets none, two jobs on one node, one pod per GPU) never
// hold the same series, which node_exporter would refuse.
func ProcessID() string {
	processID.once.Do(func() {
		var b [4]byte
		_, _ = rand.Read(b[:])
		processID.id = fmt.Sprintf("%d-%x", os.Getpid(), b)
	})
	return processID.id
}

var processID struct {
	once sync.Once
	id   string
}

func (e *exporter) startTextfile(dir string) {
	e.interval = settingInterval.Get(e.log)
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		if err == nil {
			err = errors.New("not a directory")
		}
		e.log.Warnf("NET/Go : metrics: %s=%s: %v; set it to an existing directory that node_exporter's textfile collector reads; no metrics file will be written",
			envTextfileDir, dir, err)
		return
	}
	e.textfile = filepath.Join(dir, TextfileName(e.localRank, ProcessID()))
	e.removeStaleTextfiles(dir)
	e.treg = prometheus.NewRegistry()
	labels := jobLabels(e.job)
	labels["process"] = ProcessID()
	prometheus.WrapRegistererWith(labels, e.treg).MustRegister(newCollector(e.info, e.localRank, Devices))
	e.stop = make(chan struct{})
	e.done = make(chan struct{})
	failing := !e.writeTextfile(false)
	go e.textfileLoop(failing)
	e.log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/Go : metrics: writing %s every %v", e.textfile, e.interval)
}

// removeStaleTextfiles deletes files left by processes that died without a
// final Stop (a crash, a kill, or NCCL before net API v11, which never
// finalizes a plugin): node_exporter would otherwise export their last values
// as current forever. A file counts as stale only if its pid is gone AND it
// has not been rewritten for staleAge, because a directory shared between pid
// namespaces (containers) can hold live files whose pid means nothing here.
func (e *exporter) removeStaleTextfiles(dir string) {
	staleAge := 3 * e.interval
	if staleAge < minStaleAge {
		staleAge = minStaleAge
	}
	// Also the temporary files a write leaves when its process dies inside
	// it (WriteToTextfile's <name>.prom<random>, which node_exporter ignores
	// but which would pile up).
	matches, _ := filepath.Glob(filepath.Join(dir, "ncclnet_go_rank*_pid*.prom*"))
	for _, path := range matches {
		var rank, pid int
		// Older files end in _pid<P>.prom, ours in _pid<P>-<hex>.prom.
		if n, _ := fmt.Sscanf(filepath.Base(path), "ncclnet_go_rank%d_pid%d", &rank, &pid); n != 2 || path == e.textfile {
			continue
		}
		if pid > 0 && !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			continue // alive, or not ours to judge (EPERM)
		}
		st, err := os.Stat(path)
		if err != nil || time.Since(st.ModTime()) < staleAge {
			continue
		}
		if err := os.Remove(path); err == nil {
			e.log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/Go : metrics: removed %s left by exited process %d", path, pid)
		}
	}
}

func (e *exporter) textfileLoop(failing bool) {
	defer close(e.done)
	t := time.NewTicker(e.interval)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
			failing = !e.writeTextfile(failing)
		}
	}
}

// writeTextfile replaces the file atomically: prometheus.WriteToTextfile writes
// a temporary file in the same directory (named without the .prom suffix, so
// the textfile collector ignores it) and renames it over ours, so a reader sees
// the old content or the new, never a partial file. Only the first failure of a
// run of failures is a WARN; a full disk must not flood NCCL's log.
func (e *exporter) writeTextfile(failing bool) bool {
	err := prometheus.WriteToTextfile(e.textfile, e.treg)
	if err == nil {
		e.wrote.Store(true)
	}
	switch {
	case err != nil && !failing:
		e.log.Warnf("NET/Go : metrics: cannot write %s: %v; will retry every %v (check %s)", e.textfile, err, e.interval, envTextfileDir)
	case err == nil && failing:
		e.log.Infof(nccl.SubsysNet, "NET/Go : metrics: writing %s again", e.textfile)
	}
	return err == nil
}

func (e *exporter) close() {
	if e.server != nil {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownWait)
		if err := e.server.Shutdown(ctx); err != nil {
			e.server.Close()
		}
		cancel()
		<-e.serveErr
	}
	if e.stop != nil {
		close(e.stop)
		<-e.done
		if !e.wrote.Load() {
			return // never written: nothing to remove, nothing stale
		}
		if err := os.Remove(e.textfile); err != nil && !os.IsNotExist(err) {
			e.log.Warnf("NET/Go : metrics: cannot remove %s: %v; node_exporter will keep exporting its stale values until it is deleted", e.textfile, err)
		}
	}
}

// promLogger routes promhttp's gathering errors to NCCL's log.
type promLogger struct{ log nccl.Logger }

func (l promLogger) Println(v ...any) {
	l.log.Warnf("NET/Go : metrics: %s", fmt.Sprint(v...))
}
