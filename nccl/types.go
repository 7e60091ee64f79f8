package nccl

import "unsafe"

// Limits and constants of the NCCL net API.
const (
	HandleSize      = 128     // NCCL_NET_HANDLE_MAXSIZE: bytes NCCL copies to the peer
	MaxRequests     = 32      // NCCL_NET_MAX_REQUESTS per comm (send side: × MaxRecvs)
	MaxNetSize      = 1 << 30 // largest single isend/irecv NCCL issues (NCCL_MAX_NET_SIZE)
	MaxNetSizeBytes = 1 << 40 // upper bound for MaxP2PBytes / MaxCollBytes
	MaxCollSize     = 512 << 20

	MaxDevsPerNIC    = 4 // vNIC members for API v9..v11
	MaxDevsPerNICV12 = 8

	TrafficClassUndef = -1
	IDUndef           = -1
)

// PtrType is a bit set of NCCL_PTR_* values: the memory kinds a device can
// register, and the type argument of RegMr.
type PtrType int

const (
	PtrHost   PtrType = 0x1
	PtrCUDA   PtrType = 0x2
	PtrDMABuf PtrType = 0x4
)

// Handle is the opaque connection handle that listen fills and NCCL copies, as
// is, to the connecting peer. The connector may also keep retry state in its own
// copy, because NCCL passes the same buffer on every connect retry.
type Handle [HandleSize]byte

// Properties describes one device as NCCL's getProperties reports it. The glue
// converts it to the ncclNetProperties_vN_t of the API version in use, so a
// transport fills every field once, whatever the version.
type Properties struct {
	Name                string  // interface or HCA name; also NCCL's topology key
	PCIPath             string  // realpath of the sysfs PCI device; "" for a virtual NIC
	GUID                uint64  // equal GUIDs mean the same physical port
	PtrSupport          PtrType // NCCL_PTR_* bits
	RegIsGlobal         bool    // registrations are not tied to a comm (MR cache)
	ForceFlush          bool    // NCCL must iflush every GPU-direct receive
	Speed               int     // Mbps
	Port                int
	Latency             float32 // microseconds; 0 lets NCCL use its defaults
	MaxComms            int
	MaxRecvs            int   // largest n in a grouped receive
	VDevs               []int // physical devices fused into this one; nil means {dev}
	MaxP2PBytes         int64 // in (0, 2^40]; 0 means MaxNetSizeBytes
	MaxCollBytes        int64 // 0 means MaxCollSize
	MaxMultiRequestSize int   // v11+; 0 means 1
	RailID              int16 // v12; IDUndef when unknown
	PlaneID             int16 // v12; IDUndef when unknown
}

// ConnectOptions carries the per-communicator settings NCCL gives connect
// (v10: the config argument; v11+: the config given to init).
type ConnectOptions struct {
	TrafficClass int // TrafficClassUndef when unset
}

// MemHandle is a transport-defined registration handle. Zero means "no
// registration" (NCCL may pass NULL); a transport must never return zero for a
// successful registration. It travels through NCCL as an opaque pointer value,
// so it must not be a Go pointer.
type MemHandle uintptr

// Request identifies an in-flight operation inside one comm. A transport
// chooses the values: any non-negative int32 (the glue gives NCCL handles of
// its own and keeps the transport's Request beside them); NoRequest means
// "cannot start now, retry".
type Request int32

const (
	NoRequest Request = -1
	// Deprecated: request ids are no longer bounded (any non-negative value
	// works). Kept until every package stops referring to it.
	MaxRequestID Request = 1023
)

// RecvBuffer is one buffer of a (possibly grouped) receive. For Iflush, Size is
// the number of bytes actually received into the buffer.
type RecvBuffer struct {
	Data unsafe.Pointer // host memory, or device memory for PtrCUDA registrations
	Size int
	Tag  int
	MH   MemHandle
}
