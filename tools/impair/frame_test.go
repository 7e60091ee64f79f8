package main

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
)

// Frame builders for tests and fuzz seeds.

func ether(etherType uint16, vlans int) []byte {
	b := make([]byte, 12, 64)
	for i := range 6 {
		b[i] = 0x02
		b[6+i] = 0x04
	}
	for range vlans {
		b = binary.BigEndian.AppendUint16(b, etherTypeVLN)
		b = binary.BigEndian.AppendUint16(b, 42)
	}
	return binary.BigEndian.AppendUint16(b, etherType)
}

func ipv4(proto uint8, src, dst string, payload []byte, opts int) []byte {
	ihl := 20 + 4*opts
	h := make([]byte, ihl)
	h[0] = 0x40 | byte(ihl/4)
	binary.BigEndian.PutUint16(h[2:], uint16(ihl+len(payload)))
	h[8] = 64
	h[9] = proto
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	return append(h, payload...)
}

func tcpSeg(sport, dport uint16, flags uint8, optWords int, data int) []byte {
	doff := 20 + 4*optWords
	h := make([]byte, doff+data)
	binary.BigEndian.PutUint16(h[0:], sport)
	binary.BigEndian.PutUint16(h[2:], dport)
	h[12] = byte(doff/4) << 4
	h[13] = flags
	return h
}

func udpDgram(sport, dport uint16, data int) []byte {
	h := make([]byte, 8+data)
	binary.BigEndian.PutUint16(h[0:], sport)
	binary.BigEndian.PutUint16(h[2:], dport)
	binary.BigEndian.PutUint16(h[4:], uint16(8+data))
	return h
}

func ipv6(next uint8, src, dst string, payload []byte) []byte {
	h := make([]byte, 40)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(len(payload)))
	h[6] = next
	h[7] = 64
	s, d := netip.MustParseAddr(src).As16(), netip.MustParseAddr(dst).As16()
	copy(h[8:], s[:])
	copy(h[24:], d[:])
	return append(h, payload...)
}

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

func TestParseFrame(t *testing.T) {
	hopByHop := cat([]byte{protoTCP, 0, 1, 4, 0, 0, 0, 0}, tcpSeg(1, 2, tcpACK, 0, 5))
	for _, tc := range []struct {
		name  string
		frame []byte
		want  frameInfo
		err   error
	}{
		{"ipv4 tcp syn with options", cat(ether(etherTypeV4, 0), ipv4(protoTCP, "198.18.1.1", "198.18.1.2", tcpSeg(40000, 5201, tcpSYN, 5, 0), 0)),
			frameInfo{etherType: etherTypeV4, src: netip.MustParseAddr("198.18.1.1"), dst: netip.MustParseAddr("198.18.1.2"),
				proto: protoTCP, srcPort: 40000, dstPort: 5201, tcpFlags: tcpSYN}, nil},
		{"ipv4 options, tcp data", cat(ether(etherTypeV4, 0), ipv4(protoTCP, "10.0.0.1", "10.0.0.2", tcpSeg(1, 2, tcpACK, 0, 1448), 2)),
			frameInfo{etherType: etherTypeV4, src: netip.MustParseAddr("10.0.0.1"), dst: netip.MustParseAddr("10.0.0.2"),
				proto: protoTCP, srcPort: 1, dstPort: 2, tcpFlags: tcpACK, payload: 1448}, nil},
		{"two vlan tags, udp", cat(ether(etherTypeV4, 2), ipv4(protoUDP, "10.0.0.1", "10.0.0.2", udpDgram(53, 9, 100), 0)),
			frameInfo{etherType: etherTypeV4, vlans: 2, src: netip.MustParseAddr("10.0.0.1"), dst: netip.MustParseAddr("10.0.0.2"),
				proto: protoUDP, srcPort: 53, dstPort: 9, payload: 100}, nil},
		{"ipv6 hop-by-hop then tcp", cat(ether(etherTypeV6, 0), ipv6(0, "fd00::1", "fd00::2", hopByHop)),
			frameInfo{etherType: etherTypeV6, src: netip.MustParseAddr("fd00::1"), dst: netip.MustParseAddr("fd00::2"),
				proto: protoTCP, srcPort: 1, dstPort: 2, tcpFlags: tcpACK, payload: 5}, nil},
		{"arp", cat(ether(etherTypeARP, 0), make([]byte, 28)), frameInfo{etherType: etherTypeARP}, nil},
		{"runt", []byte{1, 2, 3}, frameInfo{}, errShort},
		{"ipv4 header cut", cat(ether(etherTypeV4, 0), make([]byte, 10)), frameInfo{etherType: etherTypeV4}, errShort},
		{"ipv4 bad ihl", func() []byte {
			b := cat(ether(etherTypeV4, 0), ipv4(protoTCP, "10.0.0.1", "10.0.0.2", tcpSeg(1, 2, 0, 0, 0), 0))
			b[etherHdrLen] = 0x42
			return b
		}(), frameInfo{etherType: etherTypeV4}, errBadHeader},
		{"tcp data offset past the segment", func() []byte {
			b := cat(ether(etherTypeV4, 0), ipv4(protoTCP, "10.0.0.1", "10.0.0.2", tcpSeg(1, 2, 0, 0, 0), 0))
			b[etherHdrLen+20+12] = 0xf0
			return b
		}(), frameInfo{etherType: etherTypeV4, src: netip.MustParseAddr("10.0.0.1"), dst: netip.MustParseAddr("10.0.0.2"),
			proto: protoTCP, srcPort: 1, dstPort: 2, payload: 20}, errBadHeader},
		{"later ipv4 fragment has no tcp header", func() []byte {
			b := cat(ether(etherTypeV4, 0), ipv4(protoTCP, "10.0.0.1", "10.0.0.2", make([]byte, 8), 0))
			binary.BigEndian.PutUint16(b[etherHdrLen+6:], 185)
			return b
		}(), frameInfo{etherType: etherTypeV4, src: netip.MustParseAddr("10.0.0.1"), dst: netip.MustParseAddr("10.0.0.2"),
			proto: protoTCP, fragment: true, payload: 8}, nil},
		{"ip header claims more than the frame holds", func() []byte {
			b := cat(ether(etherTypeV4, 0), ipv4(protoTCP, "10.0.0.1", "10.0.0.2", tcpSeg(1, 2, tcpACK, 0, 100), 0))
			return b[:len(b)-60]
		}(), frameInfo{etherType: etherTypeV4, src: netip.MustParseAddr("10.0.0.1"), dst: netip.MustParseAddr("10.0.0.2"),
			proto: protoTCP, srcPort: 1, dstPort: 2, tcpFlags: tcpACK, payload: 40}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseFrame(tc.frame)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if got != tc.want {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}
