package plugin

import "github.com/libnccl-net-go/libnccl-net-go/nccl"

// Every request NCCL holds is a slot of the glue's own per-comm request table,
// not the transport's id: the glue keeps its accounting (start time, size,
// stall schedule, profiler events) there and stores the transport's Request
// beside it, so a transport may number its requests however it likes. Only the
// comm's progress thread posts and tests (nccl-net-api.md §3.1), so the table
// needs neither locks nor atomics; it is sized once, at connect/accept.
//
// A request handle packs the comm's slot and generation with the request slot
// and that slot's own generation, bumped each time the slot is freed:
//
//	bits 63..56 tagRequest | 55..40 comm generation (low 16 bits) | 39..24 comm slot | 23..12 request generation | 11..0 request slot
//
// so a handle NCCL tests after it reported done, or one from a closed comm,
// is recognised as stale instead of reaching another request.
const (
	tagRequest = 0x51 // 'Q'

	reqSlotBits = 12
	reqGenBits  = 12
	maxReqSlots = 1 << reqSlotBits
	reqSlotMask = maxReqSlots - 1
	reqGenMask  = 1<<reqGenBits - 1

	// minReqSlots covers NCCL_NET_MAX_REQUESTS receives plus their flushes
	// even for a device with MaxRecvs 1.
	minReqSlots = 2 * nccl.MaxRequests
)

// The comm slot must fit its 16 bits of a request handle.
var _ [16 - slotBits]struct{}

func requestHandle(commGen, commSlot uint32, gen uint16, idx int) uintptr {
	return uintptr(tagRequest)<<56 | uintptr(commGen&0xffff)<<40 | uintptr(commSlot&0xffff)<<24 |
		uintptr(gen&reqGenMask)<<reqSlotBits | uintptr(idx&reqSlotMask)
}

func splitRequestHandle(h uintptr) (ok bool, commGen16, commSlot uint32, gen uint16, idx int) {
	if uint8(h>>56) != tagRequest {
		return false, 0, 0, 0, 0
	}
	return true, uint32(h>>40) & 0xffff, uint32(h>>24) & 0xffff, uint16(h>>reqSlotBits) & reqGenMask, int(h & reqSlotMask)
}

// reqCapacity is how many requests a comm of a device with maxRecvs may have
// in flight: NCCL posts up to NCCL_NET_MAX_REQUESTS × maxRecvs sends on one
// comm (README), and a receive comm holds each receive's flush too. Requests
// beyond it are refused with a NULL request (NCCL retries), never an error.
func reqCapacity(maxRecvs int) int {
	want := 2 * nccl.MaxRequests * max(maxRecvs, 1)
	n := minReqSlots
	for n < want && n < maxReqSlots {
		n <<= 1
	}
	return n
}

// reqState is the glue's view of one in-flight request.
type reqState struct {
	id      nccl.Request // the transport's request
	gen     uint16       // generation of this slot (see requestHandle)
	active  bool
	flush   bool
	stalled bool
	events  int8  // profiler events started (0..maxProfEvents)
	polls   uint8 // tests while pending, mod 256 (paces the stall check)
	n       int32 // buffers of a grouped receive
	size    int64 // bytes posted (send) or capacity (receive)
	start   int64 // clock at post
	warn    stallSchedule
}

// reqTable is a comm's request slots and the stack of free ones
// (free[:nfree]).
type reqTable struct {
	slots []reqState
	free  []uint16
	nfree int
}

func newReqTable(n int) reqTable {
	t := reqTable{slots: make([]reqState, n), free: make([]uint16, n), nfree: n}
	for i := range t.free {
		t.free[i] = uint16(n - 1 - i) // hand out slot 0 first
	}
	return t
}

// alloc takes a free slot; false when all are in flight.
func (t *reqTable) alloc() (int, bool) {
	if t.nfree == 0 {
		return 0, false
	}
	t.nfree--
	return int(t.free[t.nfree]), true
}

// release returns slot idx; any handle that named it becomes stale.
func (t *reqTable) release(idx int) {
	r := &t.slots[idx]
	r.active = false
	r.gen = (r.gen + 1) & reqGenMask
	t.free[t.nfree] = uint16(idx)
	t.nfree++
}
