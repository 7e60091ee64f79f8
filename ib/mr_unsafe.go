package ib

import (
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

var pageSize = uint64(os.Getpagesize())

// MRStats are one device's registration-cache counters.
type MRStats struct {
	Hits            uint64 // RegMr served by an existing registration
	Misses          uint64 // RegMr that registered a new region
	Deregistrations uint64 // regions released (last reference dropped)
	RegisteredBytes uint64 // bytes currently registered (page-rounded)
}

// MRStatsProvider is what the metrics package type-asserts on a transport to
// export registration-cache counters per NCCL device.
type MRStatsProvider interface {
	MRStats(dev int) (MRStats, bool)
}

type mrCounters struct {
	hits, misses, deregs, bytes atomic.Uint64
}

// MRStats sums the counters of NCCL device dev's member ports.
func (t *Transport) MRStats(dev int) (MRStats, bool) {
	devs, err := t.members(dev)
	if err != nil {
		return MRStats{}, false
	}
	var s MRStats
	for _, d := range devs {
		s.Hits += d.stats.hits.Load()
		s.Misses += d.stats.misses.Load()
		s.Deregistrations += d.stats.deregs.Load()
		s.RegisteredBytes += d.stats.bytes.Load()
	}
	return s, true
}

// mrEntry is one cached registration: a page-rounded range of one device.
type mrEntry struct {
	addr, end uint64
	refs      int
	mr        verbs.MR
}

// mrCache is a device's registration cache (NCCL's per-device MR cache):
// sorted by address, shared by every comm on the device, protected by mu
// because registration runs on NCCL's service thread while other comms'
// progress threads register too.
type mrCache struct {
	mu      sync.Mutex
	entries []*mrEntry
}

func (d *device) mrAccess(t *Transport) verbs.Access {
	a := verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic
	if t.feats.RegIova2 && nccl.EnvInt(t.log, "NCCL_IB_PCI_RELAXED_ORDERING", 2) != 0 {
		a |= verbs.AccessRelaxedOrdering
	}
	return a
}

// acquire returns a registration covering [addr, addr+size), registering the
// page-rounded range on a miss.
func (d *device) acquire(t *Transport, p unsafe.Pointer, size int) (*mrEntry, error) {
	addr := uint64(uintptr(p))
	lo := addr &^ (pageSize - 1)
	hi := (addr + uint64(max(size, 1)) + pageSize - 1) &^ (pageSize - 1)
	c := &d.mrCache
	c.mu.Lock()
	defer c.mu.Unlock()
	i := sort.Search(len(c.entries), func(i int) bool { return c.entries[i].end > lo })
	for j := i; j < len(c.entries) && c.entries[j].addr <= lo; j++ {
		if e := c.entries[j]; e.addr <= lo && e.end >= hi {
			e.refs++
			d.stats.hits.Add(1)
			return e, nil
		}
	}
	mr, err := d.hca.pd.RegMR(p, lo, int(hi-lo), d.mrAccess(t))
	if err != nil {
		return nil, err
	}
	e := &mrEntry{addr: lo, end: hi, refs: 1, mr: mr}
	i = sort.Search(len(c.entries), func(i int) bool { return c.entries[i].addr >= lo })
	c.entries = append(c.entries, nil)
	copy(c.entries[i+1:], c.entries[i:])
	c.entries[i] = e
	d.stats.misses.Add(1)
	d.stats.bytes.Add(hi - lo)
	return e, nil
}

func (d *device) release(e *mrEntry) error {
	c := &d.mrCache
	c.mu.Lock()
	defer c.mu.Unlock()
	e.refs--
	if e.refs > 0 {
		return nil
	}
	for i, x := range c.entries {
		if x == e {
			c.entries = append(c.entries[:i], c.entries[i+1:]...)
			break
		}
	}
	d.stats.deregs.Add(1)
	d.stats.bytes.Add(-(e.end - e.addr))
	return e.mr.Dereg()
}

func (c *mrCache) releaseAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.entries {
		_ = e.mr.Dereg()
	}
	c.entries = nil
}

// mrHandle is what a MemHandle resolves to: one registration per member
// device of the comm's vNIC, and the registered range for bounds checks.
type mrHandle struct {
	lo, hi  uint64
	n       int
	devs    [maxVDevs]*device
	entries [maxVDevs]*mrEntry // cached (RegMr)
	mrs     [maxVDevs]verbs.MR // uncached (RegMrDMABuf)
	lkeys   [maxVDevs]uint32
	rkeys   [maxVDevs]uint32
	fd      int // our dup of a dma-buf fd, -1 otherwise
}

// handles holds every live registration; MemHandle values index it.
var handles table[mrHandle]

func lookupMR(mh nccl.MemHandle) *mrHandle { return handles.get(uint64(mh)) }

// covers reports whether [addr, addr+size) lies inside the registration.
func (h *mrHandle) covers(addr uint64, size int) bool {
	return addr >= h.lo && addr+uint64(size) <= h.hi && addr+uint64(size) >= addr
}

func (c *commCore) regMr(data unsafe.Pointer, size int, ptrType nccl.PtrType) (nccl.MemHandle, error) {
	if data == nil || size < 0 {
		return 0, nccl.Errorf(nccl.InvalidArgument, "NET/GoIB : regMr(%p, %d): bad buffer", data, size)
	}
	if ptrType != nccl.PtrHost && (ptrType != nccl.PtrCUDA || c.ptrSupport&nccl.PtrCUDA == 0) {
		return 0, nccl.Errorf(nccl.InternalError, "NET/GoIB : regMr of memory type %d on %s, which supports %#x; GPU memory needs nvidia-peermem or dma-buf", ptrType, c.name, int(c.ptrSupport))
	}
	h := &mrHandle{n: len(c.devs), fd: -1}
	for i, d := range c.devs {
		e, err := d.acquire(c.t, data, size)
		if err != nil {
			h.n = i
			h.releaseAll()
			return 0, nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_reg_mr(%p, %d bytes) on %s failed: %w; check the locked-memory limit (ulimit -l unlimited)", data, size, d, err)
		}
		h.devs[i], h.entries[i] = d, e
		h.lkeys[i], h.rkeys[i] = e.mr.LKey(), e.mr.RKey()
	}
	h.lo, h.hi = uint64(uintptr(data)), uint64(uintptr(data))+uint64(size)
	return c.publish(h)
}

func (c *commCore) regMrDMABuf(data unsafe.Pointer, size int, ptrType nccl.PtrType, offset uint64, fd int) (nccl.MemHandle, error) {
	if c.ptrSupport&nccl.PtrDMABuf == 0 {
		return 0, nccl.Errorf(nccl.InternalError, "NET/GoIB : %s does not support dma-buf registration; set NCCL_DMABUF_ENABLE=0", c.name)
	}
	if size <= 0 || fd < 0 {
		return 0, nccl.Errorf(nccl.InvalidArgument, "NET/GoIB : regMrDmaBuf(size %d, fd %d): bad arguments", size, fd)
	}
	// NCCL closes fd as soon as we return; keep our own for the MR's life.
	dup, err := unix.Dup(fd)
	if err != nil {
		return 0, nccl.Errorf(nccl.SystemError, "NET/GoIB : dup of dma-buf fd %d: %v", fd, err)
	}
	h := &mrHandle{fd: dup}
	iova := uint64(uintptr(data))
	for i, d := range c.devs {
		mr, err := d.hca.pd.RegDMABufMR(offset, size, iova, dup, d.mrAccess(c.t)&^verbs.AccessRelaxedOrdering)
		if err != nil {
			h.releaseAll()
			return 0, nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_reg_dmabuf_mr(%d bytes) on %s failed: %w; set NCCL_DMABUF_ENABLE=0 to use peer memory instead", size, d, err)
		}
		h.n = i + 1
		h.devs[i], h.mrs[i] = d, mr
		h.lkeys[i], h.rkeys[i] = mr.LKey(), mr.RKey()
		d.stats.misses.Add(1)
		d.stats.bytes.Add(uint64(size))
	}
	h.lo, h.hi = iova, iova+uint64(size)
	return c.publish(h)
}

func (c *commCore) publish(h *mrHandle) (nccl.MemHandle, error) {
	id, ok := handles.add(h)
	if !ok {
		h.releaseAll()
		return 0, nccl.Errorf(nccl.InternalError, "NET/GoIB : too many live registrations")
	}
	return nccl.MemHandle(id), nil
}

func (c *commCore) deregMr(mh nccl.MemHandle) error {
	if mh == 0 {
		return nil
	}
	h := handles.remove(uint64(mh))
	if h == nil {
		return nccl.Errorf(nccl.InternalError, "NET/GoIB : deregMr of unknown or already released handle %#x", uintptr(mh))
	}
	if err := h.releaseAll(); err != nil {
		return nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_dereg_mr: %w", err)
	}
	return nil
}

func (h *mrHandle) releaseAll() error {
	var first error
	for i := 0; i < h.n; i++ {
		var err error
		if h.entries[i] != nil {
			err = h.devs[i].release(h.entries[i])
		} else if h.mrs[i] != nil {
			err = h.mrs[i].Dereg()
			h.devs[i].stats.deregs.Add(1)
			h.devs[i].stats.bytes.Add(-(h.hi - h.lo))
		}
		if err != nil && first == nil {
			first = err
		}
	}
	if h.fd >= 0 {
		_ = unix.Close(h.fd)
		h.fd = -1
	}
	return first
}

// hostMem is page-aligned memory outside the Go heap for the control blocks
// the NIC writes asynchronously (CTS FIFO, completion records, flush word):
// the Go runtime must never move or reuse it while registered.
type hostMem struct {
	b   []byte
	mrs [maxVDevs]verbs.MR
	n   int
	// The keys, read once: MR.LKey/RKey cross into C on the real provider,
	// and the data path uses them on every message.
	lkeys, rkeys [maxVDevs]uint32
}

func newHostMem(size int) (*hostMem, error) {
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", size, err)
	}
	return &hostMem{b: b}, nil
}

func (m *hostMem) ptr() unsafe.Pointer { return unsafe.Pointer(&m.b[0]) }
func (m *hostMem) addr() uint64        { return uint64(uintptr(m.ptr())) }

// register registers the block on each device with the given access.
func (m *hostMem) register(devs []*device, access verbs.Access) error {
	for _, d := range devs {
		mr, err := d.hca.pd.RegMR(m.ptr(), m.addr(), len(m.b), access)
		if err != nil {
			return fmt.Errorf("ibv_reg_mr of %d control bytes on %s: %w", len(m.b), d, err)
		}
		m.mrs[m.n] = mr
		m.lkeys[m.n], m.rkeys[m.n] = mr.LKey(), mr.RKey()
		m.n++
	}
	return nil
}

func (m *hostMem) free() {
	for i := 0; i < m.n; i++ {
		_ = m.mrs[i].Dereg()
	}
	m.n = 0
	if m.b != nil {
		_ = unix.Munmap(m.b)
		m.b = nil
	}
}
