package socket

import (
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/internal/golden"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// wireGolden is everything two ranks exchange on a connection, and what the
// receiving rank makes of it, as each protoVersion shipped it (one line per
// item of wireTranscript). Two builds claiming the same version must agree on
// every line: a change to any of them bumps protoVersion and adds the new
// version's transcript. Never edit an existing entry. Checked 2026-11-29 by
// running ca1a83b, b173aef, fa7e68f, f893e63 and 664eefc against this build,
// each end on either side (harness transfer and conformance).
var wireGolden = map[int]string{
	// ca1a83b on (2026-11-24): a liveness stream (hello index 254) whose
	// bytes are one-byte pings, whatever their value.
	2: `
handle: 8877665544332211 0200 04 04 b712 0000 00000000000000000000ffffc0000207 00000100 00000000 000102030405060708090a0b0c0d0e0f
hello control: 8877665544332211 0200 ff 04 00000000 000102030405060708090a0b0c0d0e0f 0123456789abcdef
hello liveness: 8877665544332211 0200 fe 04 00000000 000102030405060708090a0b0c0d0e0f 0123456789abcdef
hello data 3: 8877665544332211 0200 03 04 00000000 000102030405060708090a0b0c0d0e0f 0123456789abcdef
header: 00000200 00000000 07000000 4d4b5347
parseHeader seq 5: size 131072 inline 0 tag 7
parseHeader wrong seq: error
parseHeader inline > size: error
parseHeader striped without streams: error
stripe 4 streams 64KiB 300000 bytes at 0: s0 0+77824 s1 77824+77824 s2 155648+77824 s3 233472+66528
stripe then 200000 from 1000: s0 1000+65536 s1 66536+65536 s2 132072+65536 s3 197608+3392
stripe 3 streams 4KiB 1: s0 0+1
ping: any one byte on the liveness stream; none carries meaning
`,
}

// TestWireMatchesProtoVersion: this build's wire is the one its protoVersion
// promises; failing means a wire change without a version bump (bump
// protoVersion in handle.go and add this build's transcript to wireGolden).
func TestWireMatchesProtoVersion(t *testing.T) {
	got := wireTranscript(t)
	want, ok := wireGolden[protoVersion]
	require.Truef(t, ok, "no wire transcript for protoVersion %d in wireGolden; this build's:\n%s", protoVersion, strings.Join(got, "\n"))
	if diff := golden.Diff(want, got, fmt.Sprintf("protoVersion %d says", protoVersion), "this build says   "); len(diff) > 0 {
		t.Fatalf("the wire differs from what protoVersion %d promises (bump protoVersion in handle.go and add this build's transcript to wireGolden):\n%s\nthis build's transcript:\n%s",
			protoVersion, strings.Join(diff, "\n"), strings.Join(got, "\n"))
	}
}

func wireTranscript(t *testing.T) []string {
	t.Helper()
	var out []string
	add := func(f string, a ...any) { out = append(out, fmt.Sprintf(f, a...)) }
	var secret [secretLen]byte
	for i := range secret {
		secret[i] = byte(i)
	}
	var h nccl.Handle
	encodeHandle(&h, &handleInfo{magic: 0x1122334455667788, version: protoVersion, addr: netip.MustParseAddrPort("192.0.2.7:4791"),
		streams: 4, minChunk: 65536, secret: secret})
	add("handle: %s", golden.Hex(h[:56], 8, 10, 11, 12, 14, 16, 32, 36, 40))
	var b [helloLen]byte
	for _, c := range []struct {
		name  string
		index int
	}{{"control", ctrlIndex}, {"liveness", beatIndex}, {"data 3", 3}} {
		m := hello{magic: 0x1122334455667788, version: protoVersion, index: c.index, streams: 4, secret: secret, connID: 0xefcdab8967452301}
		m.encode(b[:])
		add("hello %s: %s", c.name, golden.Hex(b[:], 8, 10, 11, 12, 16, 32))
	}
	// The header as Isend writes it (send_unsafe.go), for message 5.
	var hd [hdrLen]byte
	putHeader(hd[:], 131072, 0, 7, 5)
	add("header: %s", golden.Hex(hd[:], 4, 8, 12))
	if m, err := parseHeader(hd[:], 5, 4); err == nil {
		add("parseHeader seq 5: size %d inline %d tag %d", m.size, m.ctrlLen, m.tag)
	} else {
		add("parseHeader seq 5: error")
	}
	verdict := func(h []byte, seq uint32, streams int) string {
		if _, err := parseHeader(h, seq, streams); err != nil {
			return "error"
		}
		return "ok"
	}
	add("parseHeader wrong seq: %s", verdict(hd[:], 6, 4))
	var bad [hdrLen]byte
	putHeader(bad[:], 100, 200, 0, 0)
	add("parseHeader inline > size: %s", verdict(bad[:], 0, 4))
	putHeader(bad[:], 100, 50, 0, 0)
	add("parseHeader striped without streams: %s", verdict(bad[:], 0, 0))

	// Striping: which bytes each data stream carries is on no wire; both
	// ends derive it from the same message sequence.
	base := make([]byte, 1<<20)
	p := unsafe.Pointer(&base[0])
	stripe := func(c *core, from, size int) string {
		before := make([]uint32, len(c.streams))
		for i, s := range c.streams {
			before[i] = s.tail.Load()
		}
		var left atomic.Int32
		c.stripe(p, from, size, &left)
		var parts []string
		for i, s := range c.streams {
			for k := before[i]; k < s.tail.Load(); k++ {
				tk := s.ring[k%ringSize]
				parts = append(parts, fmt.Sprintf("s%d %d+%d", i, uintptr(tk.p)-uintptr(p), tk.n))
			}
		}
		return strings.Join(parts, " ")
	}
	newCore := func(n, chunk int) *core {
		c := &core{chunk: chunk}
		for i := 0; i < n; i++ {
			c.streams = append(c.streams, &stream{})
		}
		return c
	}
	c := newCore(4, 65536)
	add("stripe 4 streams 64KiB 300000 bytes at 0: %s", stripe(c, 0, 300000))
	add("stripe then 200000 from 1000: %s", stripe(c, 1000, 201000))
	add("stripe 3 streams 4KiB 1: %s", stripe(newCore(3, 4096), 0, 1))
	add("ping: any one byte on the liveness stream; none carries meaning")
	return out
}
