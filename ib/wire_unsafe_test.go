package ib

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/internal/golden"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// wireGolden is everything two ranks exchange, and what the receiving rank
// makes of it, as each protoVersion shipped it (wireTranscript's lines). Two
// builds that claim the same version must agree on every line: a change to
// any of them bumps protoVersion and adds the new version's transcript here.
// Never edit an existing entry; it is what builds in the field speak.
var wireGolden = map[int]string{
	// 50a4d71 .. 56b88e2 (2026-11-22 to 2026-11-24): a 0-byte receive buffer
	// advertised rkey 0 (and address 0 without a buffer), and a sender took
	// any CTS entry with 1..8 buffers.
	1: `
handle: 8877665544332211 00ffeeddccbbaa99 04 01 b712 c000020700000000000000000000000000000000 0000000000000000 0000000000000000
hello: 8877665544332211 04000000 01000000 00ffeeddccbbaa99 02000000 01000000
helloReply: 00000000 02000000 01000000 00000000
connMeta: 3360 bytes, sha256 49665c42957fe18de5fe68a373eb0024
ready: 52454459
ctsEntry: 0010000000000000 0020000000000000 a1000000a2000000000000000000000000000000000000000000000000000000 07000000 02000000 0500000000000000
cts layout: 256 slots x 8 entries x 64 bytes; completion records 256 x 8 x int32
parseCTS ok: ok
parseCTS 0 buffers: error
parseCTS 9 buffers: error
parseCTS address 0: ok
parseCTS rkey 0: ok
parseCTS entry 1 not yet: not ready
irecv 0 bytes registered: address buffer, rkey 0
irecv 0 bytes without buffer: address 0, rkey 0
irecv 8 bytes: address buffer, rkey buffer
imm 0: 00000000
imm 8: 00000008
imm 1073741824: 40000000
imm truncated 100: 80000064
imm truncated 2147483647: ffffffff
sizeRecord 0: 0
sizeRecord 8: 8
sizeRecord truncated 100: -101
chunkSize 1/1: 128
chunkSize 1000/3: 384
chunkSize 1048576/4: 262144
chunkSize 1048577/4: 262272
dataQP nData=2 nqps=4: 0,1 2,3 0,1 2,3
dataQP nData=3 nqps=4: 0,1,2 3,0,1 2,3,0
handshake connection: kept open, idle, by both comms
`,
	// c542a9c on (2026-11-24; the version bumped only on 2026-11-29): a
	// 0-byte buffer advertises a real address and rkey, its registration's
	// or the completion records', and a sender refuses address or rkey 0.
	2: `
handle: 8877665544332211 00ffeeddccbbaa99 04 01 b712 c000020700000000000000000000000000000000 0000000000000000 0000000000000000
hello: 8877665544332211 04000000 02000000 00ffeeddccbbaa99 02000000 01000000
helloReply: 00000000 02000000 01000000 00000000
connMeta: 3360 bytes, sha256 49665c42957fe18de5fe68a373eb0024
ready: 52454459
ctsEntry: 0010000000000000 0020000000000000 a1000000a2000000000000000000000000000000000000000000000000000000 07000000 02000000 0500000000000000
cts layout: 256 slots x 8 entries x 64 bytes; completion records 256 x 8 x int32
parseCTS ok: ok
parseCTS 0 buffers: error
parseCTS 9 buffers: error
parseCTS address 0: error
parseCTS rkey 0: error
parseCTS entry 1 not yet: not ready
irecv 0 bytes registered: address buffer, rkey buffer
irecv 0 bytes without buffer: address records, rkey records
irecv 8 bytes: address buffer, rkey buffer
imm 0: 00000000
imm 8: 00000008
imm 1073741824: 40000000
imm truncated 100: 80000064
imm truncated 2147483647: ffffffff
sizeRecord 0: 0
sizeRecord 8: 8
sizeRecord truncated 100: -101
chunkSize 1/1: 128
chunkSize 1000/3: 384
chunkSize 1048576/4: 262144
chunkSize 1048577/4: 262272
dataQP nData=2 nqps=4: 0,1 2,3 0,1 2,3
dataQP nData=3 nqps=4: 0,1,2 3,0,1 2,3,0
handshake connection: kept open, idle, by both comms
`,
}

// TestWireMatchesProtoVersion: this build's wire is the one its protoVersion
// promises. Failing here means a wire change without a version bump (two
// builds claiming one version would connect and then fail or corrupt data):
// bump protoVersion in oob.go and add the new transcript to wireGolden.
func TestWireMatchesProtoVersion(t *testing.T) {
	got := wireTranscript(t)
	want, ok := wireGolden[protoVersion]
	require.Truef(t, ok, "no wire transcript for protoVersion %d in wireGolden; this build's:\n%s", protoVersion, strings.Join(got, "\n"))
	if diff := golden.Diff(want, got, fmt.Sprintf("protoVersion %d says", protoVersion), "this build says   "); len(diff) > 0 {
		t.Fatalf("the wire differs from what protoVersion %d promises (bump protoVersion in oob.go and add this build's transcript to wireGolden):\n%s\nthis build's transcript:\n%s",
			protoVersion, strings.Join(diff, "\n"), strings.Join(got, "\n"))
	}
}

// TestEveryShippedVersionDiffers: a version whose transcript equals an older
// one's was a bump for nothing, and one that equals a newer one's means an
// entry was edited after the fact.
func TestEveryShippedVersionDiffers(t *testing.T) {
	for v, a := range wireGolden {
		for w, b := range wireGolden {
			if v < w {
				require.NotEqualf(t, strings.TrimSpace(a), strings.TrimSpace(b), "wireGolden %d and %d are the same wire", v, w)
			}
		}
	}
}

func le(v any) []byte {
	var b bytes.Buffer
	if err := binary.Write(&b, binary.LittleEndian, v); err != nil {
		panic(err)
	}
	return b.Bytes()
}

// wireTranscript describes, one line per item, every message and rule of the
// wire with fixed inputs.
func wireTranscript(t *testing.T) []string {
	t.Helper()
	var out []string
	add := func(f string, a ...any) { out = append(out, fmt.Sprintf(f, a...)) }

	var h nccl.Handle
	writeHandle(&h, handleInfo{magic: 0x1122334455667788, secret: 0x99aabbccddeeff00, addr: netip.MustParseAddrPort("192.0.2.7:4791")})
	add("handle: %s", golden.Hex(h[:56], 8, 16, 17, 18, 20, 40, 48))
	add("hello: %s", golden.Hex(le(&hello{Magic: 0x1122334455667788, Type: socketTypeNetIB, Version: protoVersion, Secret: 0x99aabbccddeeff00, NDevs: 2, LinkLayer: 1}), 8, 12, 16, 24, 28))
	add("helloReply: %s", golden.Hex(le(&helloReply{NDevs: 2, LinkLayer: 1}), 4, 8, 12))
	m := connMeta{NDevs: 2, NQPs: 3, NDataQPs: 2, Split: 1, Addr: 0x7f0000001000, TC: 106, SL: 3}
	for i := range m.Devs[:2] {
		m.Devs[i] = devMeta{LID: uint16(10 + i), LinkLayer: 2, MTU: 5, Port: 1, RKey: uint32(0x100 + i)}
		m.Devs[i].GID[0], m.Devs[i].GID[15] = 0xfe, byte(i)
	}
	for i := range m.QPs[:3] {
		m.QPs[i] = qpMeta{QPN: uint32(0x200 + i), Dev: uint8(i % 2), ECE: [3]uint32{0x15b3, uint32(i), 1}}
	}
	mb := le(&m)
	sum := sha256.Sum256(mb)
	add("connMeta: %d bytes, sha256 %s", len(mb), hex.EncodeToString(sum[:16]))
	add("ready: %s", hex.EncodeToString(le(uint32(readyMagic))))

	e := ctsEntry{Addr: 0x1000, Size: 0x2000, Tag: 7, NReqs: 2, Idx: 5}
	e.RKeys[0], e.RKeys[1] = 0xa1, 0xa2
	eb := unsafe.Slice((*byte)(unsafe.Pointer(&e)), unsafe.Sizeof(e))
	add("ctsEntry: %s", golden.Hex(eb, 8, 16, 48, 52, 56))
	add("cts layout: %d slots x %d entries x %d bytes; completion records %d x %d x int32", maxRequests, maxRecvs, ctsEntrySize, maxRequests, maxRecvs)

	verdict := func(ents *[maxRecvs]ctsEntry, idx uint64) string {
		_, ready, err := parseCTS(ents, idx)
		switch {
		case err != nil:
			return "error"
		case !ready:
			return "not ready"
		}
		return "ok"
	}
	good := func() *[maxRecvs]ctsEntry {
		var g [maxRecvs]ctsEntry
		for i := range g[:2] {
			g[i] = ctsEntry{Addr: 0x1000, Size: 64, NReqs: 2, Idx: 3}
			g[i].RKeys[0] = 0xa1
		}
		return &g
	}
	add("parseCTS ok: %s", verdict(good(), 3))
	for _, c := range []struct {
		name string
		mod  func(*[maxRecvs]ctsEntry)
	}{
		{"0 buffers", func(g *[maxRecvs]ctsEntry) { g[0].NReqs = 0 }},
		{"9 buffers", func(g *[maxRecvs]ctsEntry) { g[0].NReqs = maxRecvs + 1 }},
		{"address 0", func(g *[maxRecvs]ctsEntry) { g[1].Addr = 0 }},
		{"rkey 0", func(g *[maxRecvs]ctsEntry) { g[1].RKeys[0] = 0 }},
		{"entry 1 not yet", func(g *[maxRecvs]ctsEntry) { g[1].Idx = 2 }},
	} {
		g := good()
		c.mod(g)
		add("parseCTS %s: %s", c.name, verdict(g, 3))
	}

	// What a receiver advertises, from a real Irecv on the software NIC.
	setEnv(t)
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	sc, rc := connectPair(t, a, 0, b, 0)
	zero, eight := newBuf(t, rc, 0, 0), newBuf(t, rc, 8, 0)
	bufs := []nccl.RecvBuffer{
		{Data: zero.ptr(), Size: 0, Tag: 0, MH: zero.mh},
		{Data: nil, Size: 0, Tag: 1},
		{Data: eight.ptr(), Size: 8, Tag: 2, MH: eight.mh},
	}
	slot := int(rc.fifoHead % maxRequests)
	rreq, err := rc.Irecv(bufs)
	require.NoError(t, err)
	require.NotEqual(t, nccl.NoRequest, rreq)
	recKey := rc.recMem.rkeys[0]
	for i, name := range []string{"0 bytes registered", "0 bytes without buffer", "8 bytes"} {
		ent := rc.cts[slot][i]
		addr, key := "other", "other"
		switch {
		case ent.Addr == 0:
			addr = "0"
		case ent.Addr == uint64(uintptr(bufs[i].Data)):
			addr = "buffer"
		case ent.Addr == rc.recMem.addr():
			addr = "records"
		}
		switch {
		case ent.RKeys[0] == 0:
			key = "0"
		case bufs[i].MH != 0 && ent.RKeys[0] == lookupMR(bufs[i].MH).rkeys[0]:
			key = "buffer"
		case ent.RKeys[0] == recKey:
			key = "records"
		}
		add("irecv %s: address %s, rkey %s", name, addr, key)
	}
	// Let the receive complete, so the comms close clean.
	// (A grouped receive's sends are written once all of them are matched.)
	sbuf := newBuf(t, sc, 8, 1)
	var sreqs [3]nccl.Request
	for tag, size := range []int{0, 0, 8} {
		within(t, "isend", func() (bool, error) {
			var err error
			sreqs[tag], err = sc.Isend(sbuf.ptr(), size, tag, sbuf.mh)
			return sreqs[tag] != nccl.NoRequest, err
		})
	}
	for _, r := range sreqs {
		within(t, "send test", func() (bool, error) { done, _, err := sc.Test(r); return done, err })
	}
	within(t, "recv test", func() (bool, error) { return rc.Test(rreq, make([]int, 3)) })

	for _, s := range []int{0, 8, 1 << 30} {
		add("imm %d: %08x", s, immOf(s, false))
	}
	for _, s := range []int{100, 1<<31 - 1} {
		add("imm truncated %d: %08x", s, immOf(s, true))
	}
	add("sizeRecord 0: %d", sizeRecordOf(0, false))
	add("sizeRecord 8: %d", sizeRecordOf(8, false))
	add("sizeRecord truncated 100: %d", sizeRecordOf(100, true))
	for _, c := range [][2]int{{1, 1}, {1000, 3}, {1 << 20, 4}, {1<<20 + 1, 4}} {
		add("chunkSize %d/%d: %d", c[0], c[1], chunkSize(c[0], c[1]))
	}
	for _, nd := range []int{2, 3} {
		var msgs []string
		for seq := uint64(0); seq < 4 && (nd == 2 || seq < 3); seq++ {
			var qs []string
			for i := 0; i < nd; i++ {
				qs = append(qs, fmt.Sprint(dataQP(seq, i, nd, 4)))
			}
			msgs = append(msgs, strings.Join(qs, ","))
		}
		add("dataQP nData=%d nqps=4: %s", nd, strings.Join(msgs, " "))
	}
	kept := "closed"
	if sc.watch.conn != nil && rc.watch.conn != nil {
		kept = "kept open, idle, by both comms"
	}
	add("handshake connection: %s", kept)
	return out
}

// TestOlderBuildsHelloIsRefusedWithAWarn: a connector of the same job (this
// listen's magic and secret) that speaks protocol version 1 is refused before
// any comm exists, with a WARN naming both versions on the listener and a
// closed connection, which the older connector reports as "the listener
// closed the connection without answering ... different plugin builds". The
// listen stays usable for the right peer.
func TestOlderBuildsHelloIsRefusedWithAWarn(t *testing.T) {
	setEnv(t)
	_, a, b := twoHosts(t, softnic.DeviceConfig{})
	l, h := listenOn(t, b, 0)
	hi, err := readHandle(h)
	require.NoError(t, err)
	c, err := net.Dial("tcp", hi.addr.String())
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, writeMsg(c, &hello{Magic: hi.magic, Type: socketTypeNetIB, Version: 1, Secret: hi.secret, NDevs: 1, LinkLayer: uint32(verbs.LinkInfiniBand)}))
	var r helloReply
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	require.ErrorIs(t, readMsg(c, &r), io.EOF, "the listener answered an older build's hello")
	require.True(t, b.log.has(fmt.Sprintf("WARN NET/GoIB : refusing the connection from %v: its protocol version 1 is not this build's %d", c.LocalAddr(), protoVersion)), b.log.String())
	sc, rc := connectVia(t, a, 0, l, h)
	got, _ := transfer(t, sc, rc, []int{99}, []int{99})
	require.Equal(t, pattern(99, 0), got[0][:99])
}
