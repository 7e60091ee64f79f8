// Package nccl is the Go side of the NCCL network-plugin contract: result codes,
// properties, the interfaces a transport implements, and the registry the plugin
// glue picks transports from.
//
// It owns the *semantics* NCCL expects (non-blocking connection set-up, FIFO
// request matching, request limits, truncation rules) expressed in Go types, and
// nothing of the C ABI: package plugin translates between NCCL's C tables and
// these interfaces. The package is free of cgo so that fabric vendors can write
// and unit-test a transport without a C toolchain.
//
// A transport reads its settings with an Env carrying its log prefix, logs
// through the Logger of its InitContext, and reports rail and plane ids as
// OptionalID values whose zero value is "undefined". docs/extending.md lists
// the whole public surface; this repository's internal packages are not part
// of it.
//
// A transport is registered from an init function:
//
//	func init() { nccl.Register("myfabric", 10, func() nccl.Transport { return New() }) }
//
// and built into a loadable library with the plugin glue (see docs/extending.md).
//
// The C headers in include/ declare the NCCL net API v8 to v12 for the glue; they
// were written for this project from the facts in the NCCL net API reference.
package nccl
