package nccl

import (
	"fmt"
	"io"
	"os"
	"sync"
)

// Subsys is NCCL's debug subsystem mask (NCCL_DEBUG_SUBSYS).
type Subsys uint64

// Subsystems, with NCCL's NCCL_DEBUG_SUBSYS bit values.
const (
	SubsysInit      Subsys = 0x1
	SubsysP2P       Subsys = 0x4
	SubsysNet       Subsys = 0x10
	SubsysEnv       Subsys = 0x80
	SubsysProxy     Subsys = 0x400
	SubsysBootstrap Subsys = 0x1000
	SubsysReg       Subsys = 0x2000
	SubsysProfile   Subsys = 0x4000
	SubsysAll       Subsys = ^Subsys(0)
)

// Logger writes through NCCL's logger, so messages obey NCCL_DEBUG and
// NCCL_DEBUG_SUBSYS and land where the user already looks. The glue provides it;
// a WARN should say what was wrong and what to set.
type Logger interface {
	// Warnf logs at NCCL's WARN level, which NCCL prints by default.
	Warnf(format string, args ...any)
	// Infof logs at INFO level for subsystems sub (NCCL_DEBUG=INFO).
	Infof(sub Subsys, format string, args ...any)
	// Tracef logs at TRACE level (NCCL_DEBUG=TRACE, debug builds of NCCL).
	Tracef(sub Subsys, format string, args ...any)
}

// WriterLogger is a Logger for tests and tools that prints "LEVEL [Prefix] msg"
// lines to W. Trace lines are dropped unless Trace is set.
type WriterLogger struct {
	mu     sync.Mutex
	W      io.Writer // where lines go
	Prefix string    // after the level, when not empty
	Trace  bool      // print Tracef lines too
}

// NewStderrLogger returns a WriterLogger on standard error.
func NewStderrLogger(prefix string) *WriterLogger {
	return &WriterLogger{W: os.Stderr, Prefix: prefix}
}

func (l *WriterLogger) printf(level, format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Prefix == "" {
		fmt.Fprintf(l.W, "%s %s\n", level, fmt.Sprintf(format, args...))
		return
	}
	fmt.Fprintf(l.W, "%s %s %s\n", level, l.Prefix, fmt.Sprintf(format, args...))
}

// Warnf prints a "WARN" line.
func (l *WriterLogger) Warnf(format string, args ...any) { l.printf("WARN", format, args...) }

// Infof prints an "INFO" line, whatever sub.
func (l *WriterLogger) Infof(_ Subsys, format string, args ...any) {
	l.printf("INFO", format, args...)
}

// Tracef prints a "TRACE" line when Trace is set.
func (l *WriterLogger) Tracef(_ Subsys, format string, args ...any) {
	if l.Trace {
		l.printf("TRACE", format, args...)
	}
}

// DiscardLogger drops everything.
type DiscardLogger struct{}

// Warnf drops the line.
func (DiscardLogger) Warnf(string, ...any) {}

// Infof drops the line.
func (DiscardLogger) Infof(Subsys, string, ...any) {}

// Tracef drops the line.
func (DiscardLogger) Tracef(Subsys, string, ...any) {}
