package nccl

import "unsafe"

// The data-path half of the contract: it passes raw memory (NCCL's buffers,
// host or device), so it lives in this file, the package's only user of unsafe.

// Comm is what send and receive comms share: memory registration and close.
//
// RegMr/DeregMr may run on NCCL's service thread while the progress thread is
// inside Isend/Irecv/Test on the same comm, so they must be safe against that.
type Comm interface {
	// RegMr registers [data, data+size) of memory kind ptrType.
	RegMr(data unsafe.Pointer, size int, ptrType PtrType) (MemHandle, error)
	// DeregMr releases a registration. mh may be zero (NCCL deregisters failed
	// registrations too), which must succeed. NCCL frees memory as soon as
	// the last registration covering it is released, before it closes the
	// comm, and after an abort with requests on it still outstanding
	// (net.cc's recvProxyFree: deregMr, free, closeRecv): from then on
	// nothing of the transport (no goroutine, no NIC) may write or read it. A
	// request whose memory went away may fail. nccltest's DeregMrFence checks
	// it.
	DeregMr(mh MemHandle) error
	// Close releases the comm. Requests may still be outstanding (ncclCommAbort):
	// Close must return promptly without waiting for the peer and leak nothing.
	// It runs on NCCL's thread, and any memory still registered may be freed
	// as soon as it returns, so the glue waits for it: every wait inside must
	// end within NCCL_GO_TIMEOUT, and nothing may touch the buffers after.
	Close() error
}

// DMABufRegistrar is implemented by comms that can register dma-buf memory.
// NCCL closes fd as soon as the call returns: keep a dup if it is needed later.
type DMABufRegistrar interface {
	RegMrDMABuf(data unsafe.Pointer, size int, ptrType PtrType, offset uint64, fd int) (MemHandle, error)
}

// SendComm is the sending end of a connection. Isend and Test are called from
// one NCCL progress thread, in a tight polling loop: they must not block,
// allocate, or take locks shared with other comms.
type SendComm interface {
	Comm
	// Isend posts a send of size bytes (0 to MaxNetSize). It returns NoRequest
	// when the send cannot start yet (no credit from the receiver, no free slot);
	// NCCL retries later. Sends match receives in FIFO order; tag only selects
	// the buffer inside a grouped receive. A transport must accept MaxRequests ×
	// MaxRecvs outstanding sends.
	Isend(data unsafe.Pointer, size int, tag int, mh MemHandle) (Request, error)
	// Test reports whether r is complete and, if so, how many bytes were sent.
	// After done == true NCCL never tests r again and the transport may reuse it;
	// NCCL also reuses data at once, so the transport must have finished reading
	// it. r must not be handed out again before then.
	Test(r Request) (done bool, size int, err error)
}

// RecvComm is the receiving end of a connection. Irecv, Iflush and Test follow
// the same rules as SendComm's data path.
type RecvComm interface {
	Comm
	// Irecv posts a grouped receive of len(bufs) buffers (1 to MaxRecvs, each
	// 0 to MaxNetSize bytes: the glue has checked both). Each incoming send
	// goes to a free buffer with its tag in the oldest posted receive that
	// still has a free buffer. If that receive has no buffer with its tag, the
	// send may be for a later receive (PXN's shared comms, GPU-direct
	// transports only): wait with NoRequest, as NCCL's IB transport does; a
	// transport without GPU-direct may instead fail with InvalidUsage on the
	// side that can tell (docs/extending.md). A send larger than its buffer fails with
	// InvalidUsage and nothing is written past the buffer. bufs is only valid
	// during the call (the glue reuses the slice): copy it; the memory it
	// points to is the transport's until Test reports r done or failed.
	Irecv(bufs []RecvBuffer) (Request, error)
	// Iflush makes GPU-direct received data visible to the GPU. bufs[i].Size is
	// the received size. It returns NoRequest only when nothing needs to be
	// done: NCCL counts a NULL flush request as complete, so a flush that
	// cannot start now (no free slot) must return an error, never NoRequest.
	// bufs is only valid during the call.
	Iflush(bufs []RecvBuffer) (Request, error)
	// Test reports whether r is complete; when done, sizes[i] receives the bytes
	// actually received into buffer i (sizes has one entry per buffer, or is nil
	// for flush requests and when NCCL passed no array).
	Test(r Request, sizes []int) (done bool, err error)
}

// RecvBuffer is one buffer of a (possibly grouped) receive. For Iflush, Size is
// the number of bytes actually received into the buffer.
type RecvBuffer struct {
	Data unsafe.Pointer // host memory, or device memory for PtrCUDA registrations
	Size int            // capacity in bytes (for Iflush: bytes received)
	Tag  int            // the tag a send must carry to land here (NCCL passes the sender's rank)
	MH   MemHandle      // RegMr's handle for memory covering Data, or 0 when NCCL gave none
}

// HostBytes views n bytes of host memory at p (memory NCCL owns, never the Go
// heap) as a byte slice. Only for PtrHost buffers: device memory must never be
// touched from the CPU.
func HostBytes(p unsafe.Pointer, n int) []byte {
	if n == 0 || p == nil {
		return nil
	}
	return unsafe.Slice((*byte)(p), n)
}
