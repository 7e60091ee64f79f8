package ib

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/internal/abi"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// The 128-byte handle listen writes and NCCL copies to the connector:
//
//	0   u64  magic (NCCL_SOCKET_MAGIC or the built-in default)
//	8   u64  secret: random per listen; a connection that does not echo it is dropped
//	16  u8   address family (4 or 6)
//	17  u8   handle version (1)
//	18  u16  TCP port
//	20  [16] IP address (IPv4 in the first 4 bytes)
//	40  u64  connector state: pending-connect id (0 = not started); written by
//	         connect into NCCL's private copy of the handle
//	48  u64  connector state: token guarding the id against stale handles
//
// All integers little-endian.
const (
	hOffMagic   = 0
	hOffSecret  = 8
	hOffFamily  = 16
	hOffVersion = 17
	hOffPort    = 18
	hOffAddr    = 20
	hOffConnID  = 40
	hOffToken   = 48

	handleVersion = 1
	// socketTypeNetIB is NCCL's socket type tag for IB handshakes.
	socketTypeNetIB = 4
	// protoVersion is carried by the hello and changes whenever any byte the
	// two ranks exchange, or what a receiving rank makes of it, changes: the
	// handshake messages, the CTS FIFO entries, the completion records, the
	// immediates, the QP striping, the kept handshake connection. Two builds
	// that differ there then refuse each other at the handshake instead of
	// failing mid-job. TestWireMatchesProtoVersion (wire_unsafe_test.go)
	// pins all of it per version: a wire change without a bump fails there.
	//
	//	1: 2026-11-22, the first buildable ib (50a4d71).
	//	2: 2026-11-24 (c542a9c, bumped only on 2026-11-29): a receive buffer of
	//	   0 bytes advertises a real address and rkey (its registration's, or
	//	   the completion records'), and a sender refuses a CTS entry with
	//	   address or rkey 0; a version-1 receiver advertised rkey 0 there, so
	//	   every 0-byte message from a newer sender failed the comm
	//	   (ncclInternalError, "protocol error ... advertises ... rkey 0x0").
	protoVersion = 2
)

func randomU64() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux >= 3.17
	}
	v := binary.LittleEndian.Uint64(b[:])
	if v == 0 {
		v = 1
	}
	return v
}

type handleInfo struct {
	magic, secret uint64
	addr          netip.AddrPort
}

func writeHandle(h *nccl.Handle, hi handleInfo) {
	*h = nccl.Handle{}
	le := binary.LittleEndian
	le.PutUint64(h[hOffMagic:], hi.magic)
	le.PutUint64(h[hOffSecret:], hi.secret)
	a := hi.addr.Addr()
	if a.Is4() {
		h[hOffFamily] = 4
		b := a.As4()
		copy(h[hOffAddr:], b[:])
	} else {
		h[hOffFamily] = 6
		b := a.As16()
		copy(h[hOffAddr:], b[:])
	}
	h[hOffVersion] = handleVersion
	le.PutUint16(h[hOffPort:], hi.addr.Port())
}

func readHandle(h *nccl.Handle) (handleInfo, error) {
	le := binary.LittleEndian
	hi := handleInfo{magic: le.Uint64(h[hOffMagic:]), secret: le.Uint64(h[hOffSecret:])}
	if h[hOffVersion] != handleVersion {
		// The ranks disagree on build or transport: a configuration
		// mistake, reported as the socket transport reports its own.
		return hi, nccl.Errorf(nccl.InvalidUsage, "handle version %d is not %d: both ranks must load the same plugin build and use the same transport "+
			"(a socket-transport handle cannot be used by ib: set the same NCCL_GO_TRANSPORT on every rank, or NCCL_IB_DISABLE=1 everywhere)", h[hOffVersion], handleVersion)
	}
	port := le.Uint16(h[hOffPort:])
	switch h[hOffFamily] {
	case 4:
		hi.addr = netip.AddrPortFrom(netip.AddrFrom4([4]byte(h[hOffAddr:hOffAddr+4])), port)
	case 6:
		hi.addr = netip.AddrPortFrom(netip.AddrFrom16([16]byte(h[hOffAddr:hOffAddr+16])), port)
	default:
		return hi, nccl.Errorf(nccl.InternalError, "handle has address family %d (the handle is corrupt)", h[hOffFamily])
	}
	return hi, nil
}

// hello is the first message on a handshake connection (connector to
// listener). Type mirrors NCCL's socket-type check.
type hello struct {
	Magic     uint64
	Type      uint32
	Version   uint32
	Secret    uint64
	NDevs     uint32
	LinkLayer uint32 // verbs.LinkLayer of every member (they are equal)
}

// helloReply answers a hello that passed the magic and secret checks.
type helloReply struct {
	Status    uint32 // 0 = ok, else replyIncompatible
	NDevs     uint32
	LinkLayer uint32
	Reserved  uint32 // 0
}

const replyIncompatible = 1

// check tells a reply from this plugin's listener from the bytes of some
// other service that now owns the handle's port (a stale handle): only a
// plugin's reply can be a link-layer verdict worth acting on.
func (r *helloReply) check() error {
	switch verbs.LinkLayer(r.LinkLayer) {
	case verbs.LinkUnspecified, verbs.LinkInfiniBand, verbs.LinkEthernet:
	default:
		return fmt.Errorf("link layer %#x", r.LinkLayer)
	}
	if r.Status != 0 && r.Status != replyIncompatible {
		return fmt.Errorf("status %#x", r.Status)
	}
	if r.Reserved != 0 {
		return fmt.Errorf("reserved word %#x", r.Reserved)
	}
	return nil
}

// check validates a hello against the listen it arrived on.
func (h *hello) check(magic, secret uint64) error {
	switch {
	case h.Magic != magic:
		return fmt.Errorf("magic %#x is not this listen's %#x", h.Magic, magic)
	case h.Type != socketTypeNetIB:
		return fmt.Errorf("socket type %d is not NetIb (%d)", h.Type, socketTypeNetIB)
	case h.Version != protoVersion:
		return &versionError{peer: h.Version}
	case h.Secret != secret:
		return fmt.Errorf("the secret does not match this listen (a stale handle)")
	}
	return nil
}

// versionError is a hello from a connector that knows this listen's magic
// but speaks another protocol version: another libnccl-net-go build, which
// the listener WARNs about (its connector fails with "the listener closed
// the connection without answering").
type versionError struct{ peer uint32 }

func (e *versionError) Error() string {
	return fmt.Sprintf("protocol version %d is not this build's %d (a different libnccl-net-go build)", e.peer, protoVersion)
}

const (
	maxQPs     = 128 // NCCL_IB_MAX_QPS
	maxVDevs   = abi.MaxDevsPerNICV12
	readyMagic = 0x59444552 // "REDY"
)

// devMeta describes one member device of a side's vNIC.
type devMeta struct {
	LID       uint16
	LinkLayer uint8
	MTU       uint8
	Port      uint8
	_         [3]byte
	GID       [16]byte
	RKey      uint32 // sender: CTS FIFO rkey; receiver: completion-record rkey
	_         uint32
}

// qpMeta describes one QP.
type qpMeta struct {
	QPN uint32
	Dev uint8 // member index the QP lives on
	_   [3]byte
	ECE [3]uint32 // vendor id, options, comp mask (0 when ECE is off)
	_   uint32
}

// connMeta is exchanged once each way after the hello.
type connMeta struct {
	NDevs    uint32
	NQPs     uint32
	NDataQPs uint32
	Split    uint32
	Addr     uint64 // sender: CTS FIFO base; receiver: completion-record base
	TC       uint32
	SL       uint32
	Devs     [maxVDevs]devMeta
	QPs      [maxQPs]qpMeta
}

func writeMsg(c net.Conn, v any) error { return binary.Write(c, binary.LittleEndian, v) }
func readMsg(c net.Conn, v any) error  { return binary.Read(c, binary.LittleEndian, v) }

// leU64 reads and writes the connector-state words of NCCL's handle copy.
type leU64 struct{ h *nccl.Handle }

func (l leU64) get(off int) uint64    { return binary.LittleEndian.Uint64(l.h[off:]) }
func (l leU64) put(off int, v uint64) { binary.LittleEndian.PutUint64(l.h[off:], v) }
