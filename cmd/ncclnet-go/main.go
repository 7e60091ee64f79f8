// Command ncclnet-go is the operator's tool for libnccl-net-go. It answers the
// questions people deploying an NCCL net plugin ask, with the same Go
// packages the plugin loads:
//
//	ncclnet-go devices    what the plugin would expose on this host, and why
//	ncclnet-go env        every NCCL_* / NCCL_GO_* setting the plugin reads, its value and source
//	ncclnet-go selftest   a verified two-process transfer through the installed library's C ABI
//	ncclnet-go top        per-device throughput, in-flight requests, errors and stalls of running ranks
//
// Errors are one line on stderr; exit status 0 means success, 1 a failed
// check or operation, 2 bad usage, 128 + the signal's number (130 SIGINT,
// 143 SIGTERM) a selftest or a top --once stopped by a signal.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/libnccl-net-go/libnccl-net-go/ib"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
	"github.com/libnccl-net-go/libnccl-net-go/socket"
)

// version is set by the build (-ldflags -X main.version=...) to the plugin's
// release, so that both come from plugin/version.go.
var version = "dev"

// The same transports, in the same order, as the library
// (cmd/libnccl-net-go); a test keeps the two lists equal.
func init() {
	nccl.Register("ib", 10, ib.New)
	nccl.Register("socket", 100, socket.New)
}

type command struct {
	name    string
	summary string
	run     func(c *cli, args []string) error
}

var commands = []command{
	{"devices", "what the plugin would expose on this host, and why", runDevices},
	{"env", "every NCCL_* / NCCL_GO_* setting the plugin reads: value, default, source", runEnv},
	{"selftest", "two-process transfer through the installed library, every byte verified", runSelftest},
	{"top", "per-device throughput, in-flight requests, errors and stalls of running ranks", runTop},
}

// cli carries the streams and process facts a subcommand needs, so tests run
// subcommands in-process.
type cli struct {
	stdout, stderr io.Writer
	// exe is this program's path (to find the selftest helper).
	exe string
	// interrupt, when non-nil, is closed at the first SIGINT or SIGTERM:
	// it ends long-running subcommands (top, selftest). signal then says
	// which signal it was.
	interrupt <-chan struct{}
	signal    func() os.Signal
}

// received is the signal that closed cli.interrupt (SIGINT when unknown).
func (c *cli) received() os.Signal {
	if c.signal != nil {
		if s := c.signal(); s != nil {
			return s
		}
	}
	return os.Interrupt
}

// usageError is bad usage: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// failure is a check that ran and failed (devices: no usable transport,
// selftest: FAIL): exit status 1 with the message already printed.
type failure struct{ msg string }

func (e failure) Error() string { return e.msg }

// interrupted is a subcommand stopped by a signal (selftest, top --once): exit status
// 128 + the signal's number, the shell's convention, with the message
// already printed.
type interrupted struct{ sig os.Signal }

func (e interrupted) Error() string { return "interrupted by " + signalName(e.sig) }

func signalName(s os.Signal) string {
	switch s {
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return s.String()
}

// signalStatus is the exit status for a signal: 128 + its number.
func signalStatus(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return 128 + int(n)
	}
	return 130
}

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

func main() {
	if os.Getenv("GOTRACEBACK") == "" {
		// A crash prints its message, not every goroutine's stack.
		debug.SetTraceback("none")
	}
	exe, _ := os.Executable()
	interrupt := make(chan struct{})
	var first atomic.Value
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		first.Store(<-sig)
		close(interrupt)
		s := <-sig
		// A second signal does not wait for the subcommand to stop; its
		// helper processes do not outlive it either.
		killHelpers()
		os.Exit(signalStatus(s))
	}()
	received := func() os.Signal { s, _ := first.Load().(os.Signal); return s }
	os.Exit(run(os.Args[1:], &cli{stdout: os.Stdout, stderr: os.Stderr, exe: exe, interrupt: interrupt, signal: received}))
}

func run(args []string, c *cli) (status int) {
	defer func() {
		if p := recover(); p != nil {
			fmt.Fprintf(c.stderr, "ncclnet-go: internal error: %v (please report it)\n", p)
			status = 1
		}
	}()
	if len(args) == 0 {
		printUsage(c.stderr)
		return 2
	}
	switch args[0] {
	case "-h", "--help", "help":
		if len(args) > 1 && args[0] == "help" {
			return run([]string{args[1], "--help"}, c)
		}
		printUsage(c.stdout)
		return 0
	case "--version", "version":
		fmt.Fprintf(c.stdout, "ncclnet-go %s\n", version)
		return 0
	}
	for _, cmd := range commands {
		if cmd.name != args[0] {
			continue
		}
		err := cmd.run(c, args[1:])
		var ue usageError
		var fe failure
		var ie interrupted
		switch {
		case err == nil:
			return 0
		case errors.As(err, &ie):
			return signalStatus(ie.sig)
		case errors.As(err, &ue):
			if ue.msg != "" {
				fmt.Fprintf(c.stderr, "ncclnet-go %s: %s (see ncclnet-go %s --help)\n", cmd.name, ue.msg, cmd.name)
			}
			return 2
		case errors.As(err, &fe):
			if fe.msg != "" {
				fmt.Fprintf(c.stderr, "ncclnet-go %s: %s\n", cmd.name, fe.msg)
			}
			return 1
		case errors.Is(err, errHelpShown):
			return 0
		default:
			fmt.Fprintf(c.stderr, "ncclnet-go %s: %s\n", cmd.name, oneLine(err.Error()))
			return 1
		}
	}
	fmt.Fprintf(c.stderr, "ncclnet-go: unknown command %q; commands: %s (ncclnet-go --help)\n", args[0], commandNames())
	return 2
}

func commandNames() string {
	var n []string
	for _, c := range commands {
		n = append(n, c.name)
	}
	return strings.Join(n, ", ")
}

func printUsage(w io.Writer) {
	fmt.Fprintf(w, "ncclnet-go %s: operator's tool for libnccl-net-go, the NCCL net plugin written in Go\n\n", version)
	fmt.Fprintf(w, "usage: ncclnet-go COMMAND [flags]\n\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\n  ncclnet-go COMMAND --help   flags of one command\n  ncclnet-go --version\n")
	fmt.Fprintf(w, "\nExit status: 0 success, 1 a failed check, 2 bad usage, 128 + the signal's number\n(130 SIGINT, 143 SIGTERM) a selftest stopped by a signal, or a top --once stopped before its table.\n")
}

// printJSON writes v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// oneLine keeps an error message on one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
