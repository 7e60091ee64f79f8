package nccl

import (
	"strconv"
)

// Limits and constants of the NCCL net API.
const (
	HandleSize      = 128       // NCCL_NET_HANDLE_MAXSIZE: bytes NCCL copies to the peer
	MaxRequests     = 32        // NCCL_NET_MAX_REQUESTS per comm (send side: × MaxRecvs)
	MaxNetSize      = 1 << 30   // largest single isend/irecv NCCL issues (NCCL_MAX_NET_SIZE)
	MaxNetSizeBytes = 1 << 40   // upper bound for MaxP2PBytes / MaxCollBytes
	MaxCollSize     = 512 << 20 // MaxCollBytes for a device that leaves it 0, as NCCL's own transports report
	// MaxGroupedRecvs bounds n in a grouped irecv: NCCL's proxy groups at
	// most NCCL_PROXY_MAX_SUBS (64) receives, and never more than MaxRecvs.
	MaxGroupedRecvs = 64
	DefaultSpeed    = 10000 // Mbps reported for a device whose Speed is 0

	TrafficClassUndef = -1 // ConnectOptions.TrafficClass when NCCL gave none
)

// PtrType is a bit set of NCCL_PTR_* values: the memory kinds a device can
// register, and the type argument of RegMr.
type PtrType int

// Memory kinds (NCCL_PTR_*).
const (
	PtrHost   PtrType = 0x1 // host memory; every device supports it
	PtrCUDA   PtrType = 0x2 // GPU memory the NIC reads and writes directly (GPUDirect RDMA)
	PtrDMABuf PtrType = 0x4 // GPU memory registered through a dma-buf fd (DMABufRegistrar)
)

// Handle is the opaque connection handle that listen fills and NCCL copies, as
// is, to the connecting peer. The connector may also keep retry state in its own
// copy, because NCCL passes the same buffer on every connect retry.
type Handle [HandleSize]byte

// OptionalID is a rail or plane number that may be unknown. The zero value is
// unknown, so a transport that has none leaves the field alone and the glue
// reports NCCL's "undefined" (-1); KnownID(n) sets one.
type OptionalID struct {
	id  int16
	set bool
}

// KnownID returns the identifier n (0 to 32767; other values are unknown).
func KnownID(n int) OptionalID {
	if n < 0 || n > 1<<15-1 {
		return OptionalID{}
	}
	return OptionalID{id: int16(n), set: true}
}

// Get returns the identifier and whether it is known.
func (o OptionalID) Get() (int, bool) { return int(o.id), o.set }

// String is the identifier in decimal, or "undefined".
func (o OptionalID) String() string {
	if !o.set {
		return "undefined"
	}
	return strconv.Itoa(int(o.id))
}

// Properties describes one device as NCCL's getProperties reports it. The glue
// converts it to the ncclNetProperties_vN_t of the API version in use, so a
// transport fills every field once, whatever the version. A field left zero
// gets NCCL's default from the glue, as each comment says.
type Properties struct {
	Name                string     // interface or HCA name; also NCCL's topology key
	PCIPath             string     // realpath of the sysfs PCI device; "" for a virtual NIC
	GUID                uint64     // equal GUIDs mean the same physical port
	PtrSupport          PtrType    // NCCL_PTR_* bits; 0 means PtrHost
	RegIsGlobal         bool       // registrations are not tied to a comm (MR cache)
	ForceFlush          bool       // NCCL must iflush every GPU-direct receive
	Speed               int        // Mbps; 0 means 10000
	Port                int        // the NIC's port number (IB: the verbs port); 0 for a virtual NIC
	Latency             float32    // microseconds; 0 lets NCCL use its defaults
	MaxComms            int        // connections the device can hold (IB: max_qp); nccltest requires it; 0 means 1
	MaxRecvs            int        // largest n in a grouped receive; 0 means 1
	VDevs               []int      // physical devices fused into this one; nil means {dev}
	MaxP2PBytes         int64      // in (0, 2^40]; 0 means MaxNetSizeBytes
	MaxCollBytes        int64      // 0 means MaxCollSize
	MaxMultiRequestSize int        // v11+; 0 means 1
	RailID              OptionalID // v12; zero value: undefined
	PlaneID             OptionalID // v12; zero value: undefined
}

// WithDefaults is p as NCCL gets it from the glue: every field left zero
// gets the default its comment gives (Name "<transport><dev>"), and what NCCL
// would reject is brought into range (MaxP2PBytes and MaxCollBytes, MaxRecvs
// to 1..MaxGroupedRecvs). Tools that show what NCCL sees use it too.
func (p Properties) WithDefaults(transport string, dev int) Properties {
	if p.Name == "" {
		p.Name = transport + strconv.Itoa(dev)
	}
	if p.MaxP2PBytes <= 0 || p.MaxP2PBytes > MaxNetSizeBytes {
		p.MaxP2PBytes = MaxNetSizeBytes
	}
	if p.MaxCollBytes <= 0 || p.MaxCollBytes > MaxNetSizeBytes {
		p.MaxCollBytes = MaxCollSize
	}
	if p.MaxMultiRequestSize < 1 {
		p.MaxMultiRequestSize = 1
	}
	p.MaxRecvs = min(max(p.MaxRecvs, 1), MaxGroupedRecvs)
	if p.MaxComms < 1 {
		p.MaxComms = 1
	}
	if p.Speed <= 0 {
		p.Speed = DefaultSpeed
	}
	if p.PtrSupport == 0 {
		p.PtrSupport = PtrHost
	}
	if len(p.VDevs) == 0 {
		p.VDevs = []int{dev}
	}
	return p
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

// NoRequest is what Isend and Irecv return when the operation cannot start
// yet (no credit, no free slot): the glue hands NCCL a NULL request and NCCL
// retries. From Iflush it means "nothing to flush".
const NoRequest Request = -1
