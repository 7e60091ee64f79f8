package nccltest

import (
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// buffer is test memory outside the Go heap, as NCCL's buffers are (host
// memory from cudaHostAlloc/malloc, or GPU memory): a transport may hand its
// address to C, register whole pages of it with a NIC, and have the NIC
// write it at any time; the Go runtime never moves, reuses or scans it, and
// the race detector's checkptr has nothing to object to.
type buffer struct {
	b    []byte // the bytes the test uses
	m    []byte // the whole mapping (a page at least, so a 0-byte buffer has an address)
	mh   nccl.MemHandle
	comm nccl.Comm // the comm mh belongs to; nil when not registered
}

// ptr is the address NCCL would pass: the buffer's first byte.
func (b *buffer) ptr() unsafe.Pointer { return unsafe.Pointer(&b.m[0]) }

// poolKey names registered buffers of one size on one comm: NCCL keeps its
// registered buffers and reuses them, so the suite does too, instead of
// registering (pinning) every message's memory afresh.
type poolKey struct {
	comm nccl.Comm
	size int
}

// buffer maps n bytes and, with Options.Register, registers them on c as
// NCCL's proxy does for an RDMA transport (c may be nil for memory the body
// registers itself), or reuses a registered buffer of the same size that
// its request finished with. It stays mapped until the subtest's end (or
// free, when not registered).
func (h *subtest) buffer(c nccl.Comm, n int) *buffer {
	size := (max(n, 1) + unix.Getpagesize() - 1) &^ (unix.Getpagesize() - 1)
	reg := c != nil && h.suite.opts.Register
	if reg {
		h.mu.Lock()
		k := poolKey{c, size}
		if p := h.pool[k]; len(p) > 0 {
			b := p[len(p)-1]
			h.pool[k] = p[:len(p)-1]
			h.mu.Unlock()
			b.b = b.m[:n]
			return b
		}
		h.mu.Unlock()
	}
	m, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		h.fatalf("mmap of %d bytes for a test buffer: %v", n, err)
	}
	b := &buffer{b: m[:n], m: m}
	h.mu.Lock()
	if h.live == nil {
		h.live = map[*buffer]struct{}{}
	}
	h.live[b] = struct{}{}
	h.mu.Unlock()
	if !reg {
		return b
	}
	var mh nccl.MemHandle
	h.call("RegMr", func() { mh, err = c.RegMr(b.ptr(), len(m), nccl.PtrHost) })
	h.noError(err, "RegMr of a %d-byte test buffer (Options.Register)", len(m))
	b.mh, b.comm = mh, c
	return b
}

// dereg releases the buffer's registration, if any.
func (h *subtest) dereg(b *buffer) {
	if b.comm == nil {
		return
	}
	var err error
	h.call("DeregMr", func() { err = b.comm.DeregMr(b.mh) })
	if err != nil {
		h.errorf("DeregMr of a test buffer: %v (%v)", err, nccl.ResultOf(err))
	}
	b.comm, b.mh = nil, 0
}

// free gives back a buffer the transport is done with (its request
// completed): a registered one goes to its comm's pool, any other is
// unmapped.
func (h *subtest) free(b *buffer) {
	if b == nil {
		return
	}
	h.mu.Lock()
	if b.comm != nil {
		if h.pool == nil {
			h.pool = map[poolKey][]*buffer{}
		}
		k := poolKey{b.comm, len(b.m)}
		h.pool[k] = append(h.pool[k], b)
		h.mu.Unlock()
		return
	}
	_, live := h.live[b]
	delete(h.live, b)
	h.mu.Unlock()
	if live {
		_ = unix.Munmap(b.m)
	}
}

// deregOn releases every registration on c, before c is closed (NCCL
// deregisters before it closes); the memory stays mapped until the
// subtest ends, since requests may still be in flight.
func (h *subtest) deregOn(c nccl.Comm) {
	h.mu.Lock()
	var bs []*buffer
	for b := range h.live {
		if b.comm == c {
			bs = append(bs, b)
		}
	}
	for k := range h.pool {
		if k.comm == c {
			delete(h.pool, k)
		}
	}
	h.mu.Unlock()
	for _, b := range bs {
		h.dereg(b)
	}
}

// freeAll unmaps what is left when the subtest ends, after its comms closed
// (a body abandoned after a hang keeps its memory: the transport may still
// be inside a call on it).
func (h *subtest) freeAll() {
	h.mu.Lock()
	live := h.live
	h.live = nil
	abandoned := h.abandoned
	h.mu.Unlock()
	if abandoned {
		return
	}
	for b := range live {
		h.dereg(b)
		_ = unix.Munmap(b.m)
	}
}
