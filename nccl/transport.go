package nccl

import "unsafe"

// Transport is a network fabric: device discovery and connection set-up. The glue
// calls Init once per process (however many communicators or API versions NCCL
// uses) and Finalize when the last user is gone.
//
// Threads: NCCL calls Devices, Properties and Listen/Connect from several
// threads at once (one service thread per communicator), so these must be safe
// for concurrent use.
type Transport interface {
	// Name is the transport's short name ("ib", "socket"), used in logs and in
	// NCCL_GO_TRANSPORT.
	Name() string
	// Init discovers devices. Returning an error wrapping ErrNoDevice makes the
	// glue fall back to the next transport quietly (INFO); any other error is a
	// WARN. Init is never called again after a successful call unless Finalize ran.
	Init(ctx InitContext) error
	// Devices returns the number of devices, virtual devices included. It is > 0
	// after a successful Init.
	Devices() int
	// Properties describes device dev.
	Properties(dev int) (Properties, error)
	// Listen creates a listener on dev and writes everything the connector needs
	// into handle. It must not block.
	Listen(dev int, handle *Handle) (Listener, error)
	// Connect starts or continues connecting to the listener described by handle.
	// It must not block: while the connection is not ready it returns (nil, nil)
	// and NCCL calls it again with the same handle buffer, in which the transport
	// may keep its retry state (bytes the listener wrote are not needed again
	// once read).
	Connect(dev int, handle *Handle, opts ConnectOptions) (SendComm, error)
	// Finalize releases everything Init acquired.
	Finalize() error
}

// InitContext is what the glue hands a transport at Init.
type InitContext struct {
	Log Logger
}

// VDeviceMaker is implemented by transports that can fuse several physical
// devices into one virtual NIC (NCCL's makeVDevice). It returns the new device's
// index; Devices grows by one.
type VDeviceMaker interface {
	MakeVDevice(devs []int) (int, error)
}

// Listener accepts the one connection NCCL expects per listen.
type Listener interface {
	// Accept returns (nil, nil) while no connection is ready. It must not block.
	Accept() (RecvComm, error)
	// Close releases the listener. NCCL calls it right after a successful Accept;
	// an accepted comm stays open.
	Close() error
}

// Comm is what send and receive comms share: memory registration and close.
//
// RegMr/DeregMr may run on NCCL's service thread while the progress thread is
// inside Isend/Irecv/Test on the same comm, so they must be safe against that.
type Comm interface {
	// RegMr registers [data, data+size) of memory kind ptrType.
	RegMr(data unsafe.Pointer, size int, ptrType PtrType) (MemHandle, error)
	// DeregMr releases a registration. mh may be zero (NCCL deregisters failed
	// registrations too), which must succeed.
	DeregMr(mh MemHandle) error
	// Close releases the comm. Requests may still be outstanding (ncclCommAbort):
	// Close must return promptly without waiting for the peer and leak nothing.
	// It runs on NCCL's thread, which frees the comm's buffers as soon as it
	// returns, so the glue waits for it: every wait inside must end within
	// NCCL_GO_TIMEOUT (PeerTimeout), and nothing may touch the buffers after.
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
	// After done == true NCCL never tests r again and the transport may reuse it.
	Test(r Request) (done bool, size int, err error)
}

// RecvComm is the receiving end of a connection. Irecv, Iflush and Test follow
// the same rules as SendComm's data path.
type RecvComm interface {
	Comm
	// Irecv posts a grouped receive of len(bufs) buffers (1 to MaxRecvs, each
	// 0 to MaxNetSize bytes: the glue has checked both). Each incoming send
	// goes to the buffer with its tag inside the oldest posted receive. A send
	// larger than its buffer fails with InvalidUsage and nothing is written
	// past the buffer. bufs is only valid during the call.
	Irecv(bufs []RecvBuffer) (Request, error)
	// Iflush makes GPU-direct received data visible to the GPU. bufs[i].Size is
	// the received size. It returns NoRequest when nothing needs to be done.
	// bufs is only valid during the call.
	Iflush(bufs []RecvBuffer) (Request, error)
	// Test reports whether r is complete; when done, sizes[i] receives the bytes
	// actually received into buffer i (sizes has one entry per buffer, or is nil
	// for flush requests and when NCCL passed no array).
	Test(r Request, sizes []int) (done bool, err error)
}

// PeerAddresser is implemented by comms that know their peer's address; the glue
// names it in WARNs (stalled requests, failures) so users can find the other end.
type PeerAddresser interface {
	PeerAddr() string
}
