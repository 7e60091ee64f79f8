package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// port is one end of the relay: a TAP device's file in production, an
// in-memory pipe in tests. Read returns one whole frame per call.
type port interface {
	io.ReadWriteCloser
}

// Directions: ab carries frames read from port a and written to port b.
const (
	ab = 0
	ba = 1
)

var dirNames = [2]string{"a>b", "b>a"}

// dirStats are one direction's counters; read while the relay runs.
type dirStats struct {
	frames  [nVerdicts]atomic.Uint64
	bytes   atomic.Uint64 // forwarded bytes
	tcp     atomic.Uint64 // forwarded TCP segments
	syn     atomic.Uint64 // forwarded SYNs (connection attempts and their answers)
	rst     atomic.Uint64 // forwarded RSTs
	unknown atomic.Uint64 // frames the parser could not read (forwarded all the same)
}

func (s *dirStats) String() string {
	var b strings.Builder
	total := uint64(0)
	for v := range nVerdicts {
		total += s.frames[v].Load()
	}
	fmt.Fprintf(&b, "%d frames", total)
	for v := range nVerdicts {
		if n := s.frames[v].Load(); n > 0 {
			fmt.Fprintf(&b, ", %s %d", verdictNames[v], n)
			if v == dropLoss && total > 0 {
				fmt.Fprintf(&b, " (%.2f%%)", 100*float64(n)/float64(total))
			}
		}
	}
	fmt.Fprintf(&b, ", %d bytes forwarded, tcp %d (syn %d, rst %d), unparsed %d",
		s.bytes.Load(), s.tcp.Load(), s.syn.Load(), s.rst.Load(), s.unknown.Load())
	return b.String()
}

// queued is a frame on the (simulated) wire.
type queued struct {
	buf []byte
	n   int
	at  time.Time
	fi  frameInfo
	ok  bool // fi parsed without error
}

// relay moves frames between two ports through a link. Each direction has a
// reader and a writer goroutine joined by a FIFO of at most limit frames;
// buffers come from a free list of the same size, so nothing is allocated
// per frame and a full line drops at the tail, as a device queue would.
type relay struct {
	link  *link
	ports [2]port
	stats [2]dirStats
	mtu   int
	limit int
	now   func() time.Time
	sleep func(time.Duration)
	wg    sync.WaitGroup
	errMu sync.Mutex
	err   error
}

func newRelay(l *link, a, b port, mtu, limit int) *relay {
	return &relay{link: l, ports: [2]port{a, b}, mtu: mtu, limit: limit, now: time.Now, sleep: time.Sleep}
}

// frameCap is the largest frame a port hands over for the MTU: Ethernet
// header and two VLAN tags on top of the IP packet.
func frameCap(mtu int) int { return mtu + etherHdrLen + 2*vlanTagLen }

func (r *relay) start() {
	for d := range 2 {
		free := make(chan []byte, r.limit)
		for range r.limit {
			free <- make([]byte, frameCap(r.mtu))
		}
		line := make(chan queued, r.limit)
		r.wg.Add(2)
		go r.read(d, free, line)
		go r.write(d, free, line)
	}
}

// stop closes both ports (which ends the readers) and waits for the
// goroutines; frames still on the wire are dropped.
func (r *relay) stop() error {
	for _, p := range r.ports {
		p.Close()
	}
	r.wg.Wait()
	r.errMu.Lock()
	defer r.errMu.Unlock()
	return r.err
}

func (r *relay) fail(err error) {
	r.errMu.Lock()
	if r.err == nil {
		r.err = err
	}
	r.errMu.Unlock()
}

func (r *relay) read(d int, free chan []byte, line chan<- queued) {
	defer r.wg.Done()
	defer close(line)
	st := &r.stats[d]
	spare := make([]byte, frameCap(r.mtu))
	for {
		var buf []byte
		select {
		case buf = <-free:
		default:
			buf = spare
		}
		n, err := r.ports[d].Read(buf)
		if err != nil {
			if !errors.Is(err, io.EOF) && !isClosed(err) {
				r.fail(fmt.Errorf("reading %s: %w", dirNames[d], err))
			}
			return
		}
		fi, perr := parseFrame(buf[:n])
		if perr != nil {
			st.unknown.Add(1)
		}
		if &buf[0] == &spare[0] {
			st.frames[dropQueueFull].Add(1)
			continue
		}
		v, at := r.link.admit(d, &fi, r.now())
		if v != pass {
			st.frames[v].Add(1)
			free <- buf
			continue
		}
		line <- queued{buf: buf, n: n, at: at, fi: fi, ok: perr == nil}
	}
}

func (r *relay) write(d int, free chan<- []byte, line <-chan queued) {
	defer r.wg.Done()
	st := &r.stats[d]
	out := r.ports[1-d]
	for q := range line {
		if w := q.at.Sub(r.now()); w > 0 {
			r.sleep(w)
		}
		if v := r.link.release(r.now()); v != pass {
			st.frames[v].Add(1)
			free <- q.buf
			continue
		}
		if _, err := out.Write(q.buf[:q.n]); err != nil && !isClosed(err) {
			// The receiving device may be down (ip link set down): the
			// frame is lost, as on a cable into a dead port.
			st.frames[dropDown].Add(1)
		} else {
			st.frames[pass].Add(1)
			st.bytes.Add(uint64(q.n))
			if fi := &q.fi; q.ok && fi.proto == protoTCP && !fi.fragment {
				st.tcp.Add(1)
				if fi.tcpFlags&tcpSYN != 0 {
					st.syn.Add(1)
				}
				if fi.tcpFlags&tcpRST != 0 {
					st.rst.Add(1)
				}
			}
		}
		free <- q.buf
	}
}

func (s *dirStats) reset() {
	for v := range nVerdicts {
		s.frames[v].Store(0)
	}
	s.bytes.Store(0)
	s.tcp.Store(0)
	s.syn.Store(0)
	s.rst.Store(0)
	s.unknown.Store(0)
}

func (r *relay) statsLine() string {
	return fmt.Sprintf("%s: %s; %s: %s", dirNames[ab], r.stats[ab].String(), dirNames[ba], r.stats[ba].String())
}

func isClosed(err error) bool {
	return errors.Is(err, os.ErrClosed) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrClosedPipe)
}
