// Package myfabric is the starting point for a new transport: a skeleton that
// builds into a loadable NCCL net plugin (see docs/extending.md, "Start from
// the template"). It reports one device so that NCCL can load and inspect the
// library; every connection and data call answers "not implemented" until you
// fill it in. Rename the package, then replace each TODO.
package myfabric
