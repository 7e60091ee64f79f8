package softnic

import (
	"errors"
	"fmt"

	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
)

// ErrUseAfterFree wraps the error of every call the model refuses because
// its object (context, PD, CQ, QP or MR) was already destroyed, or because
// it belongs to a closed context. libibverbs would touch freed memory there;
// the model refuses the call and records it (Fabric.Violations), so a test
// that only checks the transport's result codes still sees the bug.
var ErrUseAfterFree = errors.New("softnic: use of a destroyed verbs object")

// violationLocked records a use-after-free or a leak and returns the error
// the refused call reports. f.mu is held.
func (f *Fabric) violationLocked(format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	f.violations = append(f.violations, msg)
	return fmt.Errorf("softnic: %s: %w", msg, ErrUseAfterFree)
}

// Violations returns every refused call on a destroyed object and every
// leak seen so far (a PD deallocated or a context closed while objects
// created from it were still alive), in order.
func (f *Fabric) Violations() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.violations...)
}

// WRRecord is one posted work request as the model saw it at post time.
type WRRecord struct {
	Device     string
	QPNum      uint32
	Recv       bool // a receive WR (Opcode, Flags, RKey, RemoteAddr and Imm unused)
	WRID       uint64
	Opcode     verbs.Opcode
	Flags      verbs.SendFlags
	NumSGE     int
	Length     uint32 // SGE length (0 without an SGE)
	RKey       uint32
	RemoteAddr uint64
	Imm        uint32
}

// Signaled and Inline are shorthands for the flags tests assert on.
func (r WRRecord) Signaled() bool { return r.Flags&verbs.SendSignaled != 0 }
func (r WRRecord) Inline() bool   { return r.Flags&verbs.SendInline != 0 }

func (r WRRecord) String() string {
	if r.Recv {
		return fmt.Sprintf("%s qp %#x RECV sge=%d len=%d", r.Device, r.QPNum, r.NumSGE, r.Length)
	}
	s := fmt.Sprintf("%s qp %#x %v sge=%d len=%d", r.Device, r.QPNum, r.Opcode, r.NumSGE, r.Length)
	if r.Signaled() {
		s += " signaled"
	}
	if r.Inline() {
		s += " inline"
	}
	return s
}

// Record turns the work-request log on (clearing it) or off. While on, every
// PostSend and PostRecv appends one WRRecord per WR, so tests can assert the
// exact sequence a transport posts in each mode. Recording allocates; leave it
// off in benchmarks.
func (f *Fabric) Record(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.recording = on
	f.records = nil
}

// Records returns the work requests posted since Record(true).
func (f *Fabric) Records() []WRRecord {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]WRRecord(nil), f.records...)
}

func (q *qp) recordSendLocked(wr *verbs.SendWR) {
	f := q.dev.fabric
	if !f.recording {
		return
	}
	r := WRRecord{Device: q.dev.cfg.Name, QPNum: q.num, WRID: wr.WRID, Opcode: wr.Opcode, Flags: wr.Flags,
		NumSGE: int(wr.NumSGE), RKey: wr.RKey, RemoteAddr: wr.RemoteAddr, Imm: wr.Imm}
	if wr.NumSGE > 0 {
		r.Length = wr.SGE.Length
	}
	f.records = append(f.records, r)
}

func (q *qp) recordRecvLocked(wr *verbs.RecvWR) {
	f := q.dev.fabric
	if !f.recording {
		return
	}
	r := WRRecord{Device: q.dev.cfg.Name, QPNum: q.num, Recv: true, WRID: wr.WRID, NumSGE: int(wr.NumSGE)}
	if wr.NumSGE > 0 {
		r.Length = wr.SGE.Length
	}
	f.records = append(f.records, r)
}

// MRInfo describes one live memory registration.
type MRInfo struct {
	Addr, Length uint64
	Access       verbs.Access
	DMABuf       bool
	LKey, RKey   uint32
}

// MRs lists the device's live registrations (tests check the access flags a
// transport requested, e.g. relaxed ordering).
func (d *Device) MRs() []MRInfo {
	d.fabric.mu.Lock()
	defer d.fabric.mu.Unlock()
	out := make([]MRInfo, 0, len(d.mrs))
	for _, m := range d.mrs {
		out = append(out, MRInfo{Addr: m.addr, Length: m.length, Access: m.access, DMABuf: m.mapping != nil, LKey: m.key, RKey: m.key})
	}
	return out
}
