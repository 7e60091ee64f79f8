// Package ncclenv owns NCCL's settings grammar and the registry of every
// setting the plugin reads.
//
// Grammar. NCCL reads its variables with a handful of C idioms: strtoll(…, 0)
// for integers (decimal, 0x hex, 0-prefixed octal), strtoull for
// NCCL_SOCKET_MAGIC, exact strcmp for address families, and parseStringList /
// matchIfList for interface and HCA lists ("^" excludes, "=" makes names
// exact, entries are prefixes with optional ":port[:rail[:plane]]"). The
// Parse* functions and List implement exactly that, so a value means the same
// to the plugin as to NCCL's own transports and bootstrap; where the plugin
// deliberately differs (it trims values, WARNs where NCCL is silent, accepts
// true/false words and Go durations) docs/configuration.md says so.
//
// Registry. Every variable is declared once, in the config.go of the package
// that owns it, through a Group:
//
//	var env = ncclenv.NewGroup("socket", "NET/GoSocket")
//
//	var (
//		inline  = env.Int("NCCL_SOCKET_INLINE", 16384, "messages up to this size go inline on the control stream").In(0, 1<<20)
//		timeout = env.Duration("NCCL_GO_SOCKET_HELLO_TIMEOUT", 10*time.Second, time.Second, "how long a new connection may stay silent")
//	)
//
// and read at set-up time (Init, Listen, Connect), never on the data path:
//
//	n := inline.Get(log)
//
// A malformed or out-of-range value is a WARN through the given logger, with
// the group's log prefix, naming the variable, what was wrong and the value
// used instead. Variables several transports read (NCCL_SOCKET_IFNAME,
// NCCL_GO_TIMEOUT, ...) are declared by the internal package that owns their
// meaning and read with GetFor, which takes the reading transport's prefix.
//
// All lists every declared setting (name, default, one-line doc, owner) for
// `ncclnet-go env` and for the test that keeps docs/configuration.md complete;
// Undeclared finds NCCL_GO_* names nobody declared (typos).
//
// Values are read through Lookup, which the plugin glue points at C getenv:
// NCCL applies nccl.conf with setenv after the Go runtime copied the
// environment, so os.Getenv would miss those values.
package ncclenv
