package nccl_test

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// exampleTransport stands in for a real fabric in these examples.
type exampleTransport struct{ nccl.Transport }

func (exampleTransport) Name() string { return "examplefabric" }

// A transport registers itself from an init function of its plugin's main
// package; the glue tries registrations in ascending priority and uses the
// first whose Init finds a device (NCCL_GO_TRANSPORT=<name> forces one).
func ExampleRegister() {
	nccl.Register("examplefabric", 20, func() nccl.Transport { return exampleTransport{} })

	reg, ok := nccl.Lookup("examplefabric")
	fmt.Println(ok, reg.Name, reg.Priority, reg.New().Name())

	// Registering a name twice is a programming error, caught at load.
	defer func() { fmt.Println("panic:", recover()) }()
	nccl.Register("examplefabric", 30, func() nccl.Transport { return exampleTransport{} })
	// Output:
	// true examplefabric 20 examplefabric
	// panic: nccl: transport "examplefabric" registered twice
}

// A transport reads its settings through an Env carrying its log prefix, at
// set-up time (Init, Listen, Connect). Values come from the installed lookup
// (the glue installs C getenv, because NCCL applies nccl.conf with setenv after
// the library is loaded). Integers are read as NCCL reads them (decimal, 0x
// hex, 0-prefixed octal); a malformed value is a WARN naming the variable, and
// the default is used.
func ExampleEnv() {
	env := map[string]string{
		"NCCL_MYFABRIC_QPS":     "0x10",
		"NCCL_MYFABRIC_RETRY":   "ten",
		"NCCL_MYFABRIC_ENABLE":  "yes",
		"NCCL_MYFABRIC_TIMEOUT": "1.5",
		"NCCL_MYFABRIC_LINGER":  "250ms",
		"NCCL_MYFABRIC_IFACE":   "  ib0 ",
		"NCCL_MYFABRIC_DEPTH":   "4096",
	}
	nccl.SetEnvLookup(func(name string) (string, bool) { v, ok := env[name]; return v, ok })
	defer nccl.SetEnvLookup(nil) // back to the process environment

	settings := nccl.Env{Log: &nccl.WriterLogger{W: os.Stdout}, Prefix: "NET/MyFabric"}
	fmt.Println(settings.Int("NCCL_MYFABRIC_QPS", 4))
	fmt.Println(settings.Int("NCCL_MYFABRIC_RETRY", 7))
	fmt.Println(settings.Int("NCCL_MYFABRIC_UNSET", 7))
	fmt.Println(settings.IntIn("NCCL_MYFABRIC_DEPTH", 128, 1, 1024))
	fmt.Println(settings.Bool("NCCL_MYFABRIC_ENABLE", false))
	fmt.Println(settings.Duration("NCCL_MYFABRIC_TIMEOUT", time.Second, time.Second))
	fmt.Println(settings.Duration("NCCL_MYFABRIC_LINGER", 0, time.Second))
	fmt.Printf("%q\n", settings.String("NCCL_MYFABRIC_IFACE", "eth0"))
	// Output:
	// 16
	// WARN NET/MyFabric : ignoring NCCL_MYFABRIC_RETRY=ten: "ten" is not an integer (decimal, 0x hex or 0-prefixed octal); using the default 7
	// 7
	// 7
	// WARN NET/MyFabric : ignoring NCCL_MYFABRIC_DEPTH=4096: must be in [1, 1024]; using the default 128
	// 128
	// true
	// 1.5s
	// 250ms
	// "ib0"
}

// Errors carry the ncclResult_t the glue returns to NCCL; anything else counts
// as ncclInternalError.
func ExampleErrorf() {
	err := nccl.Errorf(nccl.InvalidUsage, "NET/MyFabric : message truncated: %d bytes into a %d-byte buffer", 4096, 1024)
	fmt.Println(err)
	fmt.Println(nccl.ResultOf(err))

	var ne *nccl.Error
	fmt.Println(errors.As(fmt.Errorf("isend: %w", err), &ne), ne.Code)

	fmt.Println(nccl.ResultOf(errors.New("a plain error")))
	fmt.Println(nccl.ResultOf(nil))
	// Output:
	// NET/MyFabric : message truncated: 4096 bytes into a 1024-byte buffer
	// ncclInvalidUsage
	// true ncclInvalidUsage
	// ncclInternalError
	// ncclSuccess
}

// Init wraps ErrNoDevice when the host lacks the fabric: the glue then tries
// the next registered transport with an INFO line instead of a WARN.
func ExampleErrNoDevice() {
	err := fmt.Errorf("%w: no port is ACTIVE (set NCCL_MYFABRIC_PORT)", nccl.ErrNoDevice)
	fmt.Println(errors.Is(err, nccl.ErrNoDevice), nccl.ResultOf(err))
	fmt.Println(err)
	// Output:
	// true ncclSystemError
	// no usable device: no port is ACTIVE (set NCCL_MYFABRIC_PORT)
}

// Rail and plane ids are optional: the zero value is "undefined", which the
// glue reports to NCCL as -1, so a transport without rails sets nothing.
func ExampleOptionalID() {
	var p nccl.Properties
	fmt.Println(p.RailID, p.PlaneID)
	p.RailID, p.PlaneID = nccl.KnownID(0), nccl.KnownID(1)
	rail, ok := p.RailID.Get()
	fmt.Println(rail, ok, p.PlaneID)
	// Output:
	// undefined undefined
	// 0 true 1
}
