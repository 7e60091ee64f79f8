package nccltest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// sentinel fills receive buffers before posting: bytes past what the sender
// sent (and the guard past the buffer) must still hold it afterwards.
const (
	sentinel = 0xA5
	guard    = 256
	// poisonTag is what Irecv's bufs hold after the call; no send uses it.
	poisonTag = -0x5eed
)

// pair is one connection: the sending end and the receiving end.
type pair struct {
	send nccl.SendComm
	recv nccl.RecvComm

	sendClosed, recvClosed bool
}

// connect sets up one connection on the suite's device, calling Listen, then
// Connect and Accept alternately from this goroutine, as NCCL's GDR probe and
// bootstrap do. Closing is registered as cleanup (bounded by CloseTimeout).
func (h *subtest) connect() *pair {
	tr, dev := h.suite.tr, h.suite.opts.Dev
	var lh nccl.Handle
	var l nccl.Listener
	var err error
	h.call("Listen", func() { l, err = tr.Listen(dev, &lh) })
	h.noError(err, "Listen(dev %d)", dev)
	if l == nil {
		h.fatalf("Listen returned a nil listener and no error")
	}
	listenClosed := false
	h.defer_(func() {
		if !listenClosed {
			h.closeBounded("Listener.Close", l.Close)
		}
	})
	// NCCL hands the connector its own copy of the handle and passes that
	// same copy on every retry.
	ch := lh
	p := &pair{}
	h.defer_(func() { h.closePair(p) })
	connects, accepts := 0, 0
	for p.send == nil || p.recv == nil {
		if p.send == nil {
			var s nccl.SendComm
			h.call("Connect", func() { s, err = tr.Connect(dev, &ch, nccl.ConnectOptions{TrafficClass: nccl.TrafficClassUndef}) })
			h.noError(err, "Connect (call %d)", connects+1)
			connects++
			p.send = s
		}
		if p.recv == nil {
			var r nccl.RecvComm
			h.call("Accept", func() { r, err = l.Accept() })
			h.noError(err, "Accept (call %d)", accepts+1)
			accepts++
			p.recv = r
		}
		if h.expired() {
			h.fatalf("connection set-up did not finish before the deadline: Connect done=%v after %d calls, Accept done=%v after %d calls",
				p.send != nil, connects, p.recv != nil, accepts)
		}
		runtime.Gosched()
	}
	listenClosed = true
	h.call("Listener.Close", func() { err = l.Close() })
	h.noError(err, "Listener.Close after a successful Accept")
	return p
}

// closePair closes both ends if still open, each bounded by CloseTimeout.
func (h *subtest) closePair(p *pair) {
	if p.send != nil && !p.sendClosed {
		p.sendClosed = true
		h.closeComm("SendComm.Close", p.send)
	}
	if p.recv != nil && !p.recvClosed {
		p.recvClosed = true
		h.closeComm("RecvComm.Close", p.recv)
	}
}

// closeComm deregisters the test's buffers on c, then closes it (bounded).
func (h *subtest) closeComm(name string, c nccl.Comm) {
	h.deregOn(c)
	h.closeBounded(name, c.Close)
}

// closeBounded calls f and fails the subtest (without waiting further) when it
// does not return within CloseTimeout: NCCL calls close during
// ncclCommAbort, when the peer may be gone, and must not hang there.
func (h *subtest) closeBounded(name string, f func() error) {
	done := make(chan error, 1)
	n := name
	h.op.Store(&n)
	go func() { done <- f() }()
	t := time.NewTimer(h.suite.opts.CloseTimeout)
	defer t.Stop()
	select {
	case err := <-done:
		if err != nil {
			h.errorf("%s: %v", name, err)
		}
	case <-t.C:
		h.errorf("%s did not return within %v (it must not wait for the peer or for outstanding requests)", name, h.suite.opts.CloseTimeout)
	}
	e := ""
	h.op.Store(&e)
}

// fillPattern writes the bytes of message seed into b. Every message of a
// subtest has its own seed, so a message delivered to the wrong receive or at
// the wrong offset shows up as a mismatch, not as plausible data.
func fillPattern(b []byte, seed uint64) {
	x := seed*0x9E3779B97F4A7C15 | 1
	i := 0
	for ; i+8 <= len(b); i += 8 {
		x ^= x >> 12
		x ^= x << 25
		x ^= x >> 27
		binary.LittleEndian.PutUint64(b[i:], x*0x2545F4914F6CDD1D)
	}
	if i < len(b) {
		var tail [8]byte
		x ^= x >> 12
		x ^= x << 25
		x ^= x >> 27
		binary.LittleEndian.PutUint64(tail[:], x*0x2545F4914F6CDD1D)
		copy(b[i:], tail[:])
	}
}

// checkPattern compares got with message seed chunk by chunk (no second buffer
// of the message's size) and describes the first difference.
func checkPattern(got []byte, seed uint64) error {
	// The generator is sequential, so regenerate the message in chunks that
	// are a multiple of 8 bytes long.
	const chunk = 64 << 10
	want := make([]byte, chunk)
	x := seed*0x9E3779B97F4A7C15 | 1
	for off := 0; off < len(got); off += chunk {
		n := min(chunk, len(got)-off)
		for i := 0; i < n; i += 8 {
			x ^= x >> 12
			x ^= x << 25
			x ^= x >> 27
			if i+8 <= chunk {
				binary.LittleEndian.PutUint64(want[i:], x*0x2545F4914F6CDD1D)
			}
		}
		g := got[off : off+n]
		if bytes.Equal(g, want[:n]) {
			continue
		}
		for i := range g {
			if g[i] != want[i] {
				bad := 0
				for j := i; j < n; j++ {
					if g[j] != want[j] {
						bad++
					}
				}
				return fmt.Errorf("byte %d differs (got %#02x, want %#02x); %d of the next %d bytes differ", off+i, g[i], want[i], bad, n-i)
			}
		}
	}
	return nil
}

var sentinelChunk = bytes.Repeat([]byte{sentinel}, 64<<10)

// fillSentinel fills b with the sentinel byte.
func fillSentinel(b []byte) {
	for off := 0; off < len(b); off += len(sentinelChunk) {
		copy(b[off:], sentinelChunk)
	}
}

func checkSentinel(b []byte, from int) error {
	for off := from; off < len(b); off += len(sentinelChunk) {
		end := min(len(b), off+len(sentinelChunk))
		if bytes.Equal(b[off:end], sentinelChunk[:end-off]) {
			continue
		}
		for i := off; i < end; i++ {
			if b[i] != sentinel {
				return fmt.Errorf("byte %d was written (%#02x) but lies past the data received", i, b[i])
			}
		}
	}
	return nil
}

// RecvSpec is one buffer of a grouped receive.
type recvSpec struct {
	cap int
	tag int
}

// sendSpec is one message; slot is the buffer of its group it must land in.
type sendSpec struct {
	size int
	tag  int
	slot int
}

// group is one Irecv (len(bufs) buffers) and the sends that fill it.
type group struct {
	bufs  []recvSpec
	sends []sendSpec
}

func single(size, capacity int) group {
	return group{bufs: []recvSpec{{cap: capacity, tag: 1}}, sends: []sendSpec{{size: size, tag: 1}}}
}

type recvOp struct {
	g      *group
	mem    []*buffer
	seeds  []uint64
	want   []int // size expected in each buffer
	req    nccl.Request
	posted bool
	done   bool
	sizes  []int
}

type sendOp struct {
	g, s   int
	data   *buffer
	seed   uint64
	req    nccl.Request
	posted bool
	done   bool
}

// flow moves a list of groups over one pair. Its step posts what it may and
// tests everything outstanding, never waiting: several flows are stepped in
// turn from one goroutine.
type flow struct {
	h      *subtest
	name   string
	p      *pair
	groups []group

	recvs        []*recvOp
	sends        []*sendOp
	nextR, nextS int
	doneR, doneS int

	// maxRecvs/maxSends bound requests in flight (NCCL's limits by default).
	maxRecvs, maxSends int
	// holdRecvs delays posting receives for that many steps, so sends are
	// posted first (the peer's receive is late).
	holdRecvs int
	// allRecvsFirst posts every receive (as many as may be in flight)
	// before the first send.
	allRecvsFirst bool
	// holdSendTests keeps the send side from being tested until every send is
	// posted, so all of them are in flight at once.
	holdSendTests bool
	// nilSizes tests receives with sizes == nil.
	nilSizes bool
	steps    int
	// noRequest counts consecutive NoRequest answers of the next isend.
	noRequest int
	// sendGap posts one send at a time, sendGap steps after the previous
	// one, so each send is tested while its group's later sends are not
	// posted yet (NCCL's subs sharing a comm reach their isend at different
	// times).
	sendGap, lastSend int
	// bufs is the one slice every Irecv of the flow gets, overwritten after
	// each call, as the glue reuses its own: a transport must copy it.
	bufs []nccl.RecvBuffer
}

func (h *subtest) newFlow(name string, p *pair, groups []group) *flow {
	f := &flow{h: h, name: name, p: p, groups: groups, maxRecvs: nccl.MaxRequests,
		maxSends: nccl.MaxRequests * h.maxRecvs()}
	for gi := range groups {
		g := &groups[gi]
		ro := &recvOp{g: g, mem: make([]*buffer, len(g.bufs)), seeds: make([]uint64, len(g.bufs)),
			want: make([]int, len(g.bufs)), sizes: make([]int, len(g.bufs))}
		for i := range ro.want {
			ro.want[i] = -1
		}
		for si, s := range g.sends {
			seed := h.nextSeed()
			ro.seeds[s.slot] = seed
			ro.want[s.slot] = s.size
			f.sends = append(f.sends, &sendOp{g: gi, s: si, seed: seed})
		}
		f.recvs = append(f.recvs, ro)
	}
	h.mu.Lock()
	h.flows = append(h.flows, f)
	h.mu.Unlock()
	return f
}

func (f *flow) finished() bool { return f.doneR == len(f.recvs) && f.doneS == len(f.sends) }

func (f *flow) inflightR() int { return f.nextR - f.doneR }
func (f *flow) inflightS() int { return f.nextS - f.doneS }

func (f *flow) postRecv() {
	ro := f.recvs[f.nextR]
	if len(f.bufs) < len(ro.g.bufs) {
		f.bufs = make([]nccl.RecvBuffer, len(ro.g.bufs))
	}
	bufs := f.bufs[:len(ro.g.bufs)]
	for i, b := range ro.g.bufs {
		if ro.mem[i] == nil {
			m := f.h.buffer(f.p.recv, b.cap+guard)
			fillSentinel(m.b)
			ro.mem[i] = m
		}
		bufs[i] = nccl.RecvBuffer{Data: ro.mem[i].ptr(), Size: b.cap, Tag: b.tag, MH: ro.mem[i].mh}
	}
	var r nccl.Request
	var err error
	f.h.call("Irecv", func() { r, err = f.p.recv.Irecv(bufs) })
	// bufs is only valid during the call (the glue reuses its slice for the
	// next irecv): poison it, so a transport that kept it instead of copying
	// sees a zero-byte buffer with a tag no send carries.
	for i := range bufs {
		bufs[i] = nccl.RecvBuffer{Size: 0, Tag: poisonTag}
	}
	f.h.noError(err, "%s: Irecv %d (n=%d)", f.name, f.nextR, len(bufs))
	if r == nccl.NoRequest {
		return
	}
	checkRequest(f.h, r, "Irecv")
	for i := f.doneR; i < f.nextR; i++ {
		if o := f.recvs[i]; !o.done && o.req == r {
			f.h.fatalf("%s: Irecv %d returned request %d, which receive %d still holds (Test has not reported it done): a request id may be reused only after Test reported it done or failed", f.name, f.nextR, r, i)
		}
	}
	ro.req, ro.posted = r, true
	f.nextR++
}

func (f *flow) postSend() {
	so := f.sends[f.nextS]
	spec := f.groups[so.g].sends[so.s]
	if so.data == nil {
		so.data = f.h.buffer(f.p.send, spec.size)
		fillPattern(so.data.b, so.seed)
	}
	var r nccl.Request
	var err error
	f.h.call("Isend", func() { r, err = f.p.send.Isend(so.data.ptr(), spec.size, spec.tag, so.data.mh) })
	f.h.noError(err, "%s: Isend %d (%d bytes, tag %d)", f.name, f.nextS, spec.size, spec.tag)
	if r == nccl.NoRequest {
		f.noRequest++
		return
	}
	checkRequest(f.h, r, "Isend")
	for i := f.doneS; i < f.nextS; i++ {
		if o := f.sends[i]; !o.done && o.req == r {
			f.h.fatalf("%s: Isend %d returned request %d, which send %d still holds (Test has not reported it done): a request id may be reused only after Test reported it done or failed", f.name, f.nextS, r, i)
		}
	}
	f.noRequest = 0
	so.req, so.posted = r, true
	f.nextS++
}

func checkRequest(h *subtest, r nccl.Request, call string) {
	if r < 0 {
		h.fatalf("%s returned request %d; requests are non-negative (nccl.NoRequest means retry)", call, r)
	}
}

// step posts and tests once; it reports whether the flow is finished.
func (f *flow) step() bool {
	f.steps++
	h := f.h
	// Post receives.
	for f.nextR < len(f.recvs) && f.inflightR() < f.maxRecvs && f.steps > f.holdRecvs {
		before := f.nextR
		f.postRecv()
		if f.nextR == before {
			break
		}
	}
	// Post sends (after all receives when asked).
	if !f.allRecvsFirst || f.nextR == len(f.recvs) || f.inflightR() == f.maxRecvs {
		for f.nextS < len(f.sends) && f.inflightS() < f.maxSends {
			if f.sendGap > 0 && f.nextS > 0 && f.steps-f.lastSend < f.sendGap {
				break
			}
			before := f.nextS
			f.postSend()
			if f.nextS == before {
				break
			}
			if f.sendGap > 0 {
				f.lastSend = f.steps
				break
			}
		}
	}
	// Test every outstanding receive, oldest first (NCCL tests the oldest per
	// connection but interleaves connections sharing a comm, so a transport
	// must answer for any request).
	for i := f.doneR; i < f.nextR; i++ {
		ro := f.recvs[i]
		if ro.done {
			continue
		}
		var done bool
		var err error
		sizes := ro.sizes
		if f.nilSizes {
			sizes = nil
		}
		h.call("RecvComm.Test", func() { done, err = f.p.recv.Test(ro.req, sizes) })
		h.noError(err, "%s: Test of receive %d", f.name, i)
		if done {
			ro.done = true
			f.verifyRecv(i, ro)
		}
	}
	for f.doneR < f.nextR && f.recvs[f.doneR].done {
		f.doneR++
	}
	if !f.holdSendTests || f.nextS == len(f.sends) {
		for i := f.doneS; i < f.nextS; i++ {
			so := f.sends[i]
			if so.done {
				continue
			}
			var done bool
			var n int
			var err error
			h.call("SendComm.Test", func() { done, n, err = f.p.send.Test(so.req) })
			h.noError(err, "%s: Test of send %d", f.name, i)
			if done {
				so.done = true
				if n != len(so.data.b) {
					h.errorf("%s: send %d of %d bytes reported %d bytes sent", f.name, i, len(so.data.b), n)
				}
				// Done means NCCL may reuse the buffer at once: whatever the
				// transport still reads from it now is no longer the message
				// (zeros, which no pattern holds for long). clear, not a byte
				// loop: the lane runs this under -race in an emulated guest.
				clear(so.data.b)
				h.free(so.data)
				so.data = nil
			}
		}
		for f.doneS < f.nextS && f.sends[f.doneS].done {
			f.doneS++
		}
	}
	return f.finished()
}

func (f *flow) verifyRecv(i int, ro *recvOp) {
	h := f.h
	for b := range ro.g.bufs {
		want := ro.want[b]
		got := want
		if !f.nilSizes {
			got = ro.sizes[b]
			if got != want {
				h.errorf("%s: receive %d buffer %d (tag %d, capacity %d): Test reported %d bytes, the sender sent %d",
					f.name, i, b, ro.g.bufs[b].tag, ro.g.bufs[b].cap, got, want)
				continue
			}
		}
		if want < 0 {
			continue
		}
		if err := checkPattern(ro.mem[b].b[:want], ro.seeds[b]); err != nil {
			h.errorf("%s: receive %d buffer %d (tag %d, %d bytes): data corrupt: %v", f.name, i, b, ro.g.bufs[b].tag, want, err)
		}
		if err := checkSentinel(ro.mem[b].b, want); err != nil {
			h.errorf("%s: receive %d buffer %d (capacity %d, %d bytes received): %v", f.name, i, b, ro.g.bufs[b].cap, want, err)
		}
		h.free(ro.mem[b])
		ro.mem[b] = nil
	}
	if h.failed() {
		runtime.Goexit()
	}
}

func (f *flow) status() string {
	s := fmt.Sprintf("%s: receives done %d/%d (posted %d), sends done %d/%d (posted %d)",
		f.name, f.doneR, len(f.recvs), f.nextR, f.doneS, len(f.sends), f.nextS)
	if f.noRequest > 0 && f.nextS < len(f.sends) {
		s += fmt.Sprintf("; Isend %d has returned NoRequest %d times in a row", f.nextS, f.noRequest)
	}
	return s
}

// pump steps every flow until all are finished, failing at the deadline with
// the state of each (a transport that never completes is not a hang inside a
// call, but it is just as fatal to NCCL).
func (h *subtest) pump(flows ...*flow) {
	for {
		all := true
		for _, f := range flows {
			if !f.finished() && !f.step() {
				all = false
			}
		}
		if all {
			return
		}
		if h.expired() {
			st := make([]string, len(flows))
			hint := ""
			for i, f := range flows {
				st[i] = f.status()
				if f.doneR < f.nextR {
					// Sends may be waiting for these receives, so whether
					// they completed says nothing.
					hint = "\n(receives still pending: if Irecv keeps its bufs slice instead of copying it, it now reads a 0-byte buffer with a tag no send carries; the slice is only valid during the call)"
				}
			}
			h.fatalf("transfers did not complete before the deadline:\n  %s%s", strings.Join(st, "\n  "), hint)
		}
		runtime.Gosched()
	}
}

func (h *subtest) nextSeed() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seed++
	return h.seed
}

func (h *subtest) props() nccl.Properties {
	var p nccl.Properties
	var err error
	h.call("Properties", func() { p, err = h.suite.tr.Properties(h.suite.opts.Dev) })
	h.noError(err, "Properties(%d)", h.suite.opts.Dev)
	return p
}

// maxRecvs is the device's MaxRecvs, capped at the 64 buffers NCCL groups at
// most (NCCL_PROXY_MAX_SUBS), as the glue caps it.
func (h *subtest) maxRecvs() int {
	n := h.props().MaxRecvs
	if n < 1 {
		n = 1
	}
	return min(n, 64)
}
