package shm

import (
	"errors"
	"fmt"

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
	sidePid   = 0  // u64, in the writer's PID namespace (for messages)
	sidePidNS = 8  // u64, inode of /proc/self/ns/pid: same pid and namespace = same process
	sideLock  = 16 // 1 byte the end holds a POSIX write lock on while its process lives
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

// region is one mapped connection file. It keeps the file open: the POSIX
// lock on our side's byte lives as long as this process does (liveness.go).
// Its descriptor is in this process's table of connection files (sweep.go).
type region struct {
	mem      []byte
	fd       int // -1 once released
	id       fileID
	side     int // the side whose lock this region holds; -1: none
	path     string
	ringSize uint64
	ring     []byte
	linked   bool // the file still has a name to unlink
	h        hdr  // typed views into mem (region_unsafe.go)
}

// errLostName: a sweep in another process took the file createRegion had
// just made for an orphan; Listen tries another name.
var errLostName = errors.New("the new connection file was taken by another process's sweep")

// createRegion makes a new connection file and maps it. The listener's lock is
// taken first, so that from then on no sweep removes the file; fallocate
// commits the pages: on a full tmpfs a lazily allocated page would SIGBUS in
// the middle of a copy instead of failing listen with a message.
func createRegion(path string, ringSize uint64) (*region, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, nccl.Errorf(nccl.SystemError, "%s : cannot create %s: %w (set NCCL_GO_SHM_DIR to a writable tmpfs directory)", logPrefix, path, err)
	}
	var st unix.Stat_t
	id, err := trackFD(fd, &st)
	if err != nil {
		_ = unix.Close(fd)
		_ = unix.Unlink(path)
		return nil, nccl.Errorf(nccl.SystemError, "%s : fstat %s: %v", logPrefix, path, err)
	}
	r := &region{fd: fd, id: id, side: -1, path: path, linked: true}
	fail := func(err error) (*region, error) {
		r.unlink(nil)
		r.release()
		return nil, err
	}
	if err := r.lock(sideRecv); err != nil {
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
			r.linked = false // the sweep that holds it removes it
			return fail(errLostName)
		}
		return fail(nccl.Errorf(nccl.SystemError, "%s : cannot lock %s: %v (the directory's filesystem must support POSIX locks; set NCCL_GO_SHM_DIR to a tmpfs)", logPrefix, path, err))
	}
	// Between the create and the lock a sweep may have found the file
	// unlocked and removed it: then the name is not ours any more.
	if err := unix.Lstat(path, &st); err != nil || statID(&st) != id {
		r.linked = false
		return fail(errLostName)
	}
	size := int64(headerSize + ringSize)
	if err := unix.Fallocate(fd, 0, 0, size); err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return fail(nccl.Errorf(nccl.SystemError, "%s : no space for %d bytes in %s: %w (enlarge that tmpfs, e.g. docker --shm-size, lower NCCL_GO_SHM_RING_SIZE or set NCCL_GO_SHM_DIR)", logPrefix, size, path, err))
		}
		if err := unix.Ftruncate(fd, size); err != nil { // a filesystem without fallocate
			return fail(nccl.Errorf(nccl.SystemError, "%s : cannot size %s: %v", logPrefix, path, err))
		}
	}
	if err := r.mapFile(size); err != nil {
		return fail(err)
	}
	r.ringSize = ringSize
	r.ring = r.mem[headerSize:]
	return r, nil
}

// openRegion maps an existing connection file and checks its header.
func openRegion(path string) (*region, error) {
	// O_NOFOLLOW and O_NONBLOCK: whatever sits at the path, opening it must
	// neither follow a planted link nor block (a FIFO); only a regular file
	// of a connection file's size is mapped.
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, nccl.Errorf(nccl.SystemError, "%s : %s does not exist: the listener closed it, or it runs on another host (the shm transport only connects ranks of one host)", logPrefix, path)
		}
		return nil, nccl.Errorf(nccl.SystemError, "%s : cannot open %s: %v", logPrefix, path, err)
	}
	var st unix.Stat_t
	id, err := trackFD(fd, &st)
	if err != nil {
		_ = unix.Close(fd)
		return nil, nccl.Errorf(nccl.SystemError, "%s : fstat %s: %v", logPrefix, path, err)
	}
	r := &region{fd: fd, id: id, side: -1, path: path}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size < headerSize+minRing || st.Size > headerSize+maxRing {
		r.release()
		return nil, nccl.Errorf(nccl.InvalidUsage, "%s : %s is not a connection file (mode %#o, %d bytes)", logPrefix, path, st.Mode, st.Size)
	}
	if err := r.mapFile(st.Size); err != nil {
		r.release()
		return nil, err
	}
	rs, err := checkHeader(r.h, uint64(st.Size))
	if err != nil {
		r.release()
		return nil, nccl.Errorf(nccl.InvalidUsage, "%s : %s %v", logPrefix, path, err)
	}
	r.ringSize = rs
	r.ring = r.mem[headerSize:]
	return r, nil
}

// checkHeader validates what a listener wrote before a connector trusts any
// of it (the file could be anything a same-uid process put at that path). It
// returns the ring size.
func checkHeader(h hdr, fileSize uint64) (uint64, error) {
	if h.u64(offMagic).Load() != fileMagic || h.u32(offVersion).Load() != layoutVersion {
		return 0, fmt.Errorf("is not a connection file of this shm transport version")
	}
	rs := h.u64(offRingSize).Load()
	if rs < minRing || rs > maxRing || rs&(rs-1) != 0 || fileSize != headerSize+rs || h.u32(offMaxRecvs).Load() != maxRecvs {
		return 0, fmt.Errorf("has an inconsistent header (ring %d bytes, file %d bytes)", rs, fileSize)
	}
	return rs, nil
}

// mapFile maps the region's file.
func (r *region) mapFile(size int64) error {
	mem, err := unix.Mmap(r.fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nccl.Errorf(nccl.SystemError, "%s : mmap %s (%d bytes): %v", logPrefix, r.path, size, err)
	}
	r.mem = mem
	r.h = newHdr(mem)
	return nil
}

// lock takes side's lock (lockSide) for this region.
func (r *region) lock(side int) error {
	if err := lockTracked(r.fd, r.id, side); err != nil {
		return err
	}
	r.side = side
	return nil
}

// unlink removes the file's name if it still names this file; the mappings
// stay valid. Idempotent.
func (r *region) unlink(log nccl.Logger) {
	if !r.linked {
		return
	}
	r.linked = false
	if err := unlinkIfSame(r.path, r.id); err != nil && !errors.Is(err, unix.ENOENT) && log != nil {
		log.Warnf("%s : cannot remove %s: %v; delete it by hand", logPrefix, r.path, err)
	}
}

// release unmaps the file and gives up its descriptor, which drops our lock:
// to the peer we are gone (after a Close, the close flag tells it we left on
// purpose). While another region of this process has the file open, the
// descriptor stays open and only our byte is unlocked (sweep.go).
func (r *region) release() {
	if r.mem != nil {
		_ = unix.Munmap(r.mem)
		r.mem, r.ring = nil, nil
		r.h = hdr{}
	}
	if r.fd >= 0 {
		untrackFD(r.fd, r.id, r.side)
		r.fd, r.side = -1, -1
	}
}
