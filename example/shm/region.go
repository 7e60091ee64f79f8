package shm

import (
	"errors"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Layout of a connection file. The header words live on their own 128-byte
// lines so that the sender's and the receiver's counters never share a cache
// line (or an adjacent-line prefetch pair).
const (
	maxRecvs = 8                   // largest grouped receive (Properties.MaxRecvs)
	ctsSlots = nccl.MaxRequests    // receives in flight per comm
	descCap  = ctsSlots * maxRecvs // sends in flight per comm

	fileMagic     = 0x314d48532d4f474e // "NGO-SHM1"
	layoutVersion = 1

	offMagic       = 0   // u64
	offVersion     = 8   // u32
	offMaxRecvs    = 12  // u32
	offRingSize    = 16  // u64
	offState       = 24  // u32, connection state (st*)
	offNonce       = 32  // [32]byte, written by the listener at listen
	offConnProof   = 64  // [32]byte, HMAC by the connector
	offAcceptProof = 96  // [32]byte, HMAC by the listener
	offSides       = 128 // two sideInfo blocks of sideSize bytes
	sideSize       = 64
	offSendLine    = 256 // sender-written counters
	offRecvLine    = 384 // receiver-written counters
	offCTS         = 512
	ctsSlotSize    = 128
	offDesc        = offCTS + ctsSlots*ctsSlotSize
	descSize       = 24
	headerSize     = 16384 // page aligned; the data ring follows
)

// The header must hold the descriptor array.
var _ [headerSize - (offDesc + descCap*descSize)]byte

// Fields of a sideInfo block (one per end: sideRecv is the listener).
const (
	sidePid   = 0  // u64
	sidePidNS = 8  // u64, inode of /proc/self/ns/pid
	sideBeat  = 16 // u64, heartbeat counter
	sideClose = 24 // u32, 1 once the end closed
)

const (
	sideRecv = 0
	sideSend = 1
)

// Connection states in offState.
const (
	stListening      = iota + 1
	stClaimed        // a connector won the claim and is writing its proof
	stProved         // the connector's proof is ready for the listener
	stAccepted       // the listener verified it and answered
	stRejected       // the proof was wrong; the connector resets to stListening
	stListenerClosed // the listener went away before accepting
)

// Fields of a CTS slot.
const (
	ctsSeq   = 0  // u64: index+1 once published
	ctsN     = 8  // u32
	ctsSizes = 16 // [maxRecvs]u64
	ctsTags  = 80 // [maxRecvs]i32
)

// Fields of a send descriptor.
const (
	descIdx   = 0  // u64: CTS index of the matched receive
	descEntry = 8  // u32: buffer inside it
	descFlags = 12 // u32
	descBytes = 16 // u64: message size
	flagTrunc = 1  // the message did not fit; no bytes follow
)

const (
	minRing     = 64 << 10
	maxRing     = 256 << 20
	defaultRing = 1 << 20
)

// region is one mapped connection file.
type region struct {
	mem      []byte
	path     string
	ringSize uint64
	ring     []byte
	linked   bool // the file still has a name to unlink
	h        hdr  // typed views into mem (region_unsafe.go)
}

func ringSizeSetting(log nccl.Logger) uint64 {
	n := nccl.EnvInt(log, "NCCL_GO_SHM_RING_SIZE", defaultRing)
	if n < minRing || n > maxRing || n&(n-1) != 0 {
		if log != nil {
			log.Warnf("NET/Shm : ignoring NCCL_GO_SHM_RING_SIZE=%d: expected a power of two from %d to %d; using %d", n, minRing, maxRing, defaultRing)
		}
		n = defaultRing
	}
	return uint64(n)
}

// createRegion makes a new connection file and maps it. fallocate commits the
// pages now: on a full tmpfs a lazily allocated page would SIGBUS in the middle
// of a copy instead of failing listen with a message.
func createRegion(path string, ringSize uint64) (*region, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "NET/Shm : cannot create %s: %v (set NCCL_GO_SHM_DIR to a writable tmpfs directory)", path, err)
	}
	defer unix.Close(fd)
	size := int64(headerSize + ringSize)
	if err := unix.Fallocate(fd, 0, 0, size); err != nil {
		_ = unix.Unlink(path)
		if errors.Is(err, unix.ENOSPC) {
			return nil, nccl.Errorf(nccl.SystemError, "NET/Shm : no space for %d bytes in %s: %v (enlarge that tmpfs, e.g. docker --shm-size, lower NCCL_GO_SHM_RING_SIZE or set NCCL_GO_SHM_DIR)", size, path, err)
		}
		if err := unix.Ftruncate(fd, size); err != nil { // a filesystem without fallocate
			return nil, nccl.Errorf(nccl.SystemError, "NET/Shm : cannot size %s: %v", path, err)
		}
	}
	r, err := mapRegion(fd, path, size)
	if err != nil {
		_ = unix.Unlink(path)
		return nil, err
	}
	r.linked = true
	r.ringSize = ringSize
	r.ring = r.mem[headerSize:]
	return r, nil
}

// openRegion maps an existing connection file and checks its header.
func openRegion(path string) (*region, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, nccl.Errorf(nccl.SystemError, "NET/Shm : %s does not exist: the listener closed it, or it runs on another host (the shm transport only connects ranks of one host)", path)
		}
		return nil, nccl.Errorf(nccl.SystemError, "NET/Shm : cannot open %s: %v", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "NET/Shm : fstat %s: %v", path, err)
	}
	if st.Size < headerSize+minRing {
		return nil, nccl.Errorf(nccl.InvalidUsage, "NET/Shm : %s is %d bytes, too small to be a connection file", path, st.Size)
	}
	r, err := mapRegion(fd, path, st.Size)
	if err != nil {
		return nil, err
	}
	if r.h.u64(offMagic).Load() != fileMagic || r.h.u32(offVersion).Load() != layoutVersion {
		r.unmap()
		return nil, nccl.Errorf(nccl.InvalidUsage, "NET/Shm : %s is not a connection file of this shm transport version", path)
	}
	rs := r.h.u64(offRingSize).Load()
	if rs < minRing || rs > maxRing || uint64(st.Size) != headerSize+rs || r.h.u32(offMaxRecvs).Load() != maxRecvs {
		r.unmap()
		return nil, nccl.Errorf(nccl.InvalidUsage, "NET/Shm : %s has an inconsistent header (ring %d bytes, file %d bytes)", path, rs, st.Size)
	}
	r.ringSize = rs
	r.ring = r.mem[headerSize:]
	return r, nil
}

func mapRegion(fd int, path string, size int64) (*region, error) {
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "NET/Shm : mmap %s (%d bytes): %v", path, size, err)
	}
	r := &region{mem: mem, path: path}
	r.h = newHdr(mem)
	return r, nil
}

// unlink removes the file's name; the mappings stay valid. Idempotent.
func (r *region) unlink(log nccl.Logger) {
	if !r.linked {
		return
	}
	r.linked = false
	if err := unix.Unlink(r.path); err != nil && !errors.Is(err, unix.ENOENT) && log != nil {
		log.Warnf("NET/Shm : cannot remove %s: %v; delete it by hand", r.path, err)
	}
}

func (r *region) unmap() {
	if r.mem != nil {
		_ = unix.Munmap(r.mem)
		r.mem, r.ring = nil, nil
		r.h = hdr{}
	}
}
