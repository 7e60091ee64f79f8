package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// Ethernet frames as a TAP device (IFF_TAP|IFF_NO_PI) hands them over: no
// preamble, no FCS. The relay only needs to know what a frame carries (for
// its counters and its black-hole filter), so the parser reads headers and
// never trusts a length field beyond the bytes it was given.

const (
	etherHdrLen  = 14
	vlanTagLen   = 4
	etherTypeV4  = 0x0800
	etherTypeARP = 0x0806
	etherTypeV6  = 0x86DD
	etherTypeVLN = 0x8100
	etherTypeQnQ = 0x88A8
	protoTCP     = 6
	protoUDP     = 17
	protoICMP    = 1
	protoICMPv6  = 58

	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10
)

// frameInfo is what the relay learned from one frame's headers. Fields the
// frame does not have stay zero.
type frameInfo struct {
	etherType uint16
	vlans     int
	src, dst  netip.Addr // IP frames only
	proto     uint8      // IP protocol (after IPv6 extension headers)
	fragment  bool       // a non-first IP fragment: no transport header
	srcPort   uint16     // TCP/UDP
	dstPort   uint16
	tcpFlags  uint8
	payload   int // transport payload bytes (TCP/UDP; the IP payload otherwise), as far as the frame holds them
}

var (
	errShort     = errors.New("frame shorter than its headers")
	errBadHeader = errors.New("malformed header")
)

// parseFrame reads the Ethernet, VLAN, IPv4/IPv6 and TCP/UDP headers of b.
// A frame of another ether type (ARP, LLDP, ...) parses with only etherType
// set. It never reads past len(b) and never panics, whatever b holds.
func parseFrame(b []byte) (frameInfo, error) {
	var f frameInfo
	if len(b) < etherHdrLen {
		return f, errShort
	}
	off := 12
	et := binary.BigEndian.Uint16(b[off:])
	off += 2
	for et == etherTypeVLN || et == etherTypeQnQ {
		if len(b) < off+vlanTagLen {
			return f, errShort
		}
		f.vlans++
		et = binary.BigEndian.Uint16(b[off+2:])
		off += vlanTagLen
	}
	f.etherType = et
	var err error
	switch et {
	case etherTypeV4:
		off, err = f.parseIPv4(b, off)
	case etherTypeV6:
		off, err = f.parseIPv6(b, off)
	default:
		return f, nil
	}
	if err != nil {
		return f, err
	}
	// The IP header may claim more than the frame holds (a truncated read,
	// a lying sender): count only what arrived.
	f.payload = min(f.payload, len(b)-off)
	if f.fragment {
		return f, nil
	}
	switch f.proto {
	case protoTCP:
		return f, f.parseTCP(b, off)
	case protoUDP:
		if len(b) < off+8 {
			return f, errShort
		}
		f.srcPort = binary.BigEndian.Uint16(b[off:])
		f.dstPort = binary.BigEndian.Uint16(b[off+2:])
		f.payload -= 8
		if f.payload < 0 {
			return f, fmt.Errorf("%w: UDP length below its header", errBadHeader)
		}
	}
	return f, nil
}

// parseIPv4 returns the offset of the transport header. f.payload is set to
// the IP payload length the header claims (clamped by the caller).
func (f *frameInfo) parseIPv4(b []byte, off int) (int, error) {
	if len(b) < off+20 {
		return off, errShort
	}
	h := b[off:]
	if h[0]>>4 != 4 {
		return off, fmt.Errorf("%w: IPv4 ether type with IP version %d", errBadHeader, h[0]>>4)
	}
	ihl := int(h[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(h[2:]))
	if ihl < 20 || total < ihl {
		return off, fmt.Errorf("%w: IPv4 header length %d, total length %d", errBadHeader, ihl, total)
	}
	if len(h) < ihl {
		return off, errShort
	}
	f.src = netip.AddrFrom4([4]byte(h[12:16]))
	f.dst = netip.AddrFrom4([4]byte(h[16:20]))
	f.proto = h[9]
	f.fragment = binary.BigEndian.Uint16(h[6:])&0x1fff != 0
	f.payload = total - ihl
	return off + ihl, nil
}

// parseIPv6 skips the extension headers a relay between two hosts can see
// (hop-by-hop, routing, fragment, destination options).
func (f *frameInfo) parseIPv6(b []byte, off int) (int, error) {
	if len(b) < off+40 {
		return off, errShort
	}
	h := b[off:]
	if h[0]>>4 != 6 {
		return off, fmt.Errorf("%w: IPv6 ether type with IP version %d", errBadHeader, h[0]>>4)
	}
	f.src = netip.AddrFrom16([16]byte(h[8:24]))
	f.dst = netip.AddrFrom16([16]byte(h[24:40]))
	f.payload = int(binary.BigEndian.Uint16(h[4:]))
	next := h[6]
	off += 40
	for {
		switch next {
		case 0, 43, 60: // hop-by-hop, routing, destination options
			if len(b) < off+8 {
				return off, errShort
			}
			n := (int(b[off+1]) + 1) * 8
			next = b[off]
			off += n
			f.payload -= n
		case 44: // fragment
			if len(b) < off+8 {
				return off, errShort
			}
			next = b[off]
			f.fragment = binary.BigEndian.Uint16(b[off+2:])&0xfff8 != 0
			off += 8
			f.payload -= 8
		default:
			f.proto = next
			if f.payload < 0 || off > len(b) {
				return off, fmt.Errorf("%w: IPv6 extension headers longer than the packet", errBadHeader)
			}
			return off, nil
		}
	}
}

func (f *frameInfo) parseTCP(b []byte, off int) error {
	if len(b) < off+20 {
		return errShort
	}
	h := b[off:]
	f.srcPort = binary.BigEndian.Uint16(h[0:])
	f.dstPort = binary.BigEndian.Uint16(h[2:])
	doff := int(h[12]>>4) * 4
	f.tcpFlags = h[13]
	if doff < 20 || doff > f.payload {
		return fmt.Errorf("%w: TCP data offset %d in a %d-byte segment", errBadHeader, doff, f.payload)
	}
	f.payload -= doff
	return nil
}
