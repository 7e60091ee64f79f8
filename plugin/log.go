package plugin

import (
	"fmt"
	"os"
	"strings"
	"sync/atomic"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// NCCL log levels (ncclDebugLogLevel).
const (
	levelWarn  = 2
	levelInfo  = 3
	levelTrace = 5
)

// sink delivers one preformatted line to NCCL's logger. The cgo layer installs
// one that calls the ncclDebugLogger_t NCCL gave init; before init (or in Go
// tests) lines go to stderr (WARN only).
type sink interface {
	log(level int, flags uint64, msg string)
}

type stderrSink struct{}

func (stderrSink) log(level int, _ uint64, msg string) {
	if level == levelWarn {
		fmt.Fprintf(os.Stderr, "NCCL WARN %s\n", msg)
	}
}

var currentSink atomic.Pointer[sink]

func setSink(s sink) { currentSink.Store(&s) }

func getSink() sink {
	if p := currentSink.Load(); p != nil {
		return *p
	}
	return stderrSink{}
}

// maxLevel caches NCCL_DEBUG so that INFO/TRACE arguments are not formatted when
// NCCL would drop them anyway (NCCL filters inside its logger, after we paid for
// Sprintf).
var maxLevel atomic.Int32

func readDebugLevel() {
	lvl := int32(levelWarn)
	switch strings.ToUpper(settingDebug.Get()) {
	case "INFO":
		lvl = levelInfo
	case "TRACE":
		lvl = levelTrace
	case "VERSION", "NONE", "":
		lvl = levelWarn // WARNs always reach NCCL; it decides
	}
	maxLevel.Store(lvl)
}

// logger is the nccl.Logger handed to transports.
type logger struct{}

var log nccl.Logger = logger{}

func (logger) Warnf(format string, args ...any) {
	getSink().log(levelWarn, uint64(nccl.SubsysAll), fmt.Sprintf(format, args...))
}

func (logger) Infof(sub nccl.Subsys, format string, args ...any) {
	if maxLevel.Load() < levelInfo {
		return
	}
	getSink().log(levelInfo, uint64(sub), fmt.Sprintf(format, args...))
}

func (logger) Tracef(sub nccl.Subsys, format string, args ...any) {
	if maxLevel.Load() < levelTrace {
		return
	}
	getSink().log(levelTrace, uint64(sub), fmt.Sprintf(format, args...))
}
