package socket

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclsock"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Fuzz targets for every wire decoder of the socket transport: the
// connection handle (from another rank, through NCCL), the hello (from
// whoever connects to a listener), the message header, and a whole control
// stream driven through a receiving comm. Seeds live in testdata/fuzz/.

func FuzzDecodeHandle(f *testing.F) {
	var h nccl.Handle
	hi := handleInfo{magic: ncclsock.DefaultMagic, version: protoVersion, addr: netip.MustParseAddrPort("10.1.2.3:4567"), streams: 4, minChunk: 65536}
	encodeHandle(&h, &hi)
	f.Add(h[:])
	hi.addr = netip.MustParseAddrPort("[fe80::1]:80")
	encodeHandle(&h, &hi)
	f.Add(h[:])
	f.Fuzz(func(t *testing.T, b []byte) {
		var h nccl.Handle
		copy(h[:], b)
		m := binary.LittleEndian.Uint64(h[hOffMagic:])
		got, err := decodeHandle(&h, m)
		if err != nil {
			if nccl.ResultOf(err) == nccl.Success {
				t.Fatalf("a rejected handle must carry an error code: %v", err)
			}
			return
		}
		if got.streams < 0 || got.streams > maxStreams || got.minChunk < 4096 || got.addr.Port() == 0 ||
			!got.addr.Addr().IsValid() || got.addr.Addr().IsUnspecified() || got.version != protoVersion {
			t.Fatalf("decodeHandle accepted an out-of-range handle: %+v", got)
		}
		var again nccl.Handle
		encodeHandle(&again, &got)
		back, err := decodeHandle(&again, m)
		if err != nil || back != got {
			t.Fatalf("handle does not round-trip: %+v -> %+v (%v)", got, back, err)
		}
	})
}

func FuzzHello(f *testing.F) {
	want := handleInfo{magic: ncclsock.DefaultMagic, version: protoVersion, streams: 3}
	want.secret[0] = 7
	var b [helloLen]byte
	for _, idx := range []int{ctrlIndex, beatIndex, 0, 2, 3} {
		m := hello{magic: ncclsock.DefaultMagic, version: protoVersion, index: idx, streams: 3, secret: want.secret, connID: 5}
		m.encode(b[:])
		f.Add(b[:])
	}
	f.Add([]byte("GET / HTTP/1.0\r\n\r\nGET / HTTP/1.0\r\n\r\nxxxx"))
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < helloLen {
			return // the listener waits for helloLen bytes before it decodes
		}
		m := decodeHello(in[:helloLen])
		v := checkHello(m, want)
		if v == helloOK && m.index != ctrlIndex && m.index != beatIndex && (m.index < 0 || m.index >= want.streams) {
			t.Fatalf("accepted stream index %d of %d", m.index, want.streams)
		}
		var out [helloLen]byte
		m.encode(out[:])
		if decodeHello(out[:]) != m {
			t.Fatalf("hello does not round-trip: %+v", m)
		}
	})
}

func FuzzParseHeader(f *testing.F) {
	var h [hdrLen]byte
	binary.LittleEndian.PutUint32(h[0:], 1<<20)
	binary.LittleEndian.PutUint32(h[4:], 0)
	binary.LittleEndian.PutUint32(h[8:], 3)
	binary.LittleEndian.PutUint32(h[12:], hdrCheck^5)
	f.Add(h[:], uint32(5), uint8(4))
	binary.LittleEndian.PutUint32(h[4:], 1<<20)
	f.Add(h[:], uint32(5), uint8(0))
	f.Fuzz(func(t *testing.T, b []byte, seq uint32, streams uint8) {
		m, err := parseHeader(b, seq, int(streams))
		if err != nil {
			return
		}
		if m.size < 0 || m.size > nccl.MaxNetSize || m.ctrlLen < 0 || m.ctrlLen > m.size || (streams == 0 && m.ctrlLen != m.size) {
			t.Fatalf("parseHeader accepted %+v with %d streams", m, streams)
		}
	})
}

// FuzzControlStream feeds arbitrary bytes to a receiving comm as its
// control stream (and as its data streams), with receives posted: whatever
// arrives, the comm may fail but must not panic, hang, or write outside the
// buffers it was given.
func FuzzControlStream(f *testing.F) {
	hdr := func(size, ctrlLen, tag int, seq uint32) []byte {
		var h [hdrLen]byte
		binary.LittleEndian.PutUint32(h[0:], uint32(size))
		binary.LittleEndian.PutUint32(h[4:], uint32(ctrlLen))
		binary.LittleEndian.PutUint32(h[8:], uint32(tag))
		binary.LittleEndian.PutUint32(h[12:], hdrCheck^seq)
		return h[:]
	}
	inline := append(hdr(10, 10, 1, 0), []byte("0123456789")...)
	f.Add(inline, []byte{}, uint8(0), uint16(16), uint8(1))
	f.Add(append(inline, hdr(100, 100, 1, 1)...), []byte{}, uint8(0), uint16(16), uint8(2))
	f.Add(hdr(9000, 0, 1, 0), bytes.Repeat([]byte{1}, 9000), uint8(1), uint16(9000), uint8(1))
	f.Add(hdr(9000, 0, 1, 0), bytes.Repeat([]byte{2}, 9000), uint8(2), uint16(100), uint8(1))
	f.Add(append(hdr(5, 5, 2, 0), 1, 2, 3, 4, 5), []byte{}, uint8(0), uint16(16), uint8(1))
	f.Fuzz(func(t *testing.T, ctrl, data []byte, streams uint8, capacity uint16, nrecv uint8) {
		ns := int(streams % 4)
		n := int(nrecv%maxRecvs) + 1
		r, peers := fuzzRecvComm(t, ns)
		defer r.Close()
		for _, p := range peers {
			defer unix.Close(p)
		}
		// Everything the "sender" wrote is in the sockets before the comm
		// reads; then the sender is gone.
		writeAll(t, peers[0], ctrl)
		for i := 0; i < ns; i++ {
			writeAll(t, peers[2+i], data)
		}
		for _, p := range peers {
			unix.Shutdown(p, unix.SHUT_WR)
		}
		const guard = 64
		bufs := make([]nccl.RecvBuffer, n)
		mem := make([][]byte, n)
		for i := range bufs {
			mem[i] = bytes.Repeat([]byte{0xEE}, int(capacity)+guard)
			bufs[i] = nccl.RecvBuffer{Data: bufPtr(mem[i]), Size: int(capacity), Tag: 1 + i%2}
		}
		for round := 0; round < 4; round++ {
			rq, err := r.Irecv(bufs)
			if err != nil || rq == nccl.NoRequest {
				break
			}
			sizes := make([]int, n)
			done := false
			for i := 0; i < 1000 && !done && err == nil; i++ {
				done, err = r.Test(rq, sizes)
			}
			if !done && err == nil {
				t.Fatal("a receive over a closed control stream neither completed nor failed")
			}
			for i, m := range mem {
				if !bytes.Equal(m[capacity:], bytes.Repeat([]byte{0xEE}, guard)) {
					t.Fatalf("bytes written past receive buffer %d of %d bytes", i, capacity)
				}
				if done && sizes[i] > int(capacity) {
					t.Fatalf("buffer %d of %d bytes reported %d received", i, capacity, sizes[i])
				}
			}
			if err != nil {
				if nccl.ResultOf(err) == nccl.Success {
					t.Fatalf("failure without an error code: %v", err)
				}
				if nccl.ResultOf(err) != nccl.InvalidUsage {
					break // the connection is gone
				}
			}
		}
	})
}

// fuzzRecvComm is a receiving comm over socket pairs: peers[0] writes its
// control stream, peers[1] is the liveness stream, peers[2:] the data streams.
func fuzzRecvComm(t *testing.T, streams int) (*recvComm, []int) {
	pair := func() (int, int) {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		return fds[0], fds[1]
	}
	cs := conns{data: make([]int, streams)}
	peers := make([]int, 2+streams)
	cs.ctrl, peers[0] = pair()
	cs.beat, peers[1] = pair()
	for i := range cs.data {
		cs.data[i], peers[2+i] = pair()
	}
	hi := handleInfo{streams: streams, minChunk: 4096}
	o := sockOpts{inline: defaultInline, idleInline: defaultIdleInline, live: livePolicyFor(0)}
	r, err := newRecvComm(cs, hi, o, nccl.DiscardLogger{})
	if err != nil {
		t.Fatal(err)
	}
	return r, peers
}

func writeAll(t *testing.T, fd int, b []byte) {
	for len(b) > 0 {
		// A socket pair holds a few hundred KiB; fuzz inputs are smaller.
		n, err := unix.Write(fd, b)
		if err != nil {
			t.Skipf("input larger than a socket pair buffers (%v)", err)
		}
		b = b[n:]
	}
}
