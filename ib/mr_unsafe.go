package ib

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// dmabufRef names the dma-buf behind a registration; fd < 0 for host memory.
type dmabufRef struct {
	fd     int
	offset uint64 // of the registered address within the dma-buf
}

// acquire returns a registration covering [p, p+size), registering the
// page-rounded range on a miss.
func (d *device) acquire(t *Transport, p unsafe.Pointer, size int, db dmabufRef) (*mrEntry, error) {
	addr := uint64(uintptr(p))
	lo, hi := pageRange(addr, size)
	c := &d.mrCache
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errFinalized
	}
	if e := c.lookupLocked(lo, hi); e != nil {
		e.refs++
		d.stats.hit()
		return e, nil
	}
	var mr verbs.MR
	var err error
	if db.fd >= 0 {
		if db.offset < addr-lo {
			// The dma-buf does not extend below the buffer: register it
			// exactly (the page offsets of iova and offset stay equal).
			lo, hi = addr, addr+uint64(size)
		}
		mr, err = d.hca.pd.RegDMABufMR(db.offset-(addr-lo), int(hi-lo), lo, db.fd, t.mrAccess())
	} else {
		mr, err = d.hca.pd.RegMR(p, lo, int(hi-lo), t.mrAccess())
	}
	if err != nil {
		return nil, err
	}
	e := &mrEntry{addr: lo, end: hi, refs: 1, mr: mr, lkey: mr.LKey(), rkey: mr.RKey()}
	c.insertLocked(e)
	d.stats.registered(hi - lo)
	return e, nil
}

func (c *commCore) regMr(data unsafe.Pointer, size int, ptrType nccl.PtrType) (nccl.MemHandle, error) {
	if data == nil || size < 0 {
		return 0, nccl.Errorf(nccl.InvalidArgument, "NET/GoIB : regMr(%p, %d): bad buffer", data, size)
	}
	if ptrType != nccl.PtrHost && (ptrType != nccl.PtrCUDA || c.ptrSupport&nccl.PtrCUDA == 0) {
		return 0, nccl.Errorf(nccl.InternalError, "NET/GoIB : regMr of memory type %d on %s, which supports %#x; GPU memory needs nvidia-peermem or dma-buf", ptrType, c.name, int(c.ptrSupport))
	}
	return c.register(data, size, dmabufRef{fd: -1}, func(d *device, err error) error {
		return nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_reg_mr(%p, %d bytes) on %s failed: %w; %s", data, size, d, err, regHint(err))
	})
}

// regHint says what an ibv_reg_mr failure most likely means. ENOMEM (and
// EPERM, EAGAIN) is the locked-memory limit: the kernel pins the pages and
// charges them to RLIMIT_MEMLOCK, 64 KiB by default in many containers,
// less than one connection's control blocks. EFAULT is a range the kernel
// cannot pin at all: not mapped in this process, or GPU memory without
// nvidia-peermem; the locked-memory limit has nothing to do with it.
func regHint(err error) string {
	var e verbs.Errno
	switch {
	case !errors.As(err, &e):
		return "check the locked-memory limit (ulimit -l unlimited) and dmesg"
	case memlockErr(err):
		return memlockHint
	case e == verbs.EFAULT:
		return "the range is not memory this process can pin: unmapped, or GPU memory without nvidia-peermem (load it, use dma-buf, or set NCCL_NET_GDR_LEVEL=LOC)"
	}
	return "check dmesg and the device (ibv_devinfo)"
}

// memlockHint is the advice for a verb that pins memory and failed for want
// of it (memlockErr).
const memlockHint = "check the locked-memory limit (ulimit -l unlimited; in containers --ulimit memlock=-1)"

// memlockErr reports whether err is what the kernel answers when pinning
// would pass RLIMIT_MEMLOCK: ENOMEM, or EPERM / EAGAIN on some kernels.
func memlockErr(err error) bool {
	var e verbs.Errno
	return errors.As(err, &e) && (e == verbs.ENOMEM || e == verbs.EPERM || e == verbs.EAGAIN)
}

// regMrDMABuf registers through the dma-buf fd, cached like host memory.
// The fd is not kept: the kernel holds the dma-buf for the MR's life, and
// NCCL closes its fd as soon as we return.
func (c *commCore) regMrDMABuf(data unsafe.Pointer, size int, ptrType nccl.PtrType, offset uint64, fd int) (nccl.MemHandle, error) {
	if c.ptrSupport&nccl.PtrDMABuf == 0 {
		return 0, nccl.Errorf(nccl.InternalError, "NET/GoIB : %s does not support dma-buf registration; set NCCL_DMABUF_ENABLE=0", c.name)
	}
	if size <= 0 || fd < 0 || data == nil {
		return 0, nccl.Errorf(nccl.InvalidArgument, "NET/GoIB : regMrDmaBuf(%p, size %d, fd %d): bad arguments", data, size, fd)
	}
	return c.register(data, size, dmabufRef{fd: fd, offset: offset}, func(d *device, err error) error {
		return nccl.Errorf(nccl.SystemError, "NET/GoIB : ibv_reg_dmabuf_mr(%d bytes) on %s failed: %w; set NCCL_DMABUF_ENABLE=0 to use peer memory instead", size, d, err)
	})
}

func (c *commCore) register(data unsafe.Pointer, size int, db dmabufRef, fail func(*device, error) error) (nccl.MemHandle, error) {
	if m := c.fatal.Load(); m != nil {
		return 0, nccl.Errorf(nccl.SystemError, "NET/GoIB : cannot register memory on %s: %s", c.name, *m)
	}
	// The page-rounded end must not wrap: lookupLocked would take the small
	// wrapped end for a hit on any registration below it.
	if addr := uint64(uintptr(data)); addr+uint64(max(size, 1))+pageSize-1 < addr {
		return 0, nccl.Errorf(nccl.InvalidArgument, "NET/GoIB : registration of %#x + %d bytes wraps past the end of the address space", addr, size)
	}
	h := &mrHandle{}
	for i := range c.devs {
		d := c.devs[i].device
		e, err := d.acquire(c.t, data, size, db)
		if err != nil {
			_ = h.releaseAll()
			if ferr := c.t.deviceFatal([]*device{d}); ferr != nil {
				return 0, ferr // the device died: not a locked-memory problem
			}
			return 0, fail(d, err)
		}
		h.n = i + 1
		h.devs[i], h.entries[i] = d, e
		h.lkeys[i], h.rkeys[i] = e.lkey, e.rkey
	}
	h.lo, h.hi = uint64(uintptr(data)), uint64(uintptr(data))+uint64(size)
	return c.publish(h)
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
			// At connection set-up, where the locked-memory limit is
			// usually met first: say so, as regMr does.
			return fmt.Errorf("ibv_reg_mr of %d control bytes on %s: %w; %s", len(m.b), d, err, regHint(err))
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
