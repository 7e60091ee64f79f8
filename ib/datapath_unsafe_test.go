package ib

import (
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// A grouped receive whose buffers carry different tags (NCCL's PXN: one
// shared comm carries the sends of several ranks, each rank's tag is its
// own) can see one tag's next send before another tag's current one. The
// buffer with that tag is taken in the oldest slot: NCCL's ncclIbIsend
// answers NULL (retry) and matches the send once the slot moved on; it is
// not a disagreement between sender and receiver.
func TestIsendWithTagAlreadyMatchedIsNoRequest(t *testing.T) {
	setEnv(t)
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	sc, rc := connectPair(t, a, 0, b, 0)
	const size = 256
	rb := newBuf(t, rc, 4*size, 0xee)
	sb := newBuf(t, sc, 4*size, 0)
	for i := 0; i < 4; i++ {
		copy(sb.b[i*size:], pattern(size, byte(i)))
	}
	// Two grouped receives, tags {10, 20} each.
	var rreqs [2]nccl.Request
	for m := 0; m < 2; m++ {
		var err error
		rreqs[m], err = rc.Irecv([]nccl.RecvBuffer{
			{Data: unsafe.Add(rb.ptr(), (2*m)*size), Size: size, Tag: 10, MH: rb.mh},
			{Data: unsafe.Add(rb.ptr(), (2*m+1)*size), Size: size, Tag: 20, MH: rb.mh},
		})
		require.NoError(t, err)
		require.NotEqual(t, nccl.NoRequest, rreqs[m])
	}
	send := func(i, tag int) (nccl.Request, error) {
		return sc.Isend(unsafe.Add(sb.ptr(), i*size), size, tag, sb.mh)
	}
	var s [4]nccl.Request
	var err error
	within(t, "tag 10, message 0", func() (bool, error) { s[0], err = send(0, 10); return s[0] != nccl.NoRequest, err })
	// Tag 10's next message, before tag 20's first one: not ready yet.
	r, err := send(2, 10)
	require.NoError(t, err, "the buffer with this tag is taken in the oldest slot: retry later, as NCCL")
	assert.Equal(t, nccl.NoRequest, r)
	within(t, "tag 20, message 0", func() (bool, error) { s[1], err = send(1, 20); return s[1] != nccl.NoRequest, err })
	within(t, "tag 10, message 1", func() (bool, error) { s[2], err = send(2, 10); return s[2] != nccl.NoRequest, err })
	within(t, "tag 20, message 1", func() (bool, error) { s[3], err = send(3, 20); return s[3] != nccl.NoRequest, err })
	for m := 0; m < 2; m++ {
		sizes := make([]int, 2)
		within(t, "recv", func() (bool, error) { return rc.Test(rreqs[m], sizes) })
		assert.Equal(t, []int{size, size}, sizes)
	}
	for _, r := range s {
		within(t, "send", func() (bool, error) { d, _, err := sc.Test(r); return d, err })
	}
	assert.Equal(t, sb.b, rb.b, "each message in its buffer")
	assert.False(t, a.log.has("matches no free buffer"), a.log.String())
}

// A tag that no buffer of the oldest slot carries is a send for a later
// receive, not an error: with PXN one shared comm carries the sends of
// several ranks (each tag a rank), and the receiver posts a receive per
// proxy op, so a rank whose receive comes in a later op (recv from S1, then
// recv from S3) can send before the rank the oldest slot waits for.
// NCCL's ncclIbIsend answers NULL (retry) whenever no free buffer of the
// oldest slot carries the tag; failing it aborted the communicator.
func TestIsendWithTagOfALaterReceiveIsNoRequest(t *testing.T) {
	setEnv(t)
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	sc, rc := connectPair(t, a, 0, b, 0)
	const size = 64
	rb := newBuf(t, rc, 2*size, 0xee)
	sb := newBuf(t, sc, 2*size, 0)
	copy(sb.b, pattern(size, 1))
	copy(sb.b[size:], pattern(size, 3))
	// Receive from tag 1 first, then from tag 3: two CTS slots.
	r1, err := rc.Irecv([]nccl.RecvBuffer{{Data: rb.ptr(), Size: size, Tag: 1, MH: rb.mh}})
	require.NoError(t, err)
	r3, err := rc.Irecv([]nccl.RecvBuffer{{Data: unsafe.Add(rb.ptr(), size), Size: size, Tag: 3, MH: rb.mh}})
	require.NoError(t, err)
	// Tag 3 sends first: refused until tag 1's send moved the FIFO on.
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		r, err := sc.Isend(unsafe.Add(sb.ptr(), size), size, 3, sb.mh)
		require.NoError(t, err, "a send for a later receive is retried, as NCCL's IB does")
		require.Equal(t, nccl.NoRequest, r, "tag 3 is not in the oldest slot")
	}
	var s1, s3 nccl.Request
	within(t, "tag 1", func() (bool, error) { s1, err = sc.Isend(sb.ptr(), size, 1, sb.mh); return s1 != nccl.NoRequest, err })
	within(t, "tag 3", func() (bool, error) {
		s3, err = sc.Isend(unsafe.Add(sb.ptr(), size), size, 3, sb.mh)
		return s3 != nccl.NoRequest, err
	})
	for _, r := range []nccl.Request{r1, r3} {
		sizes := make([]int, 1)
		within(t, "recv", func() (bool, error) { return rc.Test(r, sizes) })
		assert.Equal(t, []int{size}, sizes)
	}
	for _, r := range []nccl.Request{s1, s3} {
		within(t, "send", func() (bool, error) { d, _, err := sc.Test(r); return d, err })
	}
	assert.Equal(t, sb.b, rb.b, "each message in the buffer of its tag")
	assert.False(t, a.log.has("matches no free buffer"), a.log.String())
}

// A long pipelined run: the FIFO wraps hundreds of times, grouped receives
// of 1 to 8 buffers (some 0 bytes, some short, sent in a shuffled tag
// order), sizes checked on both sides, and data spot-checked.
func TestLongFIFOWrapWithGroupedReceives(t *testing.T) {
	for _, tc := range []struct {
		name     string
		env      []string
		na, nb   int
		messages int
	}{
		{"one device", nil, 1, 1, 2*maxRequests*256 + 1000},
		{"fused 2x2 split 4 QPs", []string{"NCCL_IB_QPS_PER_CONNECTION", "2", "NCCL_IB_SPLIT_DATA_ON_QPS", "1"}, 2, 2, 3 * maxRequests * 4},
		{"1 to 3", nil, 1, 3, 3 * maxRequests * 4},
		{"3 to 1 inline, AR everything", []string{"NCCL_IB_USE_INLINE", "1", "NCCL_IB_AR_THRESHOLD", "0", "NCCL_IB_ADAPTIVE_ROUTING", "1"}, 3, 1, 3 * maxRequests * 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setEnv(t, tc.env...)
			_, a, av, b, bv := fusedHosts(t, tc.na, tc.nb)
			sc, rc := connectPair(t, a, av, b, bv)
			const depth, bufSize = 24, 512
			rb := newBuf(t, rc, depth*maxRecvs*bufSize, 0)
			sb := newBuf(t, sc, maxRecvs*bufSize, 0)
			for i := range sb.b {
				sb.b[i] = byte(i*13 + 1)
			}
			type msg struct {
				rreq   nccl.Request
				n      int
				sizes  [maxRecvs]int
				sreqs  [maxRecvs]nccl.Request
				region int
			}
			ring := make([]msg, depth)
			rng := uint32(12345)
			next := func() uint32 { rng = rng*1664525 + 1013904223; return rng >> 8 }
			posted, sent, done := 0, 0, 0
			for done < tc.messages {
				progressed := false
				if posted < tc.messages && posted-done < depth {
					m := &ring[posted%depth]
					m.n = 1 + int(next()%maxRecvs)
					m.region = posted % depth
					bufs := make([]nccl.RecvBuffer, m.n)
					for i := range bufs {
						switch next() % 4 {
						case 0:
							m.sizes[i] = 0
						case 1:
							m.sizes[i] = 1 + int(next()%bufSize)
						default:
							m.sizes[i] = bufSize
						}
						bufs[i] = nccl.RecvBuffer{Data: unsafe.Add(rb.ptr(), (m.region*maxRecvs+i)*bufSize), Size: bufSize, Tag: 100 + i, MH: rb.mh}
					}
					r, err := rc.Irecv(bufs)
					require.NoError(t, err)
					if r != nccl.NoRequest {
						m.rreq = r
						posted++
						progressed = true
					}
				}
				if sent < posted {
					m := &ring[sent%depth]
					// Send the group in reverse tag order.
					for i := m.n - 1; i >= 0; i-- {
						for {
							r, err := sc.Isend(unsafe.Add(sb.ptr(), i*bufSize), m.sizes[i], 100+i, sb.mh)
							require.NoError(t, err, "message %d buffer %d", sent, i)
							if r != nccl.NoRequest {
								m.sreqs[i] = r
								break
							}
						}
					}
					sent++
					progressed = true
				}
				if done < sent {
					m := &ring[done%depth]
					got := make([]int, m.n)
					ok, err := rc.Test(m.rreq, got)
					require.NoError(t, err)
					if ok {
						for i := 0; i < m.n; i++ {
							require.Equal(t, m.sizes[i], got[i], "message %d buffer %d of %d", done, i, m.n)
							if m.sizes[i] > 0 {
								off := (m.region*maxRecvs + i) * bufSize
								require.Equal(t, sb.b[i*bufSize+m.sizes[i]-1], rb.b[off+m.sizes[i]-1], "message %d buffer %d last byte", done, i)
								require.Equal(t, sb.b[i*bufSize], rb.b[off], "message %d buffer %d first byte", done, i)
							}
						}
						for i := 0; i < m.n; i++ {
							within(t, "send", func() (bool, error) {
								d, sz, err := sc.Test(m.sreqs[i])
								if d {
									require.Equal(t, m.sizes[i], sz)
								}
								return d, err
							})
						}
						done++
						progressed = true
					}
				}
				_ = progressed
			}
			assert.Zero(t, sc.reqs.InUse())
			assert.Equal(t, uint64(tc.messages), sc.fifoHead)
			assert.Equal(t, uint64(tc.messages), rc.fifoHead)
		})
	}
}

// Random overlapping, adjacent and nested registrations on two comms of one
// device, deregistered in random order: every live handle's keys name a
// live MR covering its range, and nothing is left at the end.
func TestMRCacheRandomOverlap(t *testing.T) {
	setEnv(t)
	f, a, b := twoHosts(t, softnic.DeviceConfig{})
	sc1, _ := connectPair(t, a, 0, b, 0)
	sc2, _ := connectPair(t, a, 0, b, 0)
	dev := f.Device("simA_0")
	base := dev.MRCount()
	mem := mmapBytes(t, 64*4096)
	p := unsafe.Pointer(&mem[0])
	type live struct {
		c  nccl.SendComm
		mh nccl.MemHandle
		lo uint64
		n  int
	}
	var hs []live
	rng := uint32(7)
	next := func() uint32 { rng = rng*1664525 + 1013904223; return rng >> 8 }
	check := func() {
		mrs := dev.MRs()
		for _, h := range hs {
			x := lookupMR(h.mh)
			require.NotNil(t, x)
			found := false
			for _, m := range mrs {
				if m.LKey == x.lkeys[0] && m.RKey == x.rkeys[0] && h.lo >= m.Addr && h.lo+uint64(max(h.n, 1)) <= m.Addr+m.Length {
					found = true
				}
			}
			require.True(t, found, "handle %#x [%#x+%d) has no live MR covering it", h.mh, h.lo, h.n)
		}
	}
	for step := 0; step < 3000; step++ {
		if len(hs) > 0 && (next()%2 == 0 || len(hs) > 40) {
			i := int(next()) % len(hs)
			require.NoError(t, hs[i].c.DeregMr(hs[i].mh))
			hs = append(hs[:i], hs[i+1:]...)
		} else {
			c := nccl.SendComm(sc1)
			if next()%2 == 0 {
				c = sc2
			}
			off := int(next() % (60 * 4096))
			n := int(next() % uint32(min(len(mem)-off, 5*4096)))
			mh, err := c.RegMr(unsafe.Add(p, off), n, nccl.PtrHost)
			require.NoError(t, err)
			hs = append(hs, live{c, mh, uint64(uintptr(p)) + uint64(off), n})
		}
		check()
	}
	for _, h := range hs {
		require.NoError(t, h.c.DeregMr(h.mh))
	}
	assert.Equal(t, base, dev.MRCount())
	st, _ := a.t.MRStats(0)
	assert.Zero(t, st.RegisteredBytes)
}

// Close with sends posted and not tested, completions still queued in the
// CQs, a grouped receive half matched and a flush outstanding: nothing the
// NIC flags, and the other side fails cleanly or keeps quiet.
func TestCloseWithWorkInFlight(t *testing.T) {
	setEnv(t, "NCCL_GO_IB_FORCE_FLUSH", "1")
	f, a, b := twoHosts(t, softnic.DeviceConfig{})
	sc, rc := connectPair(t, a, 0, b, 0)
	rb := newBuf(t, rc, 64*1024, 0)
	sb := newBuf(t, sc, 64*1024, 1)
	for i := 0; i < 20; i++ {
		_, err := rc.Irecv([]nccl.RecvBuffer{{Data: unsafe.Add(rb.ptr(), i*1024), Size: 1024, MH: rb.mh}})
		require.NoError(t, err)
		r, err := sc.Isend(unsafe.Add(sb.ptr(), i*1024), 1024, 0, sb.mh)
		require.NoError(t, err)
		require.NotEqual(t, nccl.NoRequest, r)
	}
	_, err := rc.Irecv([]nccl.RecvBuffer{{Data: rb.ptr(), Size: 8, Tag: 1, MH: rb.mh}, {Data: rb.ptr(), Size: 8, Tag: 2, MH: rb.mh}})
	require.NoError(t, err)
	r, err := sc.Isend(sb.ptr(), 8, 1, sb.mh)
	require.NoError(t, err)
	require.NotEqual(t, nccl.NoRequest, r)
	fr, err := rc.Iflush([]nccl.RecvBuffer{{Data: rb.ptr(), Size: 8, MH: rb.mh}})
	require.NoError(t, err)
	require.NotEqual(t, nccl.NoRequest, fr)
	require.NoError(t, sc.DeregMr(sb.mh))
	require.NoError(t, sc.Close())
	require.NoError(t, rc.DeregMr(rb.mh))
	require.NoError(t, rc.Close())
	assert.Empty(t, f.Violations())
}
