package ib

import (
	"unsafe"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// The nccl.Comm methods that take a pointer: they only turn it into the
// address the NIC uses. The memory is NCCL's (C or GPU memory, or off-heap
// in tests), never Go's.

func (s *sendComm) Isend(data unsafe.Pointer, size int, tag int, mh nccl.MemHandle) (nccl.Request, error) {
	return s.isend(uint64(uintptr(data)), size, tag, mh)
}

func (s *sendComm) RegMr(data unsafe.Pointer, size int, t nccl.PtrType) (nccl.MemHandle, error) {
	return s.regMr(data, size, t)
}

func (s *sendComm) RegMrDMABuf(data unsafe.Pointer, size int, t nccl.PtrType, off uint64, fd int) (nccl.MemHandle, error) {
	return s.regMrDMABuf(data, size, t, off, fd)
}

func (c *recvComm) RegMr(data unsafe.Pointer, size int, t nccl.PtrType) (nccl.MemHandle, error) {
	return c.regMr(data, size, t)
}

func (c *recvComm) RegMrDMABuf(data unsafe.Pointer, size int, t nccl.PtrType, off uint64, fd int) (nccl.MemHandle, error) {
	return c.regMrDMABuf(data, size, t, off, fd)
}
