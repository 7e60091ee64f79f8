package ib

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclsock"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Fuzz targets for every decoder of bytes a peer (or NCCL's handle copy)
// controls. Seeds live in testdata/fuzz/<target>/; `make fuzz` runs each for
// a bounded time. Properties: never panic, never accept what the consumers
// of the decoded value could index or write out of bounds with.

func FuzzReadHandle(f *testing.F) {
	var h nccl.Handle
	writeHandle(&h, handleInfo{magic: ncclsock.DefaultMagic, secret: 42, addr: netip.MustParseAddrPort("192.0.2.1:4791")})
	f.Add(h[:])
	writeHandle(&h, handleInfo{magic: 1, secret: 2, addr: netip.MustParseAddrPort("[2001:db8::1]:80")})
	f.Add(h[:])
	f.Fuzz(func(t *testing.T, b []byte) {
		var h nccl.Handle
		copy(h[:], b)
		hi, err := readHandle(&h)
		if err != nil {
			return
		}
		// What decodes must encode back to the same fields.
		var again nccl.Handle
		writeHandle(&again, hi)
		hi2, err := readHandle(&again)
		if err != nil || hi2 != hi {
			t.Fatalf("handle %+v does not round-trip: %+v, %v", hi, hi2, err)
		}
	})
}

func FuzzHello(f *testing.F) {
	for _, h := range []hello{
		{Magic: ncclsock.DefaultMagic, Type: socketTypeNetIB, Version: protoVersion, Secret: 42, NDevs: 1, LinkLayer: uint32(verbs.LinkEthernet)},
		{Magic: ncclsock.DefaultMagic, Type: 3, Version: protoVersion, Secret: 42},
	} {
		var buf bytes.Buffer
		_ = binary.Write(&buf, binary.LittleEndian, &h)
		f.Add(buf.Bytes())
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var h hello
		if binary.Read(bytes.NewReader(b), binary.LittleEndian, &h) != nil {
			return
		}
		err := h.check(ncclsock.DefaultMagic, 42)
		ok := h.Magic == ncclsock.DefaultMagic && h.Type == socketTypeNetIB && h.Version == protoVersion && h.Secret == 42
		if (err == nil) != ok {
			t.Fatalf("hello %+v: check said %v", h, err)
		}
	})
}

func FuzzConnMeta(f *testing.F) {
	m := connMeta{NDevs: 2, NQPs: 4, NDataQPs: 2, Addr: 0x10000, TC: 106, SL: 3}
	for i := 0; i < 4; i++ {
		m.QPs[i] = qpMeta{QPN: uint32(0x100 + i), Dev: uint8(i % 2)}
	}
	var buf bytes.Buffer
	_ = binary.Write(&buf, binary.LittleEndian, &m)
	f.Add(buf.Bytes(), uint8(4))
	f.Fuzz(func(t *testing.T, b []byte, want uint8) {
		var m connMeta
		if binary.Read(bytes.NewReader(b), binary.LittleEndian, &m) != nil {
			return
		}
		nqps := int(want)
		if validateMeta(&m, nqps) != nil {
			return
		}
		// What connectQPs and the comms index with the accepted metadata.
		if m.NDevs < 1 || m.NDevs > maxVDevs || m.NQPs < 1 || int(m.NQPs) != nqps || m.NDataQPs < 1 || m.NDataQPs > m.NQPs {
			t.Fatalf("accepted %d devices, %d QPs, %d data QPs (want %d QPs)", m.NDevs, m.NQPs, m.NDataQPs, nqps)
		}
		for i := 0; i < nqps; i++ {
			_ = m.Devs[m.QPs[i].Dev] // must not panic
		}
	})
}

// FuzzCTSEntries feeds the sender arbitrary FIFO slot contents: whatever the
// receiver (or a corrupted write) put there, the sender either waits, fails
// the comm with a protocol error, or gets a group it can post safely.
func FuzzCTSEntries(f *testing.F) {
	var ents [maxRecvs]ctsEntry
	ents[0] = ctsEntry{Addr: 0x7f0000001000, Size: 4096, Tag: 1, NReqs: 1, Idx: 5}
	ents[0].RKeys[0] = 0x1234
	add := func() {
		var buf bytes.Buffer
		_ = binary.Write(&buf, binary.LittleEndian, &ents)
		f.Add(buf.Bytes(), uint64(5))
	}
	add()
	for r := 0; r < 3; r++ {
		ents[r] = ctsEntry{Addr: 0x7f0000001000 + uint64(r)<<12, Size: 100, Tag: 3, NReqs: 3, Idx: 5}
		ents[r].RKeys[0] = 0x99
	}
	add()
	f.Fuzz(func(t *testing.T, b []byte, idx uint64) {
		var ents [maxRecvs]ctsEntry
		if binary.Read(bytes.NewReader(b), binary.LittleEndian, &ents) != nil {
			return
		}
		n, ready, err := parseCTS(&ents, idx)
		if err != nil || !ready {
			return
		}
		if n < 1 || n > maxRecvs {
			t.Fatalf("accepted a group of %d buffers", n)
		}
		for r := 0; r < n; r++ {
			if ents[r].Idx != idx || ents[r].Addr == 0 || ents[r].RKeys[0] == 0 {
				t.Fatalf("accepted entry %d of %d: %+v", r, n, ents[r])
			}
		}
	})
}
