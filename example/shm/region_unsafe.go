package shm

import (
	"sync/atomic"
	"unsafe"
)

// hdr gives typed, atomic access to the shared header. Every shared word is
// read and written atomically: the peer is another process, so only the
// hardware's ordering of these operations (not the Go memory model) orders the
// plain payload copies around them.
type hdr struct{ base unsafe.Pointer }

func newHdr(mem []byte) hdr { return hdr{base: unsafe.Pointer(&mem[0])} }

func (h hdr) u64(off int) *atomic.Uint64 { return (*atomic.Uint64)(unsafe.Add(h.base, off)) }
func (h hdr) u32(off int) *atomic.Uint32 { return (*atomic.Uint32)(unsafe.Add(h.base, off)) }

// bytes views n header bytes at off (nonce and proofs).
func (h hdr) bytes(off, n int) []byte { return unsafe.Slice((*byte)(unsafe.Add(h.base, off)), n) }

func (h hdr) side(s, field int) int { return offSides + s*sideSize + field }

func ctsOff(slot int, field int) int { return offCTS + slot*ctsSlotSize + field }

func descOff(i int, field int) int { return offDesc + i*descSize + field }

// userBytes views n bytes at p+off of a buffer NCCL owns (host memory).
func userBytes(p unsafe.Pointer, off, n int) []byte {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Add(p, off)), n)
}
