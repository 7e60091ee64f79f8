package socket

import (
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// benchPair connects a pair on loopback with the given settings.
func benchPair(b testing.TB, env map[string]string) (*Transport, *sendComm, *recvComm) {
	b.Helper()
	withEnv(b, env)
	tr := newLoopback()
	if err := tr.Init(nccl.InitContext{Log: nccl.DiscardLogger{}}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tr.Finalize() })
	var h nccl.Handle
	l, err := tr.Listen(0, &h)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	s, r := connectAccept(b, tr, l, h)
	b.Cleanup(func() { s.Close(); r.Close() })
	return tr, s.(*sendComm), r.(*recvComm)
}

// BenchmarkSendRecv is the hot path from one thread: irecv, isend, then test
// both until done. It must report 0 allocs/op.
func BenchmarkSendRecv(b *testing.B) {
	for _, size := range []int{8, 4 << 10, 1 << 20} {
		b.Run(sizeName(size), func(b *testing.B) {
			_, s, r := benchPair(b, nil)
			src := make([]byte, size)
			dst := make([]byte, size)
			bufs := []nccl.RecvBuffer{{Data: bufPtr(dst), Size: size, Tag: 1}}
			sizes := make([]int, 1)
			b.ReportAllocs()
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				rq, err := r.Irecv(bufs)
				if err != nil {
					b.Fatal(err)
				}
				sq, err := s.Isend(bufPtr(src), size, 1, 0)
				if err != nil {
					b.Fatal(err)
				}
				sd, rd := false, false
				for !sd || !rd {
					if !sd {
						if sd, _, err = s.Test(sq); err != nil {
							b.Fatal(err)
						}
					}
					if !rd {
						if rd, err = r.Test(rq, sizes); err != nil {
							b.Fatal(err)
						}
					}
				}
			}
		})
	}
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// BenchmarkPingPong measures the round trip of an 8-byte message, each side
// polling on its own goroutine (as two NCCL proxy threads would); ns/op is
// one round trip. BenchmarkPingPongTCP is the plain blocking TCP baseline.
func BenchmarkPingPong(b *testing.B) {
	_, ab, abR := benchPair(b, nil)
	_, ba, baR := benchPair(b, nil)
	const size = 8
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	wg.Add(2)
	fail := make(chan error, 2)
	// side runs b.N rounds on one end: send first (A) or reply (B).
	side := func(s *sendComm, r *recvComm, sendFirst bool) {
		defer wg.Done()
		src, dst := make([]byte, size), make([]byte, size)
		bufs := []nccl.RecvBuffer{{Data: bufPtr(dst), Size: size, Tag: 1}}
		for i := 0; i < b.N; i++ {
			var err error
			if sendFirst {
				if err = sendOne(s, src); err == nil {
					err = recvOne(r, bufs)
				}
			} else if err = recvOne(r, bufs); err == nil {
				err = sendOne(s, src)
			}
			if err != nil {
				fail <- err
				return
			}
		}
	}
	go side(ab, baR, true)
	go side(ba, abR, false)
	wg.Wait()
	select {
	case err := <-fail:
		b.Fatal(err)
	default:
	}
}

func sendOne(s *sendComm, src []byte) error {
	q, err := s.Isend(bufPtr(src), len(src), 1, 0)
	if err != nil {
		return err
	}
	for {
		done, _, err := s.Test(q)
		if err != nil || done {
			return err
		}
		runtime.Gosched() // NCCL's progress thread yields when idle too
	}
}

func recvOne(r *recvComm, bufs []nccl.RecvBuffer) error {
	q, err := r.Irecv(bufs)
	if err != nil {
		return err
	}
	for {
		done, err := r.Test(q, nil)
		if err != nil || done {
			return err
		}
		runtime.Gosched()
	}
}

func tcpPair(b *testing.B) (net.Conn, net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn)
	go func() {
		c, _ := ln.Accept()
		ch <- c
	}()
	c1, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	c2 := <-ch
	b.Cleanup(func() { c1.Close(); c2.Close() })
	return c1, c2
}

func BenchmarkPingPongTCP(b *testing.B) {
	c1, c2 := tcpPair(b)
	b.ResetTimer()
	done := make(chan struct{})
	go func() {
		buf := make([]byte, 8)
		for i := 0; i < b.N; i++ {
			io.ReadFull(c2, buf)
			c2.Write(buf)
		}
		close(done)
	}()
	buf := make([]byte, 8)
	for i := 0; i < b.N; i++ {
		c1.Write(buf)
		io.ReadFull(c1, buf)
	}
	<-done
}

// BenchmarkBandwidth streams messages with 8 in flight, sender and receiver
// each on its own goroutine, for several stream counts.
func BenchmarkBandwidth(b *testing.B) {
	for _, streams := range []int{0, 1, 2, 4, 8} {
		for _, size := range []int{64 << 10, 1 << 20, 4 << 20} {
			b.Run(fmt.Sprintf("streams=%d/%s", streams, sizeName(size)), func(b *testing.B) {
				_, s, r := benchPair(b, map[string]string{envNThreads: fmt.Sprint(streams), envNSocks: "1"})
				bandwidth(b, s, r, size)
			})
		}
	}
}

func bandwidth(b *testing.B, s *sendComm, r *recvComm, size int) {
	const inflight = 8
	src := make([]byte, size)
	dst := make([]byte, size*inflight)
	bufs := make([]nccl.RecvBuffer, 1)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	wg.Add(2)
	fail := make(chan error, 2)
	// window keeps up to inflight requests posted on one end and tests the
	// oldest, as NCCL's proxy does, until b.N have completed.
	window := func(post func(slot int) (nccl.Request, error), test func(nccl.Request) (bool, error)) {
		defer wg.Done()
		var q [inflight]nccl.Request
		posted, done := 0, 0
		for done < b.N {
			for posted < b.N && posted-done < inflight {
				rq, err := post(posted % inflight)
				if err != nil {
					fail <- err
					return
				}
				if rq == nccl.NoRequest {
					break
				}
				q[posted%inflight] = rq
				posted++
			}
			ok, err := test(q[done%inflight])
			if err != nil {
				fail <- err
				return
			}
			if ok {
				done++
			} else {
				runtime.Gosched()
			}
		}
	}
	go window(func(int) (nccl.Request, error) { return s.Isend(bufPtr(src), size, 1, 0) },
		func(q nccl.Request) (bool, error) { ok, _, err := s.Test(q); return ok, err })
	go window(func(slot int) (nccl.Request, error) {
		bufs[0] = nccl.RecvBuffer{Data: bufPtr(dst[slot*size:]), Size: size, Tag: 1}
		return r.Irecv(bufs)
	}, func(q nccl.Request) (bool, error) { return r.Test(q, nil) })
	wg.Wait()
	select {
	case err := <-fail:
		b.Fatal(err)
	default:
	}
}

// BenchmarkBandwidthTCP is the plain-TCP baseline: 4 connections, each
// message split in 4 equal parts written and read by one goroutine per
// connection with blocking calls.
func BenchmarkBandwidthTCP(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20, 4 << 20} {
		b.Run("streams=4/"+sizeName(size), func(b *testing.B) {
			const n = 4
			part := size / n
			b.SetBytes(int64(size))
			var wg sync.WaitGroup
			conns := make([][2]net.Conn, n)
			for i := range conns {
				c1, c2 := tcpPair(b)
				conns[i] = [2]net.Conn{c1, c2}
			}
			b.ResetTimer()
			for i := 0; i < n; i++ {
				wg.Add(2)
				go func(c net.Conn) {
					defer wg.Done()
					buf := make([]byte, part)
					for k := 0; k < b.N; k++ {
						c.Write(buf)
					}
				}(conns[i][0])
				go func(c net.Conn) {
					defer wg.Done()
					buf := make([]byte, part)
					for k := 0; k < b.N; k++ {
						io.ReadFull(c, buf)
					}
				}(conns[i][1])
			}
			wg.Wait()
		})
	}
}
