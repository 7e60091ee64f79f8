package ib

import (
	"os"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/internal/slots"
	"github.com/libnccl-net-go/libnccl-net-go/metrics"
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

type mrCounters struct {
	hits, misses, deregs, bytes atomic.Uint64
	// met is the plugin-wide metrics entry of this port (metrics.Device,
	// exported to Prometheus as the MR-cache series of the device).
	met *metrics.Device
}

func (c *mrCounters) hit() {
	c.hits.Add(1)
	c.met.MRHits.Add(1)
}

func (c *mrCounters) registered(n uint64) {
	c.misses.Add(1)
	c.bytes.Add(n)
	c.met.MRMisses.Add(1)
	c.met.MRRegistered.Add(int64(n))
}

func (c *mrCounters) released(n uint64) {
	c.deregs.Add(1)
	c.bytes.Add(-n)
	c.met.MRRegistered.Add(-int64(n))
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
	addr, end  uint64
	refs       int
	mr         verbs.MR
	lkey, rkey uint32
}

// mrCache is a device's registration cache (NCCL's per-device MR cache):
// sorted by start address, shared by every comm on the device, host and
// dma-buf registrations alike (both are addressed by the virtual address
// NCCL passes), protected by mu because registration runs on NCCL's service
// thread while other comms' threads register too.
type mrCache struct {
	mu      sync.Mutex
	entries []*mrEntry
	closed  bool // the device is closed: every MR is gone
}

// lookupLocked returns a live entry covering [lo, hi). Entries are sorted by
// start, not end: a registration that starts earlier can cover the range
// even when a smaller one sorts between them, so every entry starting at or
// before lo is a candidate (NCCL scans them the same way).
func (c *mrCache) lookupLocked(lo, hi uint64) *mrEntry {
	i := sort.Search(len(c.entries), func(i int) bool { return c.entries[i].addr > lo })
	for j := i - 1; j >= 0; j-- {
		if c.entries[j].end >= hi {
			return c.entries[j]
		}
	}
	return nil
}

func (c *mrCache) insertLocked(e *mrEntry) {
	i := sort.Search(len(c.entries), func(i int) bool { return c.entries[i].addr >= e.addr })
	c.entries = append(c.entries, nil)
	copy(c.entries[i+1:], c.entries[i:])
	c.entries[i] = e
}

// pageRange rounds [addr, addr+size) out to pages (a 0-byte buffer still
// gets its page).
func pageRange(addr uint64, size int) (lo, hi uint64) {
	lo = addr &^ (pageSize - 1)
	hi = (addr + uint64(max(size, 1)) + pageSize - 1) &^ (pageSize - 1)
	return lo, hi
}

// mrAccess is what every data registration asks for: NCCL's flags, plus
// relaxed ordering when NCCL_IB_PCI_RELAXED_ORDERING allows it and the
// provider has ibv_reg_mr_iova2 (for host and dma-buf registrations alike).
func (t *Transport) mrAccess() verbs.Access {
	a := verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic
	if t.feats.RegIova2 && t.cfg.relaxedOrder {
		a |= verbs.AccessRelaxedOrdering
	}
	return a
}

func (d *device) release(e *mrEntry) error {
	c := &d.mrCache
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
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
	d.stats.released(e.end - e.addr)
	return e.mr.Dereg()
}

// closeMRCache deregisters what NCCL never deregistered, as the device
// closes; closeHCAsLocked removes the handles pointing at these entries.
// The counters see the release, as in release: the metrics entry outlives
// the transport.
func (d *device) closeMRCache() {
	c := &d.mrCache
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.entries {
		d.stats.released(e.end - e.addr)
		_ = e.mr.Dereg()
	}
	c.entries = nil
	c.closed = true
}

// forgetHandlesOf removes from the handle table every registration on a port
// of hcas, which are closing: nothing can use or release those handles any
// more, and each would keep its transport reachable.
func forgetHandlesOf(hcas []*hca) {
	if len(hcas) == 0 {
		return
	}
	closing := make(map[*hca]bool, len(hcas))
	for _, h := range hcas {
		closing[h] = true
	}
	handles.Range(func(r slots.Ref, h *mrHandle) bool {
		if h.n > 0 && h.devs[0] != nil && closing[h.devs[0].hca] {
			handles.Remove(r)
		}
		return true
	})
}

// mrHandle is what a MemHandle resolves to: one cached registration per
// member device of the comm's vNIC, and the registered range for bounds
// checks.
type mrHandle struct {
	lo, hi  uint64
	n       int
	devs    [maxVDevs]*device
	entries [maxVDevs]*mrEntry
	lkeys   [maxVDevs]uint32
	rkeys   [maxVDevs]uint32
}

// handles holds every live registration; MemHandle values are its packed
// Refs, so a released or forged handle does not resolve.
var handles slots.Table[mrHandle]

func lookupMR(mh nccl.MemHandle) *mrHandle {
	r, ok := slots.Unpack(uint64(mh))
	if !ok {
		return nil
	}
	return handles.Get(r)
}

// covers reports whether [addr, addr+size) lies inside the registration.
func (h *mrHandle) covers(addr uint64, size int) bool {
	return addr >= h.lo && addr+uint64(size) <= h.hi && addr+uint64(size) >= addr
}

func (c *commCore) publish(h *mrHandle) (nccl.MemHandle, error) {
	r, ok := handles.Add(h)
	if !ok {
		_ = h.releaseAll()
		return 0, nccl.Errorf(nccl.InternalError, "NET/GoIB : too many live registrations")
	}
	return nccl.MemHandle(r.Pack()), nil
}

func (c *commCore) deregMr(mh nccl.MemHandle) error {
	if mh == 0 {
		return nil
	}
	var h *mrHandle
	if r, ok := slots.Unpack(uint64(mh)); ok {
		h = handles.Remove(r)
	}
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
		if err := h.devs[i].release(h.entries[i]); err != nil && first == nil {
			first = err
		}
	}
	return first
}
