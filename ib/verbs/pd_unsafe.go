package verbs

import "unsafe"

// PD is a protection domain. All comms on a device share one, so an MR
// registered once is valid for every QP of the device.
//
// RegMR registers [addr, addr+length), which must contain ptr. Real providers
// register addr (page-rounded by the caller's cache); the software NIC reaches
// the memory through ptr, which points into the caller's buffer, so no
// pointer is ever formed outside the object it belongs to.
type PD interface {
	RegMR(ptr unsafe.Pointer, addr uint64, length int, access Access) (MR, error)
	// RegDMABufMR registers length bytes at offset in dma-buf fd, addressed as
	// iova by remote peers and local SGEs.
	RegDMABufMR(offset uint64, length int, iova uint64, fd int, access Access) (MR, error)
	CreateQP(attr QPInitAttr) (QP, error)
	Dealloc() error
}
