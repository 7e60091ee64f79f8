// Package nccltest is a conformance suite for nccl.Transport implementations.
// It owns the executable form of the contract NCCL's proxy relies on, so that
// every transport of this project (socket, ib, the shared-memory example) and
// every vendor transport is held to the same rules without a GPU, NCCL, or the
// C glue:
//
//	func TestConformance(t *testing.T) {
//		nccltest.Run(t, func() nccl.Transport { return myfabric.New() }, nccltest.Options{})
//	}
//
// The suite runs in-process on host memory. It drives connection set-up the way
// NCCL's GDR probe and bootstrap do: listen, connect and accept alternately from
// one goroutine, so a transport whose Connect waits for Accept (or the reverse)
// deadlocks and is reported as a hang, naming the call it was stuck in. The data
// path is also driven from a single goroutine that polls every request, as
// NCCL's progress thread does, so an Isend, Irecv or Test that blocks is caught
// the same way. Every subtest runs under a deadline; a hang is a failure, never a
// stuck `go test`.
//
// What is checked: device properties within NCCL's limits; non-blocking set-up;
// 0-byte messages and sizes up to Options.MaxSize with patterned data compared
// byte by byte; a receive larger than the send reporting the real size; a send
// larger than the posted receive failing with nccl.InvalidUsage with nothing
// written past the receive buffer (guard bytes), in single and grouped
// receives; grouped receives of up to MaxRecvs buffers where the sender's tag
// picks the buffer (distinct tags and the equal tags NCCL really passes), also
// with each send tested before the next is posted; FIFO matching; 32 receives
// and 32×MaxRecvs sends in flight; thousands of messages and hundreds of
// grouped receives over one comm (requests recycled); both directions and
// several comms at once; Test with nil sizes; RegMr/DeregMr (including
// DeregMr(0)) racing the data path; concurrent connection set-up; Close with
// requests outstanding returning promptly and leaving the closed comm's
// buffers alone; a second transport made and initialised after the first was
// finalized (as the glue does for NCCL's next communicator); and no goroutine
// left once Finalize returned. A completed send's buffer is overwritten at
// once, as NCCL reuses it; Irecv's bufs slice is overwritten as soon as the
// call returns, as the glue reuses its own; a request id handed out again
// before Test reported it done or failed is a failure; and so is a data-path
// call (Isend, Irecv, Test) over 5 s, or most calls of one kind taking 1 ms or
// more in a subtest that made at least 100 of them (a wait that does not
// deadlock the suite is still a stall in NCCL).
//
// Buffers are memory outside the Go heap (mmap), handed over as the address of
// their first byte, the way NCCL hands over C or GPU memory: a transport may
// give it to a NIC or to C. Each stays mapped until the transport reports its
// request complete or the comm is closed. With Options.Register the suite
// registers every buffer (RegMr) before posting it and deregisters it after,
// as NCCL's proxy does for RDMA transports.
package nccltest
