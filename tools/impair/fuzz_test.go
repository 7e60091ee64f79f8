package main

import (
	"testing"
	"time"
)

// FuzzParseFrame: whatever arrives on a TAP device, the parser must not
// panic, must not read past the frame, and what it reports must fit in it.
func FuzzParseFrame(f *testing.F) {
	f.Add(cat(ether(etherTypeV4, 0), ipv4(protoTCP, "198.18.1.1", "198.18.1.2", tcpSeg(40000, 5201, tcpSYN, 5, 0), 0)))
	f.Add(cat(ether(etherTypeV4, 1), ipv4(protoUDP, "10.0.0.1", "10.0.0.2", udpDgram(53, 9, 12), 1)))
	f.Add(cat(ether(etherTypeV6, 0), ipv6(0, "fd00::1", "fd00::2", cat([]byte{44, 0, 0, 0, 0, 0, 0, 1}, []byte{6, 0, 0, 0, 0, 0, 0, 0}, tcpSeg(1, 2, tcpACK, 0, 3)))))
	f.Add(cat(ether(etherTypeARP, 0), make([]byte, 28)))
	f.Fuzz(func(t *testing.T, b []byte) {
		fi, err := parseFrame(b)
		if err != nil {
			return
		}
		if fi.payload < 0 || fi.payload > len(b) {
			t.Fatalf("payload %d bytes in a %d-byte frame", fi.payload, len(b))
		}
		if (fi.etherType == etherTypeV4 || fi.etherType == etherTypeV6) && !fi.src.IsValid() {
			t.Fatalf("an IP frame parsed without a source address: %+v", fi)
		}
		if fi.etherType == etherTypeV4 && (!fi.src.Is4() || !fi.dst.Is4()) {
			t.Fatalf("IPv4 frame with non-IPv4 addresses: %+v", fi)
		}
		// The relay's decision path takes any parsed frame.
		l := newLink(1)
		l.setBlackhole(fi.dst, true)
		if v, _ := l.admit(ab, &fi, t0); fi.dst.IsValid() && v != dropBlackhole {
			t.Fatalf("a frame to a black-holed address passed: %+v", fi)
		}
	})
}

// FuzzParseCommand: the control socket takes lines from anyone with access
// to it; nothing may panic, and an accepted command stays within range.
func FuzzParseCommand(f *testing.F) {
	for _, s := range []string{"set loss=1% delay=10ms", "set a>b jitter=2ms", "down 5s", "up", "blackhole add 198.18.1.1",
		"reset", "stats", "show", "set loss=1e309"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		c, err := parseCommand(line)
		if err != nil {
			return
		}
		if c.im.loss < 0 || c.im.loss > 1 || c.im.delay < 0 || c.im.jitter < 0 || c.dur < 0 || c.dur > 24*time.Hour {
			t.Fatalf("%q accepted out of range: %+v", line, c)
		}
		r := newRelay(newLink(1), nil, nil, 1500, 1)
		if reply := r.apply(c); reply == "" || reply[:2] != "ok" {
			t.Fatalf("%q parsed but apply answered %q", line, reply)
		}
	})
}
