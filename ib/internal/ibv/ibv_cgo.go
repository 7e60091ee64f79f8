package ibv

/*
#cgo CFLAGS: -O2 -Wall
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
)

// DefaultLibrary is the soname rdma-core's runtime package installs.
const DefaultLibrary = "libibverbs.so.1"

// DefaultLibraries is what NCCL opens when NCCL_IBVERBS_LIB is unset or fails
// (misc/ibvsymbols.cc), in its order: the development symlink, then the
// soname. Where the symlink points at another build (rdma-core under
// /usr/local), it is the one NCCL's own IB transport uses.
var DefaultLibraries = []string{"libibverbs.so", DefaultLibrary}

// The C mirrors must match the Go value types exactly: slices of them cross
// into C without copying. A mismatch fails the build (a negative array
// length) instead of panicking inside NCCL's process at dlopen.
var (
	_ [unsafe.Sizeof(verbs.SendWR{}) - C.sizeof_gosendwr]byte
	_ [C.sizeof_gosendwr - unsafe.Sizeof(verbs.SendWR{})]byte
	_ [unsafe.Sizeof(verbs.RecvWR{}) - C.sizeof_gorecvwr]byte
	_ [C.sizeof_gorecvwr - unsafe.Sizeof(verbs.RecvWR{})]byte
	_ [unsafe.Sizeof(verbs.WC{}) - C.sizeof_gowc]byte
	_ [C.sizeof_gowc - unsafe.Sizeof(verbs.WC{})]byte
)

var loadMu sync.Mutex
var loaded string

// Load opens libibverbs at path and resolves its symbols. The library stays
// loaded for the life of the process (libibverbs keeps provider state), so a
// second Load with another path fails.
func Load(path string) (*Provider, error) {
	loadMu.Lock()
	defer loadMu.Unlock()
	if loaded != "" && loaded != path {
		return nil, fmt.Errorf("libibverbs already loaded from %s; cannot switch to %s", loaded, path)
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var buf [512]C.char
	if C.nb_load(cpath, &buf[0], C.int(len(buf))) != 0 {
		return nil, errors.New(C.GoString(&buf[0]))
	}
	loaded = path
	return &Provider{path: path, feat: verbs.Features{
		DMABuf:    C.nb_has_dmabuf() != 0,
		RegIova2:  C.nb_has_iova2() != 0,
		ECE:       C.nb_has_ece() != 0,
		PortSpeed: C.nb_has_port_speed() != 0,
	}}, nil
}

// Provider is libibverbs.
type Provider struct {
	path string
	feat verbs.Features
}

func (p *Provider) Name() string             { return p.path }
func (p *Provider) Features() verbs.Features { return p.feat }

func (p *Provider) ForkInit() (verbs.ForkStatus, error) {
	var st C.int
	r := C.nb_fork_init(&st)
	return verbs.ForkStatus(st), errnoErr("ibv_fork_init", r)
}

func errnoErr(what string, r C.int) error {
	if r == 0 {
		return nil
	}
	if r < 0 {
		r = -r
	}
	return fmt.Errorf("%s: %w", what, verbs.Errno(r))
}

func ptrErr(what string, err error) error {
	var en syscall.Errno
	if errors.As(err, &en) && en != 0 {
		return fmt.Errorf("%s: %w", what, verbs.Errno(en))
	}
	return fmt.Errorf("%s failed: %w", what, verbs.Errno(syscall.EIO))
}

func (p *Provider) Devices() ([]string, error) {
	var buf [4096]C.char
	var n C.int
	if r := C.nb_device_names(&buf[0], C.int(len(buf)), &n); r != 0 {
		if syscall.Errno(r) == syscall.ENOSYS {
			// The kernel has no RDMA support (no /sys/class/infiniband):
			// libibverbs says ENOSYS, which means "no devices here".
			return nil, nil
		}
		return nil, errnoErr("ibv_get_device_list", r)
	}
	raw := C.GoBytes(unsafe.Pointer(&buf[0]), C.int(len(buf)))
	var out []string
	for i, off := 0, 0; i < int(n); i++ {
		end := off
		for raw[end] != 0 {
			end++
		}
		out = append(out, string(raw[off:end]))
		off = end + 1
	}
	return out, nil
}

func (p *Provider) Open(name string) (verbs.Context, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	ctx, err := C.nb_open(cname)
	if ctx == nil {
		return nil, ptrErr("ibv_open_device("+name+")", err)
	}
	return &context{name: name, ctx: ctx, fd: int(C.nb_async_fd(ctx))}, nil
}

type context struct {
	name string
	ctx  *C.struct_ibv_context
	fd   int
	mu   sync.Mutex
	done bool

	// The async fd (non-blocking) waited on through Go's netpoller: no
	// thread sits in poll() for it and nothing wakes up while no event
	// comes. evf owns a dup of the fd; closing it ends the wait.
	evOnce sync.Once
	evf    *os.File
	evraw  syscall.RawConn
	evErr  error
}

func (c *context) Name() string { return c.name }

func (c *context) QueryDevice() (verbs.DeviceAttr, error) {
	var a C.godevattr
	if r := C.nb_query_device(c.ctx, &a); r != 0 {
		return verbs.DeviceAttr{}, errnoErr("ibv_query_device", r)
	}
	return verbs.DeviceAttr{MaxQP: int(a.max_qp), MaxQPWR: int(a.max_qp_wr), MaxCQE: int(a.max_cqe),
		SysImageGUID: uint64(a.sys_image_guid), PhysPortCnt: int(a.phys_port_cnt),
		VendorID: uint32(a.vendor_id), VendorPartID: uint32(a.vendor_part_id)}, nil
}

func (c *context) QueryPort(port int) (verbs.PortAttr, error) {
	var a C.goportattr
	if r := C.nb_query_port(c.ctx, C.int(port), &a); r != 0 {
		return verbs.PortAttr{}, errnoErr("ibv_query_port", r)
	}
	return verbs.PortAttr{State: verbs.PortState(a.state), MaxMTU: verbs.MTU(a.max_mtu), ActiveMTU: verbs.MTU(a.active_mtu),
		GIDTblLen: int(a.gid_tbl_len), LID: uint16(a.lid), SM_LID: uint16(a.sm_lid), LMC: uint8(a.lmc),
		ActiveWidth: uint8(a.active_width), ActiveSpeed: uint8(a.active_speed), ActiveSpeedEx: uint32(a.active_speed_ex), LinkLayer: verbs.LinkLayer(a.link_layer),
		Flags: uint8(a.flags)}, nil
}

func (c *context) QueryPortSpeed(port int) (int64, error) {
	var s C.uint64_t
	if r := C.nb_query_port_speed(c.ctx, C.int(port), &s); r != 0 {
		return 0, errnoErr("ibv_query_port_speed", r)
	}
	if uint64(s) > math.MaxInt64/100 {
		return 0, errnoErr("ibv_query_port_speed", C.ERANGE)
	}
	return int64(s) * 100, nil
}

func (c *context) QueryGID(port, index int) (verbs.GID, error) {
	var g verbs.GID
	if r := C.nb_query_gid(c.ctx, C.int(port), C.int(index), (*C.uint8_t)(unsafe.Pointer(&g[0]))); r != 0 {
		return g, errnoErr("ibv_query_gid", r)
	}
	return g, nil
}

func (c *context) AllocPD() (verbs.PD, error) {
	pd, err := C.nb_alloc_pd(c.ctx)
	if pd == nil {
		return nil, ptrErr("ibv_alloc_pd", err)
	}
	return &protDomain{pd: pd}, nil
}

func (c *context) CreateCQ(entries int) (verbs.CQ, error) {
	cq, err := C.nb_create_cq(c.ctx, C.int(entries))
	if cq == nil {
		return nil, ptrErr("ibv_create_cq", err)
	}
	return &compQueue{cq: cq}, nil
}

// NextAsyncEvent waits for the device's next asynchronous event in Go's
// netpoller. stop (or Close) ends the wait with ErrClosed; a stop channel
// is watched by one parked goroutine per context, which holds no thread.
func (c *context) NextAsyncEvent(stop <-chan struct{}) (verbs.AsyncEvent, error) {
	c.evOnce.Do(func() { c.evErr = c.openEvents(stop) })
	if c.evErr != nil {
		return verbs.AsyncEvent{}, c.evErr
	}
	var ev C.goevent
	var r C.int
	err := c.evraw.Read(func(uintptr) bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.done {
			r = -C.int(syscall.EBADF)
			return true
		}
		r = C.nb_get_async_event(c.ctx, &ev)
		return r != 0 // 0: nothing pending, wait until the fd is readable
	})
	switch {
	case err != nil:
		return verbs.AsyncEvent{}, verbs.ErrClosed
	case r < 0 && c.isDone():
		return verbs.AsyncEvent{}, verbs.ErrClosed
	case r < 0:
		return verbs.AsyncEvent{}, errnoErr("ibv_get_async_event", r)
	}
	return goEvent(&ev), nil
}

func goEvent(ev *C.goevent) verbs.AsyncEvent {
	return verbs.AsyncEvent{Type: verbs.AsyncEventType(ev._type), QPNum: uint32(ev.qp_num), CQID: uint64(ev.cq), Port: int(ev.port)}
}

// decodePortEvent is what NextAsyncEvent returns for an event of type t whose
// element libibverbs filled with port (tests of the decode without a device).
func decodePortEvent(t verbs.AsyncEventType, port int) verbs.AsyncEvent {
	var ev C.goevent
	C.nb_decode_test_event(C.int(t), C.int(port), &ev)
	return goEvent(&ev)
}

func (c *context) isDone() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done
}

func (c *context) openEvents(stop <-chan struct{}) error {
	dup, err := unix.FcntlInt(uintptr(c.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("dup of the async event fd: %w", err)
	}
	f := os.NewFile(uintptr(dup), c.name+"-async")
	raw, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("async event fd: %w", err)
	}
	c.mu.Lock()
	if c.done {
		c.mu.Unlock()
		_ = f.Close()
		return verbs.ErrClosed
	}
	c.evf, c.evraw = f, raw
	c.mu.Unlock()
	if stop != nil {
		go func() {
			<-stop
			_ = f.Close() // waits for a Read callback in progress
		}()
	}
	return nil
}

func (c *context) Close() error {
	c.mu.Lock()
	if c.done {
		c.mu.Unlock()
		return errors.New("ibv: context closed twice")
	}
	c.done = true // a Read callback from now on leaves the context alone
	f := c.evf
	c.mu.Unlock()
	if f != nil {
		// Waits for a callback in progress; the dup must not outlive the
		// device, whose async fd shares its file description.
		_ = f.Close()
	}
	return errnoErr("ibv_close_device", C.nb_close(c.ctx))
}

type protDomain struct{ pd *C.struct_ibv_pd }

func (p *protDomain) RegMR(_ unsafe.Pointer, addr uint64, length int, access verbs.Access) (verbs.MR, error) {
	mr, err := C.nb_reg_mr(p.pd, C.uint64_t(addr), C.size_t(length), C.int(access))
	if mr == nil {
		return nil, ptrErr(fmt.Sprintf("ibv_reg_mr(%#x, %d)", addr, length), err)
	}
	return &memRegion{mr: mr}, nil
}

func (p *protDomain) RegDMABufMR(offset uint64, length int, iova uint64, fd int, access verbs.Access) (verbs.MR, error) {
	mr, err := C.nb_reg_dmabuf_mr(p.pd, C.uint64_t(offset), C.size_t(length), C.uint64_t(iova), C.int(fd), C.int(access))
	if mr == nil {
		return nil, ptrErr("ibv_reg_dmabuf_mr", err)
	}
	return &memRegion{mr: mr}, nil
}

func (p *protDomain) CreateQP(a verbs.QPInitAttr) (verbs.QP, error) {
	scq, ok1 := a.SendCQ.(*compQueue)
	rcq, ok2 := a.RecvCQ.(*compQueue)
	if !ok1 || !ok2 {
		return nil, errors.New("ibv: CQs of another provider")
	}
	qp, err := C.nb_create_qp(p.pd, scq.cq, rcq.cq, C.int(a.MaxSendWR), C.int(a.MaxRecvWR), C.int(a.MaxSendSGE), C.int(a.MaxRecvSGE), C.int(a.MaxInline))
	if qp == nil {
		return nil, ptrErr("ibv_create_qp", err)
	}
	return &queuePair{qp: qp, num: uint32(C.nb_qp_num(qp))}, nil
}

func (p *protDomain) Dealloc() error { return errnoErr("ibv_dealloc_pd", C.nb_dealloc_pd(p.pd)) }

type memRegion struct{ mr *C.struct_ibv_mr }

func (m *memRegion) LKey() uint32 { return uint32(C.nb_mr_lkey(m.mr)) }
func (m *memRegion) RKey() uint32 { return uint32(C.nb_mr_rkey(m.mr)) }
func (m *memRegion) Dereg() error { return errnoErr("ibv_dereg_mr", C.nb_dereg_mr(m.mr)) }

type compQueue struct{ cq *C.struct_ibv_cq }

func (q *compQueue) ID() uint64 { return uint64(uintptr(unsafe.Pointer(q.cq))) }

func (q *compQueue) Poll(wcs []verbs.WC) (int, error) {
	if len(wcs) == 0 {
		return 0, nil
	}
	n := C.nb_poll_cq(q.cq, (*C.gowc)(unsafe.Pointer(&wcs[0])), C.int(len(wcs)))
	if n < 0 {
		return 0, errnoErr("ibv_poll_cq", n)
	}
	return int(n), nil
}

func (q *compQueue) Destroy() error { return errnoErr("ibv_destroy_cq", C.nb_destroy_cq(q.cq)) }

type queuePair struct {
	qp  *C.struct_ibv_qp
	num uint32
}

func (q *queuePair) Num() uint32 { return q.num }

func (q *queuePair) ModifyToInit(a verbs.InitAttr) error {
	return errnoErr("ibv_modify_qp(INIT)", C.nb_modify_init(q.qp, C.int(a.PKeyIndex), C.int(a.Port), C.int(a.Access)))
}

func (q *queuePair) ModifyToRTR(a verbs.RTRAttr) error {
	g := a.AH.DGID
	global := 0
	if a.AH.IsGlobal {
		global = 1
	}
	return errnoErr("ibv_modify_qp(RTR)", C.nb_modify_rtr(q.qp, C.int(a.PathMTU), C.uint32_t(a.DestQPN), C.uint32_t(a.RQPSN),
		C.int(a.MaxDestRdAtomic), C.int(a.MinRNRTimer), C.int(global), (*C.uint8_t)(unsafe.Pointer(&g[0])), C.int(a.AH.SGIDIndex),
		C.int(a.AH.HopLimit), C.int(a.AH.TrafficClass), C.uint32_t(a.AH.FlowLabel), C.int(a.AH.DLID), C.int(a.AH.SL), C.int(a.AH.Port)))
}

func (q *queuePair) ModifyToRTS(a verbs.RTSAttr) error {
	return errnoErr("ibv_modify_qp(RTS)", C.nb_modify_rts(q.qp, C.int(a.Timeout), C.int(a.RetryCnt), C.int(a.RNRRetry),
		C.uint32_t(a.SQPSN), C.int(a.MaxRdAtom)))
}

func (q *queuePair) PostSend(wrs []verbs.SendWR) (int, error) {
	if len(wrs) == 0 {
		return 0, nil
	}
	var bad C.int
	r := C.nb_post_send(q.qp, (*C.gosendwr)(unsafe.Pointer(&wrs[0])), C.int(len(wrs)), &bad)
	return int(bad), errnoErr("ibv_post_send", r)
}

func (q *queuePair) PostRecv(wrs []verbs.RecvWR) (int, error) {
	if len(wrs) == 0 {
		return 0, nil
	}
	var bad C.int
	r := C.nb_post_recv(q.qp, (*C.gorecvwr)(unsafe.Pointer(&wrs[0])), C.int(len(wrs)), &bad)
	return int(bad), errnoErr("ibv_post_recv", r)
}

func (q *queuePair) QueryECE() (verbs.ECE, error) {
	var v [3]C.uint32_t
	if r := C.nb_query_ece(q.qp, &v[0]); r != 0 {
		return verbs.ECE{}, errnoErr("ibv_query_ece", r)
	}
	return verbs.ECE{VendorID: uint32(v[0]), Options: uint32(v[1]), CompMask: uint32(v[2])}, nil
}

func (q *queuePair) SetECE(e verbs.ECE) error {
	v := [3]C.uint32_t{C.uint32_t(e.VendorID), C.uint32_t(e.Options), C.uint32_t(e.CompMask)}
	return errnoErr("ibv_set_ece", C.nb_set_ece(q.qp, &v[0]))
}

func (q *queuePair) Destroy() error { return errnoErr("ibv_destroy_qp", C.nb_destroy_qp(q.qp)) }
