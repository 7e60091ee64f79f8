package shm

import (
	"fmt"
	"time"
	"unsafe"

	"github.com/libnccl-net-go/libnccl-net-go/internal/reqpool"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// endpoint is what both comm directions share: the mapping, the peer watch
// and a sticky error (a dead peer or a corrupt header ends the comm).
type endpoint struct {
	r    *region
	log  nccl.Logger
	side int
	w    peerWatch
	err  error
	peer string
	mask uint64 // ringSize-1
}

func newEndpoint(r *region, log nccl.Logger, side int, w peerWatch) endpoint {
	return endpoint{r: r, log: log, side: side, w: w, mask: r.ringSize - 1,
		peer: fmt.Sprintf("pid %d (shm %s)", w.pid, r.path)}
}

// PeerAddr implements nccl.PeerAddresser for the glue's WARNs.
func (e *endpoint) PeerAddr() string { return e.peer }

// RegMr implements nccl.Comm. Copies go through the CPU, so any host memory
// works as is and there is nothing to pin; the handle only has to be non-zero.
func (e *endpoint) RegMr(_ unsafe.Pointer, _ int, ptrType nccl.PtrType) (nccl.MemHandle, error) {
	if ptrType != nccl.PtrHost {
		return 0, nccl.Errorf(nccl.InvalidArgument, "NET/GoShm : cannot register memory of type %d; shm copies with the CPU and supports host memory only (set NCCL_NET_GDR_LEVEL=LOC)", ptrType)
	}
	return 1, nil
}

// DeregMr implements nccl.Comm.
func (e *endpoint) DeregMr(nccl.MemHandle) error { return nil }

// Close implements nccl.Comm: mark our end closed for the peer, unmap, return.
// Nothing waits for the peer; outstanding requests are simply forgotten.
func (e *endpoint) Close() error {
	if e.r == nil {
		return nil
	}
	e.r.h.u32(e.r.h.side(e.side, sideClose)).Store(1)
	e.r.release() // after the flag: the peer must see "closed", not "died"
	e.r = nil
	return nil
}

func (e *endpoint) closedErr() error {
	return nccl.Errorf(nccl.InternalError, "NET/GoShm : comm used after close")
}

func newSendComm(r *region, w peerWatch, log nccl.Logger) *sendComm {
	return &sendComm{endpoint: newEndpoint(r, log, sideSend, w), reqs: reqpool.New[sendReq](descCap)}
}

func newRecvComm(r *region, log nccl.Logger, timeout time.Duration) *recvComm {
	return &recvComm{endpoint: newEndpoint(r, log, sideRecv, newPeerWatch(r, sideSend, timeout))}
}

// Iflush implements nccl.RecvComm: data lands in host memory through the CPU,
// so there is never anything to flush.
func (c *recvComm) Iflush([]nccl.RecvBuffer) (nccl.Request, error) { return nccl.NoRequest, nil }
