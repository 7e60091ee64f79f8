// Package verbs is the seam between the IB transport and an RDMA provider: a
// small Go interface over the ibverbs objects the transport uses (device
// context, protection domain, memory region, completion queue, RC queue pair)
// plus the constants and value types that cross it.
//
// Two providers implement it: package ibv, which drives the real libibverbs
// (loaded with dlopen, so hosts without rdma-core still load the plugin), and
// package softnic, an in-process software NIC that honours RC semantics so the
// whole protocol can be unit-tested without RDMA hardware.
//
// The data-path methods (QP.PostSend, QP.PostRecv, CQ.Poll) take slices so one
// call (one cgo crossing in the real provider) posts a chain of work requests
// or reaps many completions; implementations must not allocate in them.
package verbs
