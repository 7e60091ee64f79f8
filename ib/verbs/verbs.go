package verbs

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// Provider opens RDMA devices. Devices may be called more than once.
type Provider interface {
	// Name identifies the provider in logs ("libibverbs.so.1", "softnic").
	Name() string
	// Devices lists the RDMA device names (ibv_get_device_list).
	Devices() ([]string, error)
	// Open opens a device context (ibv_open_device).
	Open(name string) (Context, error)
	// Features reports which optional verbs exist (probed symbols).
	Features() Features
	// ForkInit is ibv_fork_init followed by ibv_is_fork_initialized: it
	// must run before any memory is registered, so that a child the
	// application forks later cannot take registered pages from under the
	// NIC. Calling it again is harmless.
	ForkInit() (ForkStatus, error)
}

// ForkStatus is ibv_is_fork_initialized's answer.
type ForkStatus int

const (
	ForkUnknown  ForkStatus = -1 // ibv_is_fork_initialized is absent (rdma-core < 35)
	ForkDisabled ForkStatus = 0  // registrations are not protected against fork()
	ForkEnabled  ForkStatus = 1  // libibverbs marks registrations MADV_DONTFORK
	ForkUnneeded ForkStatus = 2  // the kernel copies pinned pages at fork (Linux >= 5.13)
)

func (s ForkStatus) String() string {
	switch s {
	case ForkDisabled:
		return "disabled"
	case ForkEnabled:
		return "enabled"
	case ForkUnneeded:
		return "unneeded"
	}
	return "unknown"
}

// Features are optional provider capabilities. Their absence disables the
// matching transport feature, it is never an error.
type Features struct {
	DMABuf   bool // ibv_reg_dmabuf_mr (IBVERBS_1.12)
	RegIova2 bool // ibv_reg_mr_iova2 (IBVERBS_1.8), needed for relaxed ordering
	ECE      bool // ibv_query_ece / ibv_set_ece (IBVERBS_1.10)
	// PortSpeed: ibv_query_port_speed (rdma-core since late 2025), a port's
	// effective bandwidth, which on a LAG or multi-port e-switch function is
	// not lane rate × width.
	PortSpeed bool
}

// Context is an open device (struct ibv_context).
type Context interface {
	Name() string
	QueryDevice() (DeviceAttr, error)
	QueryPort(port int) (PortAttr, error)
	// QueryPortSpeed is the port's effective bandwidth in Mbps
	// (ibv_query_port_speed). EOPNOTSUPP when the library lacks it
	// (Features.PortSpeed); kernels without the verb fail it too.
	QueryPortSpeed(port int) (mbps int64, err error)
	QueryGID(port, index int) (GID, error)
	AllocPD() (PD, error)
	CreateCQ(entries int) (CQ, error)
	// NextAsyncEvent blocks until the device reports an asynchronous event, the
	// context is closed (ErrClosed) or stop is closed (ErrClosed). The event is
	// acknowledged by the implementation after it is returned.
	NextAsyncEvent(stop <-chan struct{}) (AsyncEvent, error)
	Close() error
}

// ErrClosed is returned by blocking calls on a closed context.
var ErrClosed = errors.New("verbs: context closed")

// MR is a registered memory region.
type MR interface {
	LKey() uint32
	RKey() uint32
	Dereg() error
}

// CQ is a completion queue.
type CQ interface {
	// Poll reaps up to len(wcs) completions and returns how many it wrote. An
	// error means the CQ itself failed (overrun), not that a WR failed.
	Poll(wcs []WC) (int, error)
	// ID identifies the CQ in async events (AsyncEvent.CQID).
	ID() uint64
	Destroy() error
}

// QP is a reliable-connected queue pair.
type QP interface {
	Num() uint32
	ModifyToInit(attr InitAttr) error
	ModifyToRTR(attr RTRAttr) error
	ModifyToRTS(attr RTSAttr) error
	// PostSend posts wrs as one chain. On error, bad is the index of the first
	// WR that was not posted (those before it were).
	PostSend(wrs []SendWR) (bad int, err error)
	PostRecv(wrs []RecvWR) (bad int, err error)
	QueryECE() (ECE, error)
	SetECE(ECE) error
	Destroy() error
}

// DeviceAttr is the subset of ibv_device_attr the transport reads.
type DeviceAttr struct {
	MaxQP        int
	MaxQPWR      int
	MaxCQE       int
	SysImageGUID uint64 // as ibverbs reports it (network byte order value)
	PhysPortCnt  int
	VendorID     uint32
	VendorPartID uint32
}

// PortState is ibv_port_state.
type PortState int

const (
	PortNop         PortState = 0
	PortDown        PortState = 1
	PortInit        PortState = 2
	PortArmed       PortState = 3
	PortActive      PortState = 4
	PortActiveDefer PortState = 5
)

func (s PortState) String() string {
	switch s {
	case PortDown:
		return "DOWN"
	case PortInit:
		return "INIT"
	case PortArmed:
		return "ARMED"
	case PortActive:
		return "ACTIVE"
	case PortActiveDefer:
		return "ACTIVE_DEFER"
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// LinkLayer is IBV_LINK_LAYER_*.
type LinkLayer int

const (
	LinkUnspecified LinkLayer = 0
	LinkInfiniBand  LinkLayer = 1
	LinkEthernet    LinkLayer = 2
)

func (l LinkLayer) String() string {
	switch l {
	case LinkInfiniBand, LinkUnspecified:
		return "IB"
	case LinkEthernet:
		return "RoCE"
	}
	return fmt.Sprintf("linklayer(%d)", int(l))
}

// MTU is ibv_mtu (1 = 256 ... 5 = 4096).
type MTU int

// Bytes converts an ibv_mtu enum to bytes.
func (m MTU) Bytes() int {
	if m < 1 || m > 5 {
		return 0
	}
	return 128 << m
}

// PortAttr is the subset of ibv_port_attr the transport reads.
type PortAttr struct {
	State       PortState
	MaxMTU      MTU
	ActiveMTU   MTU
	GIDTblLen   int
	LID         uint16
	SM_LID      uint16
	LMC         uint8
	ActiveWidth uint8 // IBV_WIDTH bit: 1=1x 2=4x 4=8x 8=12x 16=2x
	ActiveSpeed uint8 // IBV_SPEED bit: 1=SDR ... 128=NDR
	// ActiveSpeedEx is ibv_port_attr.active_speed_ex (rdma-core 48+, kernel
	// 6.7+): the speed bit when it does not fit in ActiveSpeed (256 = XDR,
	// 200 Gb/s per lane); 0 when the port, library or kernel has none. The
	// kernel caps ActiveSpeed at NDR for such ports.
	ActiveSpeedEx uint32
	LinkLayer     LinkLayer
	Flags         uint8 // PortGRHRequired
}

// PortGRHRequired is IBV_QPF_GRH_REQUIRED in PortAttr.Flags: the port takes
// only address vectors with a GRH (the kernel refuses RTR without one).
const PortGRHRequired uint8 = 1

// Subnet is what NCCL compares to tell whether two InfiniBand ports share a
// subnet (LID routing) or not (a GRH, and the FLID as DLID): the low 16 bits
// of the GID's 64-bit subnet prefix.
func (g GID) Subnet() uint16 { return uint16(g[6])<<8 | uint16(g[7]) }

// FLID is the routable LID a GID of an InfiniBand port carries in bytes 4-5
// (0 when the subnet manager gave none).
func (g GID) FLID() uint16 { return uint16(g[4])<<8 | uint16(g[5]) }

// GID is a 16-byte port GID (an IPv6 address, IPv4-mapped for RoCE over IPv4).
type GID [16]byte

// IsZero reports an unused GID table entry.
func (g GID) IsZero() bool { return g == GID{} }

// Addr views the GID as an IP address (IPv4-mapped GIDs unmap to IPv4).
func (g GID) Addr() netip.Addr { return netip.AddrFrom16(g).Unmap() }

func (g GID) String() string { return netip.AddrFrom16(g).String() }

// Access is a set of IBV_ACCESS_* flags.
type Access uint32

const (
	AccessLocalWrite      Access = 1
	AccessRemoteWrite     Access = 2
	AccessRemoteRead      Access = 4
	AccessRemoteAtomic    Access = 8
	AccessRelaxedOrdering Access = 1 << 20
)

// QPInitAttr creates an RC QP.
type QPInitAttr struct {
	SendCQ, RecvCQ CQ
	MaxSendWR      int
	MaxRecvWR      int
	MaxSendSGE     int
	MaxRecvSGE     int
	MaxInline      int
}

// InitAttr moves a QP RESET -> INIT.
type InitAttr struct {
	PKeyIndex int
	Port      int
	Access    Access
}

// AH is the address vector of a connected QP.
type AH struct {
	IsGlobal     bool // RoCE, or IB with a GRH
	DGID         GID
	SGIDIndex    int
	HopLimit     uint8
	TrafficClass uint8
	FlowLabel    uint32
	DLID         uint16
	SL           uint8
	Port         int
}

// RTRAttr moves a QP INIT -> RTR.
type RTRAttr struct {
	PathMTU         MTU
	DestQPN         uint32
	RQPSN           uint32
	MaxDestRdAtomic int
	MinRNRTimer     int
	AH              AH
}

// RTSAttr moves a QP RTR -> RTS.
type RTSAttr struct {
	Timeout   int // local ack timeout exponent (4.096us * 2^Timeout)
	RetryCnt  int
	RNRRetry  int
	SQPSN     uint32
	MaxRdAtom int
}

// ECE is the enhanced connection establishment blob NCCL passes through.
type ECE struct {
	VendorID uint32
	Options  uint32
	CompMask uint32
}

// Opcode is the work-request opcode (IBV_WR_*).
type Opcode uint8

const (
	WrRDMAWrite        Opcode = 0
	WrRDMAWriteWithImm Opcode = 1
	WrSend             Opcode = 2
	WrRDMARead         Opcode = 4
)

func (o Opcode) String() string {
	switch o {
	case WrRDMAWrite:
		return "RDMA_WRITE"
	case WrRDMAWriteWithImm:
		return "RDMA_WRITE_WITH_IMM"
	case WrSend:
		return "SEND"
	case WrRDMARead:
		return "RDMA_READ"
	}
	return fmt.Sprintf("opcode(%d)", int(o))
}

// SendFlags are IBV_SEND_* bits.
type SendFlags uint8

const (
	SendFence     SendFlags = 1
	SendSignaled  SendFlags = 2
	SendSolicited SendFlags = 4
	SendInline    SendFlags = 8
)

// SGE is one scatter/gather element; a WR has zero or one.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendWR is a send-queue work request. Its layout is fixed (no Go pointers) so
// the real provider can hand a slice of them to C in one crossing; keep it in
// sync with struct gowr in package ibv.
type SendWR struct {
	WRID       uint64
	SGE        SGE
	RemoteAddr uint64
	RKey       uint32
	Imm        uint32 // host order; providers put it on the wire big-endian
	Opcode     Opcode
	Flags      SendFlags
	NumSGE     uint8 // 0 or 1
	_          [5]byte
}

// RecvWR is a receive-queue work request (layout fixed like SendWR).
type RecvWR struct {
	WRID   uint64
	SGE    SGE
	NumSGE uint8
	_      [7]byte
}

// WCStatus is ibv_wc_status.
type WCStatus uint8

const (
	WCSuccess        WCStatus = 0
	WCLocLenErr      WCStatus = 1
	WCLocQPOpErr     WCStatus = 2
	WCLocProtErr     WCStatus = 4
	WCWRFlushErr     WCStatus = 5
	WCLocAccessErr   WCStatus = 8
	WCRemInvReqErr   WCStatus = 9
	WCRemAccessErr   WCStatus = 10
	WCRemOpErr       WCStatus = 11
	WCRetryExcErr    WCStatus = 12
	WCRNRRetryExcErr WCStatus = 13
	WCRemAbortErr    WCStatus = 16
	WCFatalErr       WCStatus = 19
	WCRespTimeoutErr WCStatus = 20
	WCGeneralErr     WCStatus = 21
)

var wcStatusNames = [...]string{"IBV_WC_SUCCESS", "IBV_WC_LOC_LEN_ERR", "IBV_WC_LOC_QP_OP_ERR",
	"IBV_WC_LOC_EEC_OP_ERR", "IBV_WC_LOC_PROT_ERR", "IBV_WC_WR_FLUSH_ERR", "IBV_WC_MW_BIND_ERR",
	"IBV_WC_BAD_RESP_ERR", "IBV_WC_LOC_ACCESS_ERR", "IBV_WC_REM_INV_REQ_ERR", "IBV_WC_REM_ACCESS_ERR",
	"IBV_WC_REM_OP_ERR", "IBV_WC_RETRY_EXC_ERR", "IBV_WC_RNR_RETRY_EXC_ERR", "IBV_WC_LOC_RDD_VIOL_ERR",
	"IBV_WC_REM_INV_RD_REQ_ERR", "IBV_WC_REM_ABORT_ERR", "IBV_WC_INV_EECN_ERR", "IBV_WC_INV_EEC_STATE_ERR",
	"IBV_WC_FATAL_ERR", "IBV_WC_RESP_TIMEOUT_ERR", "IBV_WC_GENERAL_ERR"}

func (s WCStatus) String() string {
	if int(s) < len(wcStatusNames) {
		return wcStatusNames[s]
	}
	return fmt.Sprintf("IBV_WC_STATUS(%d)", int(s))
}

// WCOpcode is ibv_wc_opcode.
type WCOpcode uint8

const (
	WCSend            WCOpcode = 0
	WCRDMAWrite       WCOpcode = 1
	WCRDMARead        WCOpcode = 2
	WCRecv            WCOpcode = 128
	WCRecvRDMAWithImm WCOpcode = 129
)

func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "SEND"
	case WCRDMAWrite:
		return "RDMA_WRITE"
	case WCRDMARead:
		return "RDMA_READ"
	case WCRecv:
		return "RECV"
	case WCRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return fmt.Sprintf("wc_opcode(%d)", int(o))
}

// WC is a work completion (layout fixed, see SendWR).
type WC struct {
	WRID      uint64
	ByteLen   uint32
	Imm       uint32 // host order
	QPNum     uint32
	VendorErr uint32
	Status    WCStatus
	Opcode    WCOpcode
	WithImm   uint8
	_         [5]byte
}

// AsyncEventType is ibv_event_type.
type AsyncEventType int

const (
	EventCQErr             AsyncEventType = 0
	EventQPFatal           AsyncEventType = 1
	EventQPReqErr          AsyncEventType = 2
	EventQPAccessErr       AsyncEventType = 3
	EventCommEst           AsyncEventType = 4
	EventSQDrained         AsyncEventType = 5
	EventPathMig           AsyncEventType = 6
	EventPathMigErr        AsyncEventType = 7
	EventDeviceFatal       AsyncEventType = 8
	EventPortActive        AsyncEventType = 9
	EventPortErr           AsyncEventType = 10
	EventLIDChange         AsyncEventType = 11
	EventPKeyChange        AsyncEventType = 12
	EventSMChange          AsyncEventType = 13
	EventSRQErr            AsyncEventType = 14
	EventSRQLimitReached   AsyncEventType = 15
	EventQPLastWQEReached  AsyncEventType = 16
	EventClientReregister  AsyncEventType = 17
	EventGIDChange         AsyncEventType = 18
	EventWQFatal           AsyncEventType = 19
	EventDeviceSpeedChange AsyncEventType = 20
)

var eventNames = map[AsyncEventType]string{
	EventCQErr: "IBV_EVENT_CQ_ERR", EventQPFatal: "IBV_EVENT_QP_FATAL", EventQPReqErr: "IBV_EVENT_QP_REQ_ERR",
	EventQPAccessErr: "IBV_EVENT_QP_ACCESS_ERR", EventCommEst: "IBV_EVENT_COMM_EST", EventSQDrained: "IBV_EVENT_SQ_DRAINED",
	EventPathMig: "IBV_EVENT_PATH_MIG", EventPathMigErr: "IBV_EVENT_PATH_MIG_ERR", EventDeviceFatal: "IBV_EVENT_DEVICE_FATAL",
	EventPortActive: "IBV_EVENT_PORT_ACTIVE", EventPortErr: "IBV_EVENT_PORT_ERR", EventLIDChange: "IBV_EVENT_LID_CHANGE",
	EventPKeyChange: "IBV_EVENT_PKEY_CHANGE", EventSMChange: "IBV_EVENT_SM_CHANGE", EventSRQErr: "IBV_EVENT_SRQ_ERR",
	EventSRQLimitReached: "IBV_EVENT_SRQ_LIMIT_REACHED", EventQPLastWQEReached: "IBV_EVENT_QP_LAST_WQE_REACHED",
	EventClientReregister: "IBV_EVENT_CLIENT_REREGISTER", EventGIDChange: "IBV_EVENT_GID_CHANGE",
	EventWQFatal: "IBV_EVENT_WQ_FATAL", EventDeviceSpeedChange: "IBV_EVENT_DEVICE_SPEED_CHANGE",
}

func (e AsyncEventType) String() string {
	if s, ok := eventNames[e]; ok {
		return s
	}
	return fmt.Sprintf("IBV_EVENT(%d)", int(e))
}

// Fatal reports events after which the affected QP, CQ or device is unusable
// (the set NCCL's async thread counts as fatal).
func (e AsyncEventType) Fatal() bool {
	switch e {
	case EventDeviceFatal, EventCQErr, EventQPFatal, EventQPReqErr, EventQPAccessErr, EventWQFatal:
		return true
	}
	return false
}

// AsyncEvent is one ibv_async_event. Which element is meaningful depends on
// Type: QPNum for QP events, CQID for CQ events, Port for port events.
type AsyncEvent struct {
	Type  AsyncEventType
	QPNum uint32
	CQID  uint64
	Port  int
}

// Errno is an errno a verbs call failed with; providers wrap it so callers
// can tell EBADF from EOPNOTSUPP (the dma-buf probe needs exactly that).
type Errno int

func (e Errno) Error() string { return fmt.Sprintf("errno %d (%s)", int(e), errnoName(int(e))) }

func errnoName(e int) string {
	switch e {
	case 9:
		return "EBADF"
	case 12:
		return "ENOMEM"
	case 22:
		return "EINVAL"
	case 95:
		return "EOPNOTSUPP"
	case 93:
		return "EPROTONOSUPPORT"
	case 110:
		return "ETIMEDOUT"
	case 2:
		return "ENOENT"
	case 1:
		return "EPERM"
	case 13:
		return "EACCES"
	case 38:
		return "ENOSYS"
	case 5:
		return "EIO"
	case 19:
		return "ENODEV"
	}
	// Any other errno by its name (EFAULT, EAGAIN, EBUSY...): a WARN that
	// says "unknown" leaves the user nothing to look up.
	if n := unix.ErrnoName(syscall.Errno(e)); n != "" {
		return n
	}
	return "unknown"
}

const (
	EPERM           Errno = 1
	ENOENT          Errno = 2
	EBADF           Errno = 9
	EAGAIN          Errno = 11
	ENOMEM          Errno = 12
	EFAULT          Errno = 14
	EINVAL          Errno = 22
	EPROTONOSUPPORT Errno = 93
	EOPNOTSUPP      Errno = 95
	ETIMEDOUT       Errno = 110
)
