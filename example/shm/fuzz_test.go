package shm

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Everything shm reads that another process wrote is a wire format: the
// handle NCCL copies from the listening rank, the header of the connection
// file, the receiver's clear-to-send slots and the sender's message
// descriptors. A buggy or hostile peer must not make us panic, write outside
// a posted buffer or read outside the ring. The seed corpora are in
// testdata/fuzz/<FuzzName>.

// FuzzDecodeHandle: any 128 bytes decode to an error or to a path that is one
// of our connection files (Connect opens nothing else).
func FuzzDecodeHandle(f *testing.F) {
	var h nccl.Handle
	encodeHandle(&h, [16]byte{1, 2, 3}, bytes.Repeat([]byte{7}, secretLen), "/dev/shm/ncclgo-shm-42-00112233445566ff")
	f.Add(h[:])
	encodeHandle(&h, [16]byte{}, make([]byte, secretLen), "/dev/shm/../etc/passwd")
	f.Add(h[:])
	f.Add(make([]byte, nccl.HandleSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h nccl.Handle
		copy(h[:], b)
		boot, secret, path, err := decodeHandle(&h)
		if err != nil {
			if nccl.ResultOf(err) != nccl.InvalidArgument {
				t.Fatalf("a bad handle must be ncclInvalidArgument: %v", err)
			}
			return
		}
		if !isConnPath(path) || len(secret) != secretLen || len(path) > maxPathLen {
			t.Fatalf("accepted path %q (secret %d bytes)", path, len(secret))
		}
		var again nccl.Handle
		encodeHandle(&again, boot, secret, path)
		_, _, p2, err := decodeHandle(&again)
		if err != nil || p2 != path {
			t.Fatalf("re-encoding %q gave %q, %v", path, p2, err)
		}
	})
}

// fakeRegion is a connection file in Go memory (8-byte aligned, as a mapping
// is), for decoders that only look at the header and ring.
func fakeRegion(ringSize uint64) *region {
	mem := make([]byte, headerSize+ringSize)
	r := &region{mem: mem, fd: -1, path: "fuzz", ringSize: ringSize, ring: mem[headerSize:]}
	r.h = newHdr(mem)
	return r
}

// FuzzHeader: the header a connector checks before trusting the file.
func FuzzHeader(f *testing.F) {
	good := make([]byte, offSides)
	binary.LittleEndian.PutUint64(good[offMagic:], fileMagic)
	binary.LittleEndian.PutUint32(good[offVersion:], layoutVersion)
	binary.LittleEndian.PutUint32(good[offMaxRecvs:], maxRecvs)
	binary.LittleEndian.PutUint64(good[offRingSize:], minRing)
	f.Add(good, uint64(headerSize+minRing))
	f.Add(good, uint64(headerSize+2*minRing))
	f.Add(make([]byte, offSides), uint64(0))
	r := fakeRegion(minRing)
	f.Fuzz(func(t *testing.T, hdrBytes []byte, fileSize uint64) {
		clear(r.mem[:offSides])
		copy(r.mem[:offSides], hdrBytes)
		rs, err := checkHeader(r.h, fileSize)
		if err != nil {
			return
		}
		if rs < minRing || rs > maxRing || rs&(rs-1) != 0 || fileSize != headerSize+rs {
			t.Fatalf("accepted ring %d in a %d-byte file", rs, fileSize)
		}
	})
}

const canary = 0xC5

// FuzzDescriptor: the sender's message descriptor and ring position as the
// receiver reads them. Two posted buffers sit between canaries that must
// survive whatever the descriptor says.
func FuzzDescriptor(f *testing.F) {
	f.Add(uint64(0), uint32(0), uint32(0), uint64(100), uint64(100))               // a fine message
	f.Add(uint64(0), uint32(1), uint32(0), uint64(4096), uint64(4096))             // larger than buffer 1
	f.Add(uint64(0), uint32(0), uint32(flagTrunc), uint64(1<<20), uint64(0))       // flagged truncation
	f.Add(uint64(5), uint32(0), uint32(0), uint64(10), uint64(10))                 // a receive never posted
	f.Add(uint64(0), uint32(9), uint32(0), uint64(10), uint64(10))                 // no such buffer
	f.Add(uint64(0), uint32(0), uint32(0), uint64(nccl.MaxNetSize+1), uint64(1e6)) // oversized
	f.Add(uint64(0), uint32(0), uint32(0), uint64(100), uint64(1<<62))             // ring head far ahead
	f.Fuzz(func(t *testing.T, idx uint64, entry, flags uint32, size, ringHead uint64) {
		r := fakeRegion(minRing)
		c := &recvComm{endpoint: endpoint{r: r, side: sideRecv, mask: r.ringSize - 1, peer: "fuzz"}}
		c.w = peerWatch{r: r, peer: sideSend, self: true}
		bufs := make([]byte, 64+256+64+512+64)
		for i := range bufs {
			bufs[i] = canary
		}
		b0, b1 := bufs[64:64+256], bufs[64+256+64:64+256+64+512]
		if _, err := c.Irecv([]nccl.RecvBuffer{{Data: ptr(b0), Size: len(b0), Tag: 1}, {Data: ptr(b1), Size: len(b1), Tag: 2}}); err != nil {
			t.Fatal(err)
		}
		h := r.h
		h.u64(descOff(0, descIdx)).Store(idx)
		h.u32(descOff(0, descEntry)).Store(entry)
		h.u32(descOff(0, descFlags)).Store(flags)
		h.u64(descOff(0, descBytes)).Store(size)
		h.u64(offSendLine).Store(1)
		h.u64(offSendLine + 8).Store(ringHead)
		for i := 0; i < 4; i++ {
			c.progress()
			_, _ = c.Test(0, []int{0, 0})
		}
		for i, b := range bufs {
			inside := i >= 64 && i < 64+256 || i >= 64+256+64 && i < 64+256+64+512
			if !inside && b != canary {
				t.Fatalf("byte %d outside the posted buffers was written", i)
			}
		}
	})
}

// FuzzCTS: a clear-to-send slot as the sender reads it.
func FuzzCTS(f *testing.F) {
	f.Add(uint64(1), uint32(1), uint64(4096), int32(0), 100, 0)             // a fine slot
	f.Add(uint64(1), uint32(0), uint64(0), int32(0), 0, 0)                  // n = 0
	f.Add(uint64(1), uint32(99), uint64(1), int32(0), 1, 0)                 // n > maxRecvs
	f.Add(uint64(1), uint32(2), uint64(1<<63), int32(3), 1<<20, 3)          // absurd capacity
	f.Add(uint64(7), uint32(1), uint64(10), int32(0), 10, 0)                // not published yet
	f.Add(uint64(1), uint32(1), uint64(10), int32(-1), nccl.MaxNetSize, -1) // truncation
	f.Fuzz(func(t *testing.T, seq uint64, n uint32, capacity uint64, ctsTag int32, size, tag int) {
		if size < 0 || size > nccl.MaxNetSize {
			return // the glue only passes 0..MaxNetSize
		}
		r := fakeRegion(minRing)
		s := newSendComm(r, peerWatch{r: r, peer: sideRecv, self: true}, nil)
		h := r.h
		h.u32(ctsOff(0, ctsN)).Store(n)
		for e := 0; e < maxRecvs; e++ {
			h.u64(ctsOff(0, ctsSizes+8*e)).Store(capacity)
			h.u32(ctsOff(0, ctsTags+4*e)).Store(uint32(ctsTag))
		}
		h.u64(ctsOff(0, ctsSeq)).Store(seq)
		src := make([]byte, min(size, 1<<16))
		id, err := s.Isend(ptr(src), len(src), tag, 1)
		if err != nil || id == nccl.NoRequest {
			return
		}
		_, _, _ = s.Test(id)
		if got := h.u64(offSendLine + 8).Load(); got > uint64(len(src)) {
			t.Fatalf("the sender produced %d ring bytes for a %d-byte message", got, len(src))
		}
	})
}
