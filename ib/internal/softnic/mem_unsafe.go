package softnic

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
)

// mr is a registered region: [addr, addr+length) in the address space peers
// and SGEs use (the virtual address, or the iova of a dma-buf registration),
// backed by host memory at base.
type mr struct {
	pd       *pd
	base     unsafe.Pointer // points into the registered memory at baseAddr
	baseAddr uint64
	addr     uint64
	length   uint64
	access   verbs.Access
	key      uint32
	mapping  []byte // dma-buf registrations: our mmap of the buffer
	gone     bool
}

// LKey and RKey are only read once, right after registration, by the
// transport; reading them from a deregistered MR is a use-after-free.
func (m *mr) LKey() uint32 { return m.keyOf("mr->lkey") }
func (m *mr) RKey() uint32 { return m.keyOf("mr->rkey") }

func (m *mr) keyOf(what string) uint32 {
	f := m.pd.ctx.dev.fabric
	f.mu.Lock()
	defer f.mu.Unlock()
	if m.gone {
		_ = f.violationLocked("%s of a deregistered MR on %s", what, m.pd.ctx.dev.cfg.Name)
	}
	return m.key
}

// containingLocked finds a live MR of pd covering [addr, addr+n): inline
// sends carry no lkey, but the model still needs a view of the memory.
func (d *Device) containingLocked(p *pd, addr uint64, n uint32) *mr {
	for _, m := range d.mrs {
		if m.pd == p && m.contains(addr, n) {
			return m
		}
	}
	return nil
}

func (m *mr) contains(addr uint64, n uint32) bool {
	end := addr + uint64(n)
	return end >= addr && addr >= m.addr && end <= m.addr+m.length
}

// bytes views n registered bytes at addr; callers have checked contains.
func (m *mr) bytes(addr uint64, n uint32) []byte {
	return unsafe.Slice((*byte)(unsafe.Add(m.base, int64(addr-m.baseAddr))), n)
}

func (p *pd) RegMR(ptr unsafe.Pointer, addr uint64, length int, access verbs.Access) (verbs.MR, error) {
	at := uint64(uintptr(ptr))
	if ptr == nil || length <= 0 || at < addr || at >= addr+uint64(length) {
		return nil, fmt.Errorf("softnic: reg_mr(%#x, %d) via %p: %w", addr, length, ptr, verbs.EINVAL)
	}
	return p.register(&mr{base: ptr, baseAddr: at, addr: addr, length: uint64(length), access: access})
}

// RegDMABufMR maps the dma-buf (any mmap-able fd, e.g. a memfd, in tests) and
// registers the mapping at iova.
func (p *pd) RegDMABufMR(offset uint64, length int, iova uint64, fd int, access verbs.Access) (verbs.MR, error) {
	f := p.ctx.dev.fabric
	f.mu.Lock()
	err := p.aliveLocked("ibv_reg_dmabuf_mr")
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if !p.ctx.dmabuf {
		return nil, fmt.Errorf("softnic: reg_dmabuf_mr: %w", verbs.EOPNOTSUPP)
	}
	if fd < 0 {
		return nil, fmt.Errorf("softnic: reg_dmabuf_mr(fd %d): %w", fd, verbs.EBADF)
	}
	if length <= 0 {
		return nil, fmt.Errorf("softnic: reg_dmabuf_mr(len %d): %w", length, verbs.EINVAL)
	}
	page := uint64(os.Getpagesize())
	skip := offset % page
	mapping, err := unix.Mmap(fd, int64(offset-skip), int(skip)+length, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		if err == unix.EBADF {
			return nil, fmt.Errorf("softnic: reg_dmabuf_mr(fd %d): %w", fd, verbs.EBADF)
		}
		return nil, fmt.Errorf("softnic: reg_dmabuf_mr: mmap: %v: %w", err, verbs.EINVAL)
	}
	m := &mr{base: unsafe.Pointer(&mapping[skip]), baseAddr: iova, addr: iova, length: uint64(length), access: access, mapping: mapping}
	out, err := p.register(m)
	if err != nil {
		_ = unix.Munmap(mapping)
	}
	return out, err
}

func (p *pd) register(m *mr) (verbs.MR, error) {
	// Hardware refuses remote write/atomic without local write.
	if m.access&(verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic) != 0 && m.access&verbs.AccessLocalWrite == 0 {
		return nil, fmt.Errorf("softnic: remote write access needs local write: %w", verbs.EINVAL)
	}
	f := p.ctx.dev.fabric
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := p.aliveLocked("ibv_reg_mr"); err != nil {
		return nil, err
	}
	if err := f.callFaultLocked(p.ctx.dev.cfg.Name, "ibv_reg_mr"); err != nil {
		return nil, err
	}
	f.nextKey += 0x101 // keys look random-ish and are never 0
	m.pd, m.key = p, f.nextKey
	p.ctx.dev.mrs[m.key] = m
	return m, nil
}

func (m *mr) Dereg() error {
	f := m.pd.ctx.dev.fabric
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := m.pd.ctx.aliveLocked("ibv_dereg_mr"); err != nil {
		return err
	}
	if m.gone {
		return f.violationLocked("ibv_dereg_mr of an MR already deregistered on %s", m.pd.ctx.dev.cfg.Name)
	}
	m.gone = true
	delete(m.pd.ctx.dev.mrs, m.key)
	if m.mapping != nil {
		_ = unix.Munmap(m.mapping)
		m.mapping = nil
	}
	return nil
}
