package socket

import (
	"encoding/binary"
	"net/netip"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// protoVersion changes whenever the handshake or the wire format changes, so
// that two different builds refuse each other instead of corrupting data.
// 2: every connection has a liveness stream (hello index 254).
const protoVersion = 2

// Handle layout (128 bytes, little endian). The listener fills bytes 0..63;
// bytes 96..127 belong to the connector's own copy (NCCL passes the same
// buffer on every connect retry) and hold its pending-connect id.
//
//	0   magic          uint64  NCCL_SOCKET_MAGIC of the listener
//	8   version        uint16  protoVersion
//	10  family         uint8   4 or 6
//	11  streams        uint8   data streams the connector must open (0..64)
//	12  port           uint16
//	14  reserved
//	16  address        [16]byte (IPv4 as ::ffff:a.b.c.d)
//	32  minChunk       uint32  striping unit the listener expects
//	36  reserved
//	40  secret         [16]byte random per listen
//	96  connMarker     uint32  "GSKC" once a connect is pending
//	100 connID         uint64  the pending connect
const (
	hOffMagic   = 0
	hOffVersion = 8
	hOffFamily  = 10
	hOffStreams = 11
	hOffPort    = 12
	hOffAddr    = 16
	hOffChunk   = 32
	hOffSecret  = 40
	hOffMarker  = 96
	hOffConnID  = 100

	connMarker = 0x434b5347 // "GSKC"
	secretLen  = 16
)

// handleInfo is what a listener tells connectors.
type handleInfo struct {
	magic    uint64
	version  uint16
	addr     netip.AddrPort
	streams  int
	minChunk int
	secret   [secretLen]byte
}

func encodeHandle(h *nccl.Handle, hi *handleInfo) {
	*h = nccl.Handle{}
	binary.LittleEndian.PutUint64(h[hOffMagic:], hi.magic)
	binary.LittleEndian.PutUint16(h[hOffVersion:], hi.version)
	if hi.addr.Addr().Is4() {
		h[hOffFamily] = 4
	} else {
		h[hOffFamily] = 6
	}
	h[hOffStreams] = byte(hi.streams)
	binary.LittleEndian.PutUint16(h[hOffPort:], hi.addr.Port())
	a16 := hi.addr.Addr().As16()
	copy(h[hOffAddr:], a16[:])
	binary.LittleEndian.PutUint32(h[hOffChunk:], uint32(hi.minChunk))
	copy(h[hOffSecret:], hi.secret[:])
}

// decodeHandle checks and reads a listener's handle; ourMagic is this side's
// NCCL_SOCKET_MAGIC, which must agree.
func decodeHandle(h *nccl.Handle, ourMagic uint64) (handleInfo, error) {
	var hi handleInfo
	hi.magic = binary.LittleEndian.Uint64(h[hOffMagic:])
	hi.version = binary.LittleEndian.Uint16(h[hOffVersion:])
	if hi.magic != ourMagic {
		return hi, nccl.Errorf(nccl.InvalidUsage, "the connection handle carries socket magic %#x but this rank uses %#x: "+
			"set the same %s on every rank (or none); or this handle is not from a socket-transport listener "+
			"(one rank uses ib, this one socket: set the same NCCL_GO_TRANSPORT on every rank)", hi.magic, ourMagic, envMagic)
	}
	if hi.version != protoVersion {
		return hi, nccl.Errorf(nccl.InvalidUsage, "the peer runs socket protocol version %d, this library speaks %d: "+
			"use the same libnccl-net-go build on every host, and the same transport: a handle from an ib listener "+
			"cannot be used by socket (set the same NCCL_GO_TRANSPORT on every rank, or NCCL_IB_DISABLE=1 everywhere)", hi.version, protoVersion)
	}
	var a16 [16]byte
	copy(a16[:], h[hOffAddr:])
	addr := netip.AddrFrom16(a16)
	switch h[hOffFamily] {
	case 4:
		if !addr.Is4In6() {
			return hi, nccl.Errorf(nccl.InvalidArgument, "corrupt connection handle: family 4 with address %v", addr)
		}
		addr = addr.Unmap()
	case 6:
	default:
		return hi, nccl.Errorf(nccl.InvalidArgument, "corrupt connection handle: address family %d", h[hOffFamily])
	}
	port := binary.LittleEndian.Uint16(h[hOffPort:])
	if port == 0 || !addr.IsValid() || addr.IsUnspecified() {
		return hi, nccl.Errorf(nccl.InvalidArgument, "corrupt connection handle: listen address %v port %d", addr, port)
	}
	hi.addr = netip.AddrPortFrom(addr, port)
	hi.streams = int(h[hOffStreams])
	if hi.streams > maxStreams {
		return hi, nccl.Errorf(nccl.InvalidArgument, "corrupt connection handle: %d streams (at most %d)", hi.streams, maxStreams)
	}
	hi.minChunk = int(binary.LittleEndian.Uint32(h[hOffChunk:]))
	if hi.minChunk < 4096 {
		return hi, nccl.Errorf(nccl.InvalidArgument, "corrupt connection handle: chunk size %d", hi.minChunk)
	}
	copy(hi.secret[:], h[hOffSecret:])
	return hi, nil
}

// pendingConn reads the connector's retry state from its handle copy.
func pendingConn(h *nccl.Handle) (uint64, bool) {
	if binary.LittleEndian.Uint32(h[hOffMarker:]) != connMarker {
		return 0, false
	}
	return binary.LittleEndian.Uint64(h[hOffConnID:]), true
}

func setPendingConn(h *nccl.Handle, id uint64) {
	binary.LittleEndian.PutUint32(h[hOffMarker:], connMarker)
	binary.LittleEndian.PutUint64(h[hOffConnID:], id)
}

// Hello is the first thing the connector writes on every TCP stream:
//
//	0  magic    uint64
//	8  version  uint16
//	10 index    uint8   stream index: 0..streams-1 data, 254 liveness, 255 control
//	11 streams  uint8
//	12 reserved uint32
//	16 secret   [16]byte from the handle
//	32 connID   uint64  ties the streams of one connection together
const (
	helloLen  = 40
	ctrlIndex = 255
	beatIndex = 254
)

type hello struct {
	magic   uint64
	version uint16
	index   int
	streams int
	secret  [secretLen]byte
	connID  uint64
}

func (m *hello) encode(b []byte) {
	_ = b[helloLen-1]
	clear(b[:helloLen])
	binary.LittleEndian.PutUint64(b[0:], m.magic)
	binary.LittleEndian.PutUint16(b[8:], m.version)
	b[10] = byte(m.index)
	b[11] = byte(m.streams)
	copy(b[16:32], m.secret[:])
	binary.LittleEndian.PutUint64(b[32:], m.connID)
}

// helloVerdict is what a listener makes of a hello.
type helloVerdict int

const (
	helloOK helloVerdict = iota
	helloBadMagic
	helloBadVersion
	helloBadSecret
	helloBadLayout
)

// checkHello judges a hello against the listener's own handle: a stream
// joins a connection only with the right magic, version and secret, and an
// index the announced layout has.
func checkHello(m hello, want handleInfo) helloVerdict {
	switch {
	case m.magic != want.magic:
		return helloBadMagic
	case m.version != protoVersion:
		return helloBadVersion
	case m.secret != want.secret:
		return helloBadSecret
	case m.streams != want.streams || (m.index != ctrlIndex && m.index != beatIndex && m.index >= m.streams):
		return helloBadLayout
	}
	return helloOK
}

// decodeHello reads a hello; b must hold helloLen bytes. The listener checks
// the fields (greeting.check).
func decodeHello(b []byte) hello {
	var m hello
	m.magic = binary.LittleEndian.Uint64(b[0:])
	m.version = binary.LittleEndian.Uint16(b[8:])
	m.index = int(b[10])
	m.streams = int(b[11])
	copy(m.secret[:], b[16:32])
	m.connID = binary.LittleEndian.Uint64(b[32:])
	return m
}

// Message header on the control stream, sender to receiver (16 bytes):
//
//	0  size     uint32  bytes of the message
//	4  ctrlLen  uint32  of those, bytes that follow the header on the control
//	                    stream; the rest is striped over the data streams
//	8  tag      int32
//	12 check    uint32  hdrCheck ^ sequence number, to catch a desync
//
// Nothing flows from the receiver to the sender on the control or data
// streams: a sender closes as soon as its sends are handed to the kernel, and
// a socket closed with unread bytes is reset, destroying what the receiver
// has not read yet.
const (
	hdrLen   = 16
	hdrCheck = 0x47534b48 // "GSKH"
)

type msgHeader struct {
	size, ctrlLen, tag int
}

// putHeader writes the header of message seq (parseHeader reads it).
func putHeader(h []byte, size, ctrlLen, tag int, seq uint32) {
	_ = h[hdrLen-1]
	binary.LittleEndian.PutUint32(h[0:], uint32(size))
	binary.LittleEndian.PutUint32(h[4:], uint32(ctrlLen))
	binary.LittleEndian.PutUint32(h[8:], uint32(int32(tag)))
	binary.LittleEndian.PutUint32(h[12:], hdrCheck^seq)
}

// parseHeader checks and reads a message header: seq is the message's
// sequence number, streams the connection's data stream count.
func parseHeader(h []byte, seq uint32, streams int) (msgHeader, error) {
	var m msgHeader
	if len(h) < hdrLen {
		return m, nccl.Errorf(nccl.SystemError, "short header (%d bytes)", len(h))
	}
	if binary.LittleEndian.Uint32(h[12:]) != hdrCheck^seq {
		return m, nccl.Errorf(nccl.SystemError, "sequence check %#x, expected %#x", binary.LittleEndian.Uint32(h[12:]), hdrCheck^seq)
	}
	m.size = int(binary.LittleEndian.Uint32(h[0:]))
	m.ctrlLen = int(binary.LittleEndian.Uint32(h[4:]))
	m.tag = int(int32(binary.LittleEndian.Uint32(h[8:])))
	switch {
	case m.size > nccl.MaxNetSize:
		return m, nccl.Errorf(nccl.SystemError, "message of %d bytes (at most %d)", m.size, nccl.MaxNetSize)
	case m.ctrlLen > m.size:
		return m, nccl.Errorf(nccl.SystemError, "%d inline bytes of a %d-byte message", m.ctrlLen, m.size)
	case m.ctrlLen < m.size && streams == 0:
		return m, nccl.Errorf(nccl.SystemError, "%d bytes striped over a connection without data streams", m.size-m.ctrlLen)
	}
	return m, nil
}
