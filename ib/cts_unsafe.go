package ib

import "unsafe"

// ctsEntry is one clear-to-send FIFO entry (64 bytes, so entries never
// straddle a 32-byte boundary under PCIe relaxed ordering). The receiver
// RDMA-writes n of them (one per buffer of a grouped receive) into the
// sender's FIFO slot; Idx is written last in memory order and tells the
// sender the entry belongs to message Idx-1.
type ctsEntry struct {
	Addr  uint64
	Size  uint64
	RKeys [maxVDevs]uint32 // one per receiver member device
	Tag   uint32
	NReqs uint32
	Idx   uint64
}

// The wire layout is fixed: a build where ctsEntry is not exactly 64 bytes
// fails to compile (one of the two array lengths is negative).
var (
	_ [ctsEntrySize - unsafe.Sizeof(ctsEntry{})]byte
	_ [unsafe.Sizeof(ctsEntry{}) - ctsEntrySize]byte
	_ [-(unsafe.Sizeof(ctsEntry{}) % 32)]byte // a 32-byte multiple
)

// The control blocks live in page-aligned memory outside the Go heap
// (hostMem); these views give them their shape.
type (
	ctsFifo    [maxRequests][maxRecvs]ctsEntry
	sizeRecord [maxRequests][maxRecvs]int32
)

func (m *hostMem) ctsFifo() *ctsFifo       { return (*ctsFifo)(m.ptr()) }
func (m *hostMem) sizeRecord() *sizeRecord { return (*sizeRecord)(m.ptr()) }

var (
	_ [fifoBytes - unsafe.Sizeof(ctsFifo{})]byte
	_ [recordBytes - unsafe.Sizeof(sizeRecord{})]byte
)
