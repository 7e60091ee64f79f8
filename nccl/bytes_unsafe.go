package nccl

import "unsafe"

// HostBytes views n bytes of host memory at p (memory NCCL owns, never the Go
// heap) as a byte slice. Only for PtrHost buffers: device memory must never be
// touched from the CPU.
func HostBytes(p unsafe.Pointer, n int) []byte {
	if n == 0 || p == nil {
		return nil
	}
	return unsafe.Slice((*byte)(p), n)
}
