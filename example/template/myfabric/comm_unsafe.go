package myfabric

import (
	"unsafe"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// The comm types a real transport returns from Accept and Connect. They are
// here so the shape of the data path is visible from the start.
type sendComm struct{}

var _ nccl.SendComm = (*sendComm)(nil)

func (*sendComm) RegMr(unsafe.Pointer, int, nccl.PtrType) (nccl.MemHandle, error) { return 0, errTODO }
func (*sendComm) DeregMr(nccl.MemHandle) error                                    { return nil }
func (*sendComm) Close() error                                                    { return nil }

// Isend must not block, allocate or lock: NoRequest means "retry later".
func (*sendComm) Isend(unsafe.Pointer, int, int, nccl.MemHandle) (nccl.Request, error) {
	return nccl.NoRequest, errTODO
}
func (*sendComm) Test(nccl.Request) (bool, int, error) { return false, 0, errTODO }

type recvComm struct{}

var _ nccl.RecvComm = (*recvComm)(nil)

func (*recvComm) RegMr(unsafe.Pointer, int, nccl.PtrType) (nccl.MemHandle, error) { return 0, errTODO }
func (*recvComm) DeregMr(nccl.MemHandle) error                                    { return nil }
func (*recvComm) Close() error                                                    { return nil }
func (*recvComm) Irecv([]nccl.RecvBuffer) (nccl.Request, error)                   { return nccl.NoRequest, errTODO }
func (*recvComm) Iflush([]nccl.RecvBuffer) (nccl.Request, error)                  { return nccl.NoRequest, nil }
func (*recvComm) Test(nccl.Request, []int) (bool, error)                          { return false, errTODO }
