package nccltest

import (
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// cases are the subtests, in the order they run. Names are stable: they are
// what Options.Skip and `go test -run` select.
var cases = []struct {
	name string
	body func(h *subtest)
}{
	{"Properties", testProperties},
	{"ConnectAlternating", testConnect},
	{"ListenerCloseUnused", testListenerClose},
	{"ZeroByte", testZeroByte},
	{"Sizes", testSizes},
	{"RecvLargerThanSend", testRecvLarger},
	{"Truncation", testTruncation},
	{"GroupedDistinctTags", testGroupedDistinct},
	{"GroupedEqualTags", testGroupedEqual},
	{"GroupedSendsOneAtATime", testGroupedOneAtATime},
	{"FIFO", testFIFO},
	{"SendBeforeRecv", testSendBeforeRecv},
	{"InFlight", testInFlight},
	{"LongLivedComm", testLongLived},
	{"Bidirectional", testBidirectional},
	{"ManyComms", testManyComms},
	{"TestNilSizes", testNilSizes},
	{"RegMr", testRegMr},
	{"RegMrConcurrent", testRegMrConcurrent},
	{"ConcurrentSetup", testConcurrentSetup},
	{"SenderClosesFirst", testSenderClosesFirst},
	{"CloseOutstanding", testCloseOutstanding},
	{"DeregMrFence", testDeregMrFence},
	{"SenderClosedFailsPending", testSenderClosedFailsPending},
}

func testProperties(h *subtest) {
	tr := h.suite.tr
	var n int
	h.call("Devices", func() { n = tr.Devices() })
	if n <= 0 {
		h.fatalf("Devices() = %d after a successful Init; NCCL disables a plugin with no device", n)
	}
	if h.suite.opts.Dev >= n {
		h.fatalf("Options.Dev = %d but the transport has %d devices", h.suite.opts.Dev, n)
	}
	for d := 0; d < n; d++ {
		var p nccl.Properties
		var err error
		h.call("Properties", func() { p, err = tr.Properties(d) })
		h.noError(err, "Properties(%d)", d)
		bad := func(format string, args ...any) {
			h.errorf("device %d (%q): %s", d, p.Name, fmt.Sprintf(format, args...))
		}
		if p.Name == "" {
			bad("empty Name (NCCL uses it as the topology key)")
		}
		// Zero is valid where nccl.Properties documents a default the glue
		// fills (PtrSupport host, Speed, MaxRecvs 1).
		if p.PtrSupport != 0 && p.PtrSupport&nccl.PtrHost == 0 {
			bad("PtrSupport %#x lacks PtrHost; NCCL stages through host memory whenever GPU-direct is off", p.PtrSupport)
		}
		if p.Speed < 0 {
			bad("Speed %d Mbps is negative (0 = the default)", p.Speed)
		}
		if p.MaxComms <= 0 {
			bad("MaxComms %d must be positive", p.MaxComms)
		}
		if p.MaxRecvs < 0 || p.MaxRecvs > 64 {
			bad("MaxRecvs %d outside [1, 64] (0 = 1)", p.MaxRecvs)
		}
		if p.MaxP2PBytes < 0 || p.MaxP2PBytes > nccl.MaxNetSizeBytes {
			bad("MaxP2PBytes %d outside (0, 2^40] (0 = default); NCCL fails set-up otherwise", p.MaxP2PBytes)
		}
		if p.MaxCollBytes < 0 {
			bad("MaxCollBytes %d is negative", p.MaxCollBytes)
		}
		if p.Latency < 0 {
			bad("Latency %v is negative", p.Latency)
		}
	}
	for _, d := range []int{-1, n} {
		var err error
		h.call("Properties", func() { _, err = tr.Properties(d) })
		if err == nil {
			h.errorf("Properties(%d) with %d devices succeeded; an out-of-range device must be an error", d, n)
		}
		var hd nccl.Handle
		var l nccl.Listener
		h.call("Listen", func() { l, err = tr.Listen(d, &hd) })
		if err == nil {
			h.errorf("Listen(%d) with %d devices succeeded; an out-of-range device must be an error", d, n)
			if l != nil {
				h.closeBounded("Listener.Close", l.Close)
			}
		}
	}
}

func testConnect(h *subtest) {
	// connect alternates Connect and Accept from this goroutine; a transport
	// that waits in either deadlocks here and the deadline reports it.
	for i := 0; i < 3; i++ {
		p := h.connect()
		h.pump(h.newFlow(fmt.Sprintf("connection %d", i), p, []group{single(64, 64)}))
		h.closePair(p)
	}
}

func testListenerClose(h *subtest) {
	var hd nccl.Handle
	var l nccl.Listener
	var err error
	h.call("Listen", func() { l, err = h.suite.tr.Listen(h.suite.opts.Dev, &hd) })
	h.noError(err, "Listen")
	if l == nil {
		h.fatalf("Listen returned a nil listener and no error")
	}
	for i := 0; i < 3; i++ {
		var r nccl.RecvComm
		h.call("Accept", func() { r, err = l.Accept() })
		h.noError(err, "Accept with no connector")
		if r != nil {
			h.errorf("Accept returned a comm although nobody connected")
		}
	}
	h.closeBounded("Listener.Close", l.Close)
}

func testZeroByte(h *subtest) {
	p := h.connect()
	var gs []group
	for i := 0; i < 16; i++ {
		gs = append(gs, single(0, 0))
	}
	// Zero-byte messages mixed with data, into buffers that could hold more.
	for i := 0; i < 8; i++ {
		gs = append(gs, single(0, 4096), single(100*i+1, 4096))
	}
	h.pump(h.newFlow("zero-byte", p, gs))
}

func sizeList(max int) []int {
	sizes := []int{0, 1, 7, 8, 9, 63, 64, 65, 127, 128, 129, 255, 256, 1000, 4095, 4096, 4097,
		65535, 65536, 65537, 131072 + 3, 1<<20 - 1, 1 << 20, 1<<20 + 1, 4 << 20, 4<<20 + 13}
	for s := 8 << 20; s <= max; s *= 2 {
		sizes = append(sizes, s-5, s)
	}
	var out []int
	for _, s := range sizes {
		if s <= max {
			out = append(out, s)
		}
	}
	if out[len(out)-1] != max {
		out = append(out, max)
	}
	return out
}

func testSizes(h *subtest) {
	p := h.connect()
	var gs []group
	for _, s := range sizeList(h.suite.opts.MaxSize) {
		gs = append(gs, single(s, s))
	}
	f := h.newFlow("sizes", p, gs)
	// Keep at most a few large messages in memory at once.
	f.maxRecvs, f.maxSends = 4, 4
	h.pump(f)
}

func testRecvLarger(h *subtest) {
	p := h.connect()
	max := h.suite.opts.MaxSize
	var gs []group
	for _, s := range []int{0, 1, 100, 4096, 65536 + 7, 1 << 20} {
		for _, extra := range []int{1, 4096, 1 << 20} {
			if s+extra <= max {
				gs = append(gs, single(s, s+extra))
			}
		}
	}
	h.pump(h.newFlow("receive larger than send", p, gs))
}

// testTruncation sends more than the posted receive holds, for a small
// (header-sized) and a large message. The receive must fail with
// InvalidUsage, nothing may be written past the buffer, and the sender must
// finish one way or the other once the receiver gives up on the connection.
func testTruncation(h *subtest) {
	cases := []struct{ capacity, size int }{{8, 100}, {0, 1}, {64 << 10, 64<<10 + 1}, {1 << 20, 4 << 20}}
	for _, c := range cases {
		if c.size > h.suite.opts.MaxSize {
			continue
		}
		truncate(h, []int{c.capacity}, []int{c.size})
	}
	// In a grouped receive too: one message too large for its buffer fails
	// the whole receive, and neither buffer is written past its end.
	if h.maxRecvs() >= 2 {
		truncate(h, []int{64, 4096}, []int{100, 10})
		truncate(h, []int{4096, 8, 300}[:min(3, h.maxRecvs())], []int{10, 9, 200}[:min(3, h.maxRecvs())])
	}
}

// truncate posts one receive of len(caps) buffers (tags 7, 8, ...) and one
// send per buffer of sizes[i] bytes with its tag; some send is larger than its
// buffer.
func truncate(h *subtest, caps, sizes []int) {
	name := fmt.Sprintf("send %v bytes into receive buffers of %v bytes", sizes, caps)
	if len(caps) == 1 {
		name = fmt.Sprintf("send %d bytes into a %d-byte receive", sizes[0], caps[0])
	}
	p := h.connect()
	n := len(caps)
	mems := make([][]byte, n)
	bufs := make([]nccl.RecvBuffer, n)
	sendBufs := make([]*buffer, n)
	for i := range caps {
		rb := h.buffer(p.recv, caps[i]+guard)
		mems[i] = rb.b
		fillSentinel(rb.b)
		bufs[i] = nccl.RecvBuffer{Data: rb.ptr(), Size: caps[i], Tag: 7 + i, MH: rb.mh}
		sendBufs[i] = h.buffer(p.send, sizes[i])
		fillPattern(sendBufs[i].b, h.nextSeed())
	}
	checkGuards := func(when string) {
		for i := range caps {
			if err := checkSentinel(mems[i], caps[i]); err != nil {
				h.errorf("%s: memory past the receive buffer was written%s (buffer %d): %v", name, when, i, err)
			}
		}
	}

	var rreq nccl.Request = nccl.NoRequest
	sreqs := make([]nccl.Request, n)
	for i := range sreqs {
		sreqs[i] = nccl.NoRequest
	}
	var err error
	var rerr error
	got := make([]int, n)
	sendDone, sendErr := make([]bool, n), make([]error, n)
	sendsOver := func() bool {
		for i := range sreqs {
			if sreqs[i] == nccl.NoRequest || (!sendDone[i] && sendErr[i] == nil) {
				return false
			}
		}
		return true
	}
	testSends := func() {
		for i, r := range sreqs {
			if r != nccl.NoRequest && !sendDone[i] && sendErr[i] == nil {
				h.call("SendComm.Test", func() { sendDone[i], _, sendErr[i] = p.send.Test(r) })
			}
		}
	}
	for {
		if rreq == nccl.NoRequest {
			h.call("Irecv", func() { rreq, err = p.recv.Irecv(bufs) })
			h.noError(err, "%s: Irecv", name)
		}
		for i := range sreqs {
			if sreqs[i] == nccl.NoRequest {
				h.call("Isend", func() { sreqs[i], err = p.send.Isend(sendBufs[i].ptr(), sizes[i], 7+i, sendBufs[i].mh) })
				h.noError(err, "%s: Isend %d", name, i)
			}
		}
		if rreq != nccl.NoRequest {
			var done bool
			h.call("RecvComm.Test", func() { done, rerr = p.recv.Test(rreq, got) })
			if rerr != nil {
				break
			}
			if done {
				h.fatalf("%s: the receive completed (reported %v bytes) instead of failing with InvalidUsage", name, got)
			}
		}
		testSends()
		if h.expired() {
			h.fatalf("%s: the receive neither failed nor completed before the deadline", name)
		}
		runtime.Gosched()
	}
	if got := nccl.ResultOf(rerr); got != nccl.InvalidUsage {
		h.errorf("%s: receive failed with %v (%v), want %v", name, rerr, got, nccl.InvalidUsage)
	}
	checkGuards("")
	// NCCL aborts the communicator after such an error: the receiving end is
	// closed, and the sending end must then finish (done or an error) so that
	// its proxy does not spin forever.
	h.closeComm("RecvComm.Close", p.recv)
	p.recvClosed = true
	for !sendsOver() {
		testSends()
		for i := range sreqs {
			if sreqs[i] == nccl.NoRequest { // NCCL stops posting once the comm failed
				sendDone[i] = true
			}
		}
		if h.expired() {
			h.fatalf("%s: after the receiver failed and closed, a send neither completed nor failed", name)
		}
		runtime.Gosched()
	}
	checkGuards(" after the failure")
	h.closePair(p)
}

func (h *subtest) needGroups() int {
	n := h.maxRecvs()
	if n < 2 {
		h.skip("the device reports MaxRecvs = %d: grouped receives do not apply", n)
	}
	return n
}

// groupedRounds returns 16 rounds of n-message groups that mix empty, small
// and striped-size messages; fill adds round's buffers and sends for sizes.
func groupedRounds(n int, fill func(g *group, sizes []int, round int)) []group {
	base := []int{0, 8, 4096, 200, 1 << 20, 65536, 1, 300 << 10}
	gs := make([]group, 16)
	for round := range gs {
		sizes := make([]int, n)
		for i := range sizes {
			sizes[i] = base[(i+round)%len(base)]
		}
		fill(&gs[round], sizes, round)
	}
	return gs
}

func testGroupedDistinct(h *subtest) {
	n := h.needGroups()
	p := h.connect()
	gs := groupedRounds(n, func(g *group, sizes []int, round int) {
		for i, sz := range sizes {
			g.bufs = append(g.bufs, recvSpec{cap: sz + 64*round, tag: 100 + i})
		}
		// The sender posts in reverse tag order: each message must still land
		// in the buffer carrying its tag, not in posting order.
		for i := n - 1; i >= 0; i-- {
			g.sends = append(g.sends, sendSpec{size: sizes[i], tag: 100 + i, slot: i})
		}
	})
	h.pump(h.newFlow("grouped, distinct tags", p, gs))
}

func testGroupedEqual(h *subtest) {
	n := h.needGroups()
	p := h.connect()
	// NCCL passes the sender's rank as the tag of every buffer of a group
	// (one peer per shared comm), so equal tags must fill buffers in order.
	gs := groupedRounds(n, func(g *group, sizes []int, _ int) {
		for i, sz := range sizes {
			g.bufs = append(g.bufs, recvSpec{cap: sz + 100, tag: 3})
			g.sends = append(g.sends, sendSpec{size: sz, tag: 3, slot: i})
		}
	})
	// Groups of different sizes on the same comm, as when subs come and go.
	for k := 1; k <= n; k++ {
		var g group
		for i := 0; i < k; i++ {
			g.bufs = append(g.bufs, recvSpec{cap: 1000, tag: 3})
			g.sends = append(g.sends, sendSpec{size: 10 * (i + 1), tag: 3, slot: i})
		}
		gs = append(gs, g)
	}
	h.pump(h.newFlow("grouped, equal tags", p, gs))
}

// testGroupedOneAtATime posts a group's sends one by one, testing each posted
// send for a while before the next: a send whose group is not complete yet
// must not report done unless its data is safe (NCCL then reuses the buffer,
// which the driver scribbles over), and the request it used must not be
// handed out again while the group still needs it.
func testGroupedOneAtATime(h *subtest) {
	n := h.needGroups()
	p := h.connect()
	gs := groupedRounds(n, func(g *group, sizes []int, round int) {
		for i, sz := range sizes {
			g.bufs = append(g.bufs, recvSpec{cap: sz + 64*round, tag: 100 + i})
		}
		for i := range sizes {
			// Small sizes first, so a larger message landing in a smaller
			// slot's buffer would show as a write past it.
			j := (i + round) % n
			g.sends = append(g.sends, sendSpec{size: sizes[j], tag: 100 + j, slot: j})
		}
	})
	f := h.newFlow("grouped, sends one at a time", p, gs[:4])
	f.sendGap = 20
	h.pump(f)
}

func testFIFO(h *subtest) {
	p := h.connect()
	var gs []group
	sizes := []int{3, 5000, 0, 1 << 20, 17, 70000, 128, 129, 2 << 20, 1}
	for i := 0; i < 64; i++ {
		s := sizes[i%len(sizes)]
		gs = append(gs, single(s, 2<<20))
	}
	// Every message has its own pattern and size: out-of-order matching shows
	// up as a size or data mismatch of a specific receive.
	h.pump(h.newFlow("FIFO", p, gs))
}

func testSendBeforeRecv(h *subtest) {
	p := h.connect()
	var gs []group
	for _, s := range []int{8, 0, 1 << 20, 4096, 3 << 20, 64} {
		gs = append(gs, single(s, s))
	}
	f := h.newFlow("sends posted before receives", p, gs)
	// NCCL's sender often runs ahead of the receiver; Isend may answer
	// NoRequest until the receive is posted, but must neither fail nor block.
	f.holdRecvs = 200
	h.pump(f)
}

func testInFlight(h *subtest) {
	n := h.maxRecvs()
	p := h.connect()
	var gs []group
	for r := 0; r < nccl.MaxRequests; r++ {
		var g group
		for i := 0; i < n; i++ {
			size := []int{8, 4096, 65536 + 1, 256 << 10}[(r+i)%4]
			g.bufs = append(g.bufs, recvSpec{cap: size, tag: 9})
			g.sends = append(g.sends, sendSpec{size: size, tag: 9, slot: i})
		}
		gs = append(gs, g)
	}
	f := h.newFlow(fmt.Sprintf("%d receives × %d buffers in flight", nccl.MaxRequests, n), p, gs)
	// All 32 receives first, then all 32×n sends with no send tested until the
	// last is posted: NCCL may have that many outstanding.
	f.allRecvsFirst = true
	f.holdSendTests = true
	h.pump(f)
}

func mixedGroups(count, seedSize int) []group {
	var gs []group
	sizes := []int{8, 4 << 20, 0, 128 << 10, 1 << 20, 1, 4096, 512 << 10}
	for i := 0; i < count; i++ {
		s := sizes[(i+seedSize)%len(sizes)]
		gs = append(gs, single(s, s+i%3))
	}
	return gs
}

// testLongLived moves more messages over one comm than any transport has
// request slots (NCCL runs a comm for the whole job): singles first, then
// grouped receives, so a request that is never recycled after Test reported
// it done shows as a transfer that stops.
func testLongLived(h *subtest) {
	p := h.connect()
	const singles = 2048
	gs := make([]group, 0, singles+600)
	for i := 0; i < singles; i++ {
		sz := (i * 37) % 3000
		gs = append(gs, single(sz, sz+i%5))
	}
	if n := h.maxRecvs(); n >= 2 {
		for i := 0; i < 600; i++ {
			var g group
			for j := 0; j < n; j++ {
				sz := (i*13 + j*7) % 500
				g.bufs = append(g.bufs, recvSpec{cap: sz + 1, tag: 3})
				g.sends = append(g.sends, sendSpec{size: sz, tag: 3, slot: j})
			}
			gs = append(gs, g)
		}
	}
	h.pump(h.newFlow("one long-lived comm", p, gs))
}

func testBidirectional(h *subtest) {
	ab := h.connect()
	ba := h.connect()
	h.pump(h.newFlow("A to B", ab, mixedGroups(48, 0)), h.newFlow("B to A", ba, mixedGroups(48, 3)))
}

func testManyComms(h *subtest) {
	var flows []*flow
	for i := 0; i < 8; i++ {
		p := h.connect()
		flows = append(flows, h.newFlow(fmt.Sprintf("comm %d", i), p, mixedGroups(16, i)))
	}
	h.pump(flows...)
}

func testNilSizes(h *subtest) {
	p := h.connect()
	f := h.newFlow("Test(sizes=nil)", p, mixedGroups(16, 1))
	f.nilSizes = true
	h.pump(f)
}

func testRegMr(h *subtest) {
	p := h.connect()
	buf := h.buffer(nil, 1<<20)
	props := h.props()
	for _, c := range []struct {
		name string
		comm nccl.Comm
	}{{"SendComm", p.send}, {"RecvComm", p.recv}} {
		var mh nccl.MemHandle
		var err error
		h.call(c.name+".RegMr", func() { mh, err = c.comm.RegMr(buf.ptr(), len(buf.b), nccl.PtrHost) })
		h.noError(err, "%s.RegMr of host memory", c.name)
		if mh == 0 {
			h.errorf("%s.RegMr returned the zero MemHandle for a successful registration", c.name)
		}
		h.call(c.name+".DeregMr", func() { err = c.comm.DeregMr(mh) })
		h.noError(err, "%s.DeregMr", c.name)
		h.call(c.name+".DeregMr", func() { err = c.comm.DeregMr(0) })
		h.noError(err, "%s.DeregMr(0): NCCL deregisters failed registrations too", c.name)
		if props.PtrSupport&nccl.PtrCUDA == 0 {
			h.call(c.name+".RegMr", func() { mh, err = c.comm.RegMr(buf.ptr(), len(buf.b), nccl.PtrCUDA) })
			if err == nil {
				h.errorf("%s.RegMr(PtrCUDA) succeeded on a device without PtrCUDA support", c.name)
			}
		}
	}
	// The comm still moves data after registrations came and went.
	h.pump(h.newFlow("after RegMr", p, mixedGroups(8, 2)))
}

func testRegMrConcurrent(h *subtest) {
	p := h.connect()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	reg := func(c nccl.Comm, name string) {
		defer wg.Done()
		buf := h.buffer(nil, 64<<10)
		for {
			select {
			case <-stop:
				return
			default:
			}
			mh, err := c.RegMr(buf.ptr(), len(buf.b), nccl.PtrHost)
			if err != nil {
				h.errorf("%s.RegMr concurrent with the data path: %v", name, err)
				return
			}
			if err := c.DeregMr(mh); err != nil {
				h.errorf("%s.DeregMr concurrent with the data path: %v", name, err)
				return
			}
			runtime.Gosched()
		}
	}
	wg.Add(2)
	// NCCL's service thread registers user buffers while the progress thread
	// is inside Isend/Irecv/Test on the same comm.
	go reg(p.send, "SendComm")
	go reg(p.recv, "RecvComm")
	func() {
		defer func() { close(stop); wg.Wait() }()
		h.pump(h.newFlow("data path during RegMr", p, mixedGroups(64, 5)))
	}()
}

func testConcurrentSetup(h *subtest) {
	// NCCL sets up connections from one service thread per communicator, so
	// Listen/Connect/Accept run concurrently on one transport.
	const workers = 4
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 3; i++ {
				p := h.connect()
				h.pump(h.newFlow(fmt.Sprintf("worker %d connection %d", w, i), p, mixedGroups(4, w+i)))
			}
		}()
	}
	wg.Wait()
}

// testCloseOutstanding closes comms with receives that nothing will fill,
// sends nobody receives, and a large transfer cut in the middle (what
// ncclCommAbort does), then checks that the transport still works.
func testCloseOutstanding(h *subtest) {
	big := min(h.suite.opts.MaxSize, 64<<20)

	idleRecv := h.connect()
	fr := h.newFlow("receives never filled", idleRecv, []group{single(1<<20, 1<<20), single(8, 8), single(4<<20, 4<<20)})
	fr.sends = nil // post only the receives
	for i := 0; i < 50; i++ {
		fr.step()
	}

	idleSend := h.connect()
	fs := h.newFlow("sends never received", idleSend, []group{single(1<<20, 1<<20), single(8, 8), single(big, big)})
	fs.recvs = nil // post only the sends
	for i := 0; i < 50; i++ {
		fs.step()
	}

	mid := h.connect()
	fm := h.newFlow("cut mid-transfer", mid, []group{single(big, big), single(big, big)})
	for i := 0; i < 20 && !fm.finished(); i++ {
		fm.step()
	}

	for _, p := range []*pair{idleRecv, idleSend, mid} {
		h.closePair(p)
	}
	if h.failed() {
		return
	}
	p := h.connect()
	h.pump(h.newFlow("after closing with requests outstanding", p, mixedGroups(8, 0)))
	// Memory a closed comm used may be freed as soon as Close returns:
	// those nothing was sent to must still hold what they held then, after
	// the transport has been driven on another comm.
	for i, ro := range fr.recvs[:fr.nextR] {
		for b, m := range ro.mem {
			if m == nil {
				continue
			}
			if err := checkSentinel(m.b, 0); err != nil {
				h.errorf("receive %d buffer %d of a closed comm (nothing was sent to it) was written after its comm was closed: %v", i, b, err)
			}
		}
	}
}

// testDeregMrFence: NCCL deregisters and frees its buffers before it
// closes the comm (net.cc's recvProxyFree: deregMr, free, then closeRecv),
// and after an abort it does so with requests outstanding and its progress
// thread stopped. Once DeregMr returned, nothing may write into the memory,
// whatever still arrives for it: here a large transfer is cut mid-way, the
// receive buffer deregistered and refilled as a new owner would, and the
// sender driven on alone. The transfer itself may complete or fail.
func testDeregMrFence(h *subtest) {
	size := min(h.suite.opts.MaxSize, 16<<20)
	p := h.connect()
	src := h.buffer(p.send, size)
	for i := range src.b {
		src.b[i] = byte(i*7 + 1)
	}
	dst := h.buffer(nil, size)
	var mh nccl.MemHandle
	var err error
	h.call("RegMr", func() { mh, err = p.recv.RegMr(dst.ptr(), len(dst.m), nccl.PtrHost) })
	h.noError(err, "RegMr of the receive buffer")
	var rreq, sreq nccl.Request
	h.call("Irecv", func() { rreq, err = p.recv.Irecv([]nccl.RecvBuffer{{Data: dst.ptr(), Size: size, Tag: 3, MH: mh}}) })
	h.noError(err, "Irecv")
	for rreq == nccl.NoRequest && !h.expired() {
		h.call("Irecv", func() { rreq, err = p.recv.Irecv([]nccl.RecvBuffer{{Data: dst.ptr(), Size: size, Tag: 3, MH: mh}}) })
		h.noError(err, "Irecv")
	}
	h.call("Isend", func() { sreq, err = p.send.Isend(src.ptr(), size, 3, src.mh) })
	h.noError(err, "Isend")
	for sreq == nccl.NoRequest && !h.expired() {
		h.call("Isend", func() { sreq, err = p.send.Isend(src.ptr(), size, 3, src.mh) })
		h.noError(err, "Isend")
	}
	// A few rounds of both ends: the receive matched, bytes on their way.
	sdone, sfailed, rdone := false, false, false
	for i := 0; i < 8 && !rdone; i++ {
		if !sdone && !sfailed {
			h.call("SendComm.Test", func() { sdone, _, err = p.send.Test(sreq) })
			sfailed = err != nil
		}
		h.call("RecvComm.Test", func() { rdone, err = p.recv.Test(rreq, nil) })
		h.noError(err, "RecvComm.Test before DeregMr")
	}
	h.call("DeregMr", func() { err = p.recv.DeregMr(mh) })
	h.noError(err, "DeregMr with a receive outstanding (NCCL's teardown after an abort)")
	// The memory's next owner writes it; from here on it is not the transport's.
	fillSentinel(dst.b)
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end) && !sdone && !sfailed; {
		h.call("SendComm.Test", func() { sdone, _, err = p.send.Test(sreq) })
		sfailed = err != nil
		runtime.Gosched()
	}
	// A late write comes from a thread of the transport's own, which a
	// loaded 2-core machine may not run for tens of milliseconds: look
	// several times over a span well beyond one scheduling delay, stopping
	// at the first write seen.
	for i := 0; i < 10; i++ {
		time.Sleep(10 * time.Millisecond)
		if err := checkSentinel(dst.b, 0); err != nil {
			h.errorf("the receive buffer was written after DeregMr returned (NCCL frees it then): %v", err)
			break
		}
	}
	h.closePair(p)
}

// testSenderClosesFirst closes the sending end as soon as every send reports
// done, while the receiver is still reading: a completed send means the
// buffer is free, and the messages must still arrive (NCCL tears down the
// sending proxy independently of the receiving one).
func testSenderClosesFirst(h *subtest) {
	for round := 0; round < 3; round++ {
		p := h.connect()
		gs := mixedGroups(24, round)
		for i := 0; i < 16; i++ {
			gs = append(gs, single(8*i, 8*i))
		}
		f := h.newFlow(fmt.Sprintf("round %d", round), p, gs)
		f.allRecvsFirst = true
		for f.doneS < len(f.sends) {
			f.step()
			if h.expired() {
				h.fatalf("sends did not complete before the deadline: %s", f.status())
			}
			runtime.Gosched()
		}
		p.sendClosed = true
		h.closeComm("SendComm.Close", p.send)
		h.pump(f)
		h.closePair(p)
	}
}

// testSenderClosedFailsPending: the sender closes its comm (its process
// tearing down, or ncclCommAbort there) while receives it will never fill
// are posted here. Each must fail in Test before the case's deadline, never
// stay "not done" for ever: NCCL's proxy would wait on it until the job's
// own timeout. What was sent before the close still arrives
// (SenderClosesFirst), so this sends a few messages first.
func testSenderClosedFailsPending(h *subtest) {
	p := h.connect()
	h.pump(h.newFlow("before the close", p, mixedGroups(4, 0)))
	orphan := h.newFlow("receives the closed sender never fills", p, []group{single(8, 8), single(1<<20, 1<<20)})
	orphan.sends = nil // post only the receives
	for i := 0; i < 10; i++ {
		orphan.step()
	}
	if h.failed() {
		return
	}
	p.sendClosed = true
	h.closeComm("SendComm.Close", p.send)
	for i, ro := range orphan.recvs[:orphan.nextR] {
		for {
			var done bool
			var err error
			h.call("RecvComm.Test", func() { done, err = p.recv.Test(ro.req, ro.sizes) })
			if err != nil {
				break
			}
			if done {
				h.errorf("receive %d reported done, but the sender closed without sending to it", i)
				break
			}
			if h.expired() {
				h.fatalf("receive %d still not done and no error at the deadline after the sender closed its comm: a closed peer must fail the receives it left posted", i)
			}
			runtime.Gosched()
		}
	}
	h.closePair(p)
}
