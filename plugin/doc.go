// Package plugin is the only code that knows NCCL's C ABI. It defines the
// exported tables ncclNetPlugin_v8 … ncclNetPlugin_v12 (tables.c), adapts every
// API version onto one Go implementation, and drives the transport chosen from
// the nccl registry.
//
// What it guarantees to transports (see docs/extending.md):
//   - comms, requests and memory handles cross into C as integer slots, never Go
//     pointers; a stale or forged handle is rejected with ncclInvalidArgument;
//   - NCCL's arguments are checked once, at the boundary: a grouped receive has
//     1 to MaxRecvs buffers, every size is 0 to nccl.MaxNetSize, a buffer
//     (isend's too) is NULL only for 0 bytes, and a registration never wraps
//     past the end of the address space;
//   - the glue numbers the requests NCCL sees; a transport's request ids may be
//     any non-negative int32, and a comm with every request slot in flight
//     answers NULL (NCCL retries);
//   - every exported entry recovers panics into ncclInternalError with a WARN;
//   - real initialisation runs once however many communicators call init (v11+
//     refcount with finalize; v10 and older tolerate init again), and Finalize
//     never runs while another thread is inside the transport or a comm is open;
//   - Close runs on NCCL's calling thread, to the end (transports bound it);
//   - every request is counted per device in package metrics, stalled requests
//     are reported, and NCCL's profiler (v10+) sees start/stop of each request.
//
// Import it for its side effects from a main package built with
// -buildmode=c-shared (scripts/build-plugin.sh does it).
package plugin
