package socket

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclsock"
	"github.com/libnccl-net-go/libnccl-net-go/internal/timeout"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Fault semantics (issue 9): a slow peer is never a dead one, exhaustion is
// NoRequest, a too-large message fails only its own request, every wait of
// connection set-up is bounded by NCCL_GO_TIMEOUT.

// pace is the cadence of a test's polling loop, as NCCL's service and
// progress threads poll: nothing here waits for an event it could
// synchronise on, it keeps calling the non-blocking API until a deadline.
func pace() { time.Sleep(200 * time.Microsecond) }

func pattern(b []byte, seed int) {
	for i := range b {
		b[i] = byte(i*7 + seed*13 + i>>12)
	}
}

// TestSlowReceiverIsAlive: 64 MiB messages are in flight and the receiver
// does not post for 3 × NCCL_GO_TIMEOUT (a rank writing a checkpoint). Its
// host answers, so neither side may fail, and every byte arrives.
func TestSlowReceiverIsAlive(t *testing.T) {
	for _, streams := range []string{"0", "4"} {
		t.Run("streams="+streams, func(t *testing.T) {
			withEnv(t, map[string]string{envTimeout: "1", envNThreads: streams, envNSocks: "1"})
			log := &captureLog{}
			tr := initLoopback(t, log)
			s, r := pair(t, tr)
			const size, msgs = 64 << 20, 2
			src := make([]byte, size)
			pattern(src, 1)
			dst := make([]byte, msgs*size)
			var sq [msgs]nccl.Request
			for i := range sq {
				var err error
				sq[i], err = s.Isend(bufPtr(src), size, 1, 0)
				require.NoError(t, err)
				require.NotEqual(t, nccl.NoRequest, sq[i])
			}
			late := time.Now().Add(30 * time.Second)
			for s.live.pings < silentPings {
				for i := range sq {
					done, _, err := s.Test(sq[i])
					require.NoError(t, err, "a receiver that has not posted yet is alive: its kernel answers")
					require.False(t, done, "128 MiB cannot fit in socket buffers")
				}
				require.True(t, time.Now().Before(late), "the liveness check stopped pinging the slow receiver's kernel")
				pace()
			}
			var rq [msgs]nccl.Request
			for i := range rq {
				var err error
				rq[i], err = r.Irecv([]nccl.RecvBuffer{{Data: bufPtr(dst[i*size:]), Size: size, Tag: 1}})
				require.NoError(t, err)
			}
			sdone, rdone := 0, 0
			deadline := time.Now().Add(60 * time.Second)
			for sdone < msgs || rdone < msgs {
				if sdone < msgs {
					done, n, err := s.Test(sq[sdone])
					require.NoError(t, err)
					if done {
						assert.Equal(t, size, n)
						sdone++
					}
				}
				if rdone < msgs {
					sizes := []int{-1}
					done, err := r.Test(rq[rdone], sizes)
					require.NoError(t, err)
					if done {
						assert.Equal(t, size, sizes[0])
						rdone++
					}
				}
				require.True(t, time.Now().Before(deadline), "transfer did not finish")
				runtime.Gosched()
			}
			for i := 0; i < msgs; i++ {
				require.True(t, bytes.Equal(src, dst[i*size:(i+1)*size]), "message %d corrupted", i)
			}
			assert.NotContains(t, log.String(), "WARN")
		})
	}
}

// TestTruncatedReceiveFreesSlot: more too-large messages than a comm has
// receive requests. Each fails its own receive with InvalidUsage and a WARN
// naming both sizes, writes nothing into the buffer, frees the request, and
// the comm keeps working afterwards.
func TestTruncatedReceiveFreesSlot(t *testing.T) {
	for _, streams := range []string{"0", "4"} {
		t.Run("streams="+streams, func(t *testing.T) {
			withEnv(t, map[string]string{envNThreads: streams, envIdleInline: "0"})
			log := &captureLog{}
			tr := initLoopback(t, log)
			s, r := pair(t, tr)
			const rounds = nccl.MaxRequests + 8
			for i := 0; i < rounds; i++ {
				// Alternate an inline size and one striped over the data streams.
				capacity := 100
				if i%2 == 1 {
					capacity = 512 << 10
				}
				sent := 2*capacity + 5
				src := make([]byte, sent)
				pattern(src, i)
				dst := make([]byte, capacity+64)
				rq, err := r.Irecv([]nccl.RecvBuffer{{Data: bufPtr(dst), Size: capacity, Tag: 1}})
				require.NoError(t, err)
				require.NotEqual(t, nccl.NoRequest, rq, "round %d: a truncated receive kept its request slot", i)
				sq, err := s.Isend(bufPtr(src), sent, 1, 0)
				require.NoError(t, err)
				var rerr error
				sdone := false
				deadline := time.Now().Add(20 * time.Second)
				for rerr == nil || !sdone {
					if rerr == nil {
						done, err := r.Test(rq, []int{-1})
						require.False(t, done, "round %d: a truncated receive cannot succeed", i)
						rerr = err
					}
					if !sdone {
						sdone, _, err = s.Test(sq)
						require.NoError(t, err, "round %d: the sender's request is fine", i)
					}
					require.True(t, time.Now().Before(deadline), "round %d did not finish", i)
					runtime.Gosched()
				}
				assert.Equal(t, nccl.InvalidUsage, nccl.ResultOf(rerr))
				assert.Contains(t, rerr.Error(), fmt.Sprintf("sent %d bytes", sent))
				assert.Contains(t, rerr.Error(), fmt.Sprintf("holds %d", capacity))
				require.Equal(t, make([]byte, len(dst)), dst, "round %d: nothing may be written into a truncated receive's buffer", i)
				runtime.KeepAlive(src)
			}
			assert.Contains(t, log.String(), "message truncated")
			exchange(t, s, r, 1000)
			exchange(t, s, r, 3<<20)
		})
	}
}

// connectUntil polls Connect until it returns a comm or an error, or limit
// passes; it returns how long it took and the error.
func connectUntil(t *testing.T, tr *Transport, h nccl.Handle, limit time.Duration) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	for time.Since(start) < limit {
		s, err := tr.Connect(0, &h, nccl.ConnectOptions{})
		if err != nil {
			return time.Since(start), err
		}
		if s != nil {
			s.Close()
			t.Fatal("connect succeeded to an address where nothing accepts")
		}
		pace()
	}
	return time.Since(start), nil
}

func handleFor(t *testing.T, addr string, streams int) nccl.Handle {
	hi := handleInfo{magic: ncclsock.DefaultMagic, version: protoVersion, addr: netip_MustParseAddrPort(addr),
		streams: streams, minChunk: defaultMinChunk}
	var h nccl.Handle
	encodeHandle(&h, &hi)
	return h
}

// TestConnectNoListenerBounded: nobody listens; NCCL's default retry policy
// alone would keep trying for about a minute, NCCL_GO_TIMEOUT=3 ends it.
func TestConnectNoListenerBounded(t *testing.T) {
	withEnv(t, map[string]string{envTimeout: "3"})
	log := &captureLog{}
	tr := initLoopback(t, log)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	took, err := connectUntil(t, tr, handleFor(t, addr, 2), 7*time.Second)
	require.Error(t, err, "connect to a port nobody listens on still pending after %v", took)
	assert.Less(t, took, 6*time.Second)
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
	assert.Contains(t, err.Error(), addr)
	assert.Contains(t, log.String(), envTimeout)
}

// blackhole returns the address of a listener whose accept queue is full:
// the kernel drops every further SYN, as a firewall or a dead host does.
func blackhole(t *testing.T) string {
	t.Helper()
	lfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(lfd) })
	require.NoError(t, unix.Bind(lfd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	require.NoError(t, unix.Listen(lfd, 0))
	sa, err := unix.Getsockname(lfd)
	require.NoError(t, err)
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*unix.SockaddrInet4).Port)
	// A backlog of 0 holds one connection; nobody accepts it.
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return addr
}

// TestConnectBlackholeBounded: SYNs go unanswered; the kernel's own SYN
// retries last about two minutes, NCCL_GO_TIMEOUT=3 ends the connect.
func TestConnectBlackholeBounded(t *testing.T) {
	withEnv(t, map[string]string{envTimeout: "3"})
	log := &captureLog{}
	tr := initLoopback(t, log)
	addr := blackhole(t)
	took, err := connectUntil(t, tr, handleFor(t, addr, 1), 7*time.Second)
	require.Error(t, err, "connect to a black hole still pending after %v", took)
	assert.Less(t, took, 6*time.Second)
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
	assert.Contains(t, err.Error(), addr)
}

// TestHalfOpenHandshakeDropped: a connector sends a valid hello on its
// control stream and never opens the data streams it announced. The
// listener must not keep that half connection (and its socket) forever, and
// since the hello carried the listen's secret it was the connection NCCL
// calls accept for: accept fails once, naming it (until 2026-11-28 it
// answered NULL forever). The listener still accepts a real connector.
func TestHalfOpenHandshakeDropped(t *testing.T) {
	withEnv(t, map[string]string{envTimeout: "0.5", envNThreads: "2", envHelloTimeout: "1"})
	log := &captureLog{}
	tr := initLoopback(t, log)
	l, h, hi := listenDecoded(t, tr)
	defer l.Close()
	c, err := net.Dial("tcp", hi.addr.String())
	require.NoError(t, err)
	defer c.Close()
	m := hello{magic: ncclsock.DefaultMagic, version: protoVersion, index: ctrlIndex, streams: hi.streams, secret: hi.secret, connID: 9}
	var b [helloLen]byte
	m.encode(b[:])
	_, err = c.Write(b[:])
	require.NoError(t, err)
	closed := make(chan error, 1)
	go func() {
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		_, err := io.ReadAll(c)
		closed <- err
	}()
	deadline := time.Now().Add(20 * time.Second)
	failed := false
	for {
		rc, err := l.Accept()
		require.Nil(t, rc, "half a connection cannot be accepted")
		if err != nil {
			require.False(t, failed, "accept failed twice for one half-open connection: %v", err)
			failed = true
			assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
			assert.Contains(t, err.Error(), "never completed: 1 of its 4 streams arrived within 1.5s (NCCL_GO_TIMEOUT plus NCCL_GO_SOCKET_HELLO_TIMEOUT)")
		}
		select {
		case err := <-closed:
			if err != nil {
				require.ErrorIs(t, err, syscall.ECONNRESET, "the listener must close the half-open connection, not leave it open")
			}
			require.True(t, failed || func() bool { _, err := l.Accept(); return err != nil }(),
				"accept never said that its connection failed")
			// The listener still accepts a real connector.
			s, r := connectAccept(t, tr, l, h)
			exchange(t, s.(*sendComm), r.(*recvComm), 100)
			s.Close()
			r.Close()
			return
		default:
		}
		require.True(t, time.Now().Before(deadline), "the half-open connection was never dropped")
		pace()
	}
}

// epollFDs lists the descriptors registered with any epoll instance of
// this process (Go's netpoller among them).
func epollFDs(t *testing.T) map[int]bool {
	t.Helper()
	out := map[int]bool{}
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil || target != "anon_inode:[eventpoll]" {
			continue
		}
		info, err := os.ReadFile(filepath.Join("/proc/self/fdinfo", e.Name()))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(info), "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == "tfd:" {
				n, err := strconv.Atoi(f[1])
				require.NoError(t, err)
				out[n] = true
			}
		}
	}
	return out
}

func socketFDs(t *testing.T) []int {
	t.Helper()
	var out []int
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err == nil && strings.HasPrefix(target, "socket:") {
			n, _ := strconv.Atoi(e.Name())
			out = append(out, n)
		}
	}
	return out
}

// TestDataFDsOutsideNetpoller: the sockets of a connection are driven by
// NCCL's thread with non-blocking syscalls; none may be registered with Go's
// netpoller, which would wake runtime threads on every packet.
func TestDataFDsOutsideNetpoller(t *testing.T) {
	withEnv(t, map[string]string{envNThreads: "2"})
	log := &captureLog{}
	tr := initLoopback(t, log)
	before := map[int]bool{}
	for _, fd := range socketFDs(t) {
		before[fd] = true
	}
	s, r := pair(t, tr) // the listener is closed when pair returns
	exchange(t, s, r, 1<<20)
	polled := epollFDs(t)
	n := 0
	for _, fd := range socketFDs(t) {
		if before[fd] {
			continue
		}
		n++
		assert.False(t, polled[fd], "socket fd %d of a connection is registered with an epoll instance", fd)
	}
	assert.GreaterOrEqual(t, n, 2*3, "expected the control and data sockets of both ends")
}

// TestAbortLeaksNothing: finalize and close at every stage NCCL can reach
// them (ncclCommAbort racing connection set-up, requests in flight), 1000
// rounds: afterwards not one goroutine or descriptor more than before.
func TestAbortLeaksNothing(t *testing.T) {
	rounds := 1000
	if testing.Short() {
		rounds = 200
	}
	withEnv(t, map[string]string{envNThreads: "2", envHelpers: "2", envTimeout: "5"})
	bh := blackhole(t)
	runtime.GC()
	g0, fd0 := runtime.NumGoroutine(), openFDs(t)
	src := make([]byte, 256<<10)
	dst := make([]byte, 256<<10)
	for i := 0; i < rounds; i++ {
		tr := newLoopback()
		require.NoError(t, tr.Init(nccl.InitContext{Log: &captureLog{}}))
		var h nccl.Handle
		l, err := tr.Listen(0, &h)
		require.NoError(t, err)
		stage := i % 6
		var s nccl.SendComm
		var r nccl.RecvComm
		switch stage {
		case 0: // listener closed before anyone connected
			require.NoError(t, l.Close())
		case 1: // finalize right after the first connect call
			ch := h
			s, err = tr.Connect(0, &ch, nccl.ConnectOptions{})
			require.NoError(t, err)
		case 2: // finalize while connect and accept are being polled
			ch := h
			for k := 0; k < 3 && (s == nil || r == nil); k++ {
				if s == nil {
					s, err = tr.Connect(0, &ch, nccl.ConnectOptions{})
					require.NoError(t, err)
				}
				if r == nil {
					r, err = l.Accept()
					require.NoError(t, err)
				}
			}
		case 3: // a connect to a black hole, pending
			bhh := handleFor(t, bh, 2)
			s, err = tr.Connect(0, &bhh, nccl.ConnectOptions{})
			require.NoError(t, err)
			require.Nil(t, s)
		case 4, 5: // requests in flight both ways, then close and finalize
			s, r = connectAccept(t, tr, l, h)
			require.NoError(t, l.Close())
			_, err = r.Irecv([]nccl.RecvBuffer{{Data: bufPtr(dst), Size: len(dst), Tag: 1}})
			require.NoError(t, err)
			for k := 0; k < 3; k++ {
				q, err := s.Isend(bufPtr(src), len(src), 1, 0)
				require.NoError(t, err)
				if k == 0 && stage == 5 {
					s.Test(q)
				}
			}
		}
		// NCCL closes the comms it was handed, then finalizes.
		if s != nil {
			require.NoError(t, s.Close())
		}
		if r != nil {
			require.NoError(t, r.Close())
		}
		require.NoError(t, tr.Finalize())
		// Calls after finalize fail cleanly.
		if stage == 1 {
			_, err = tr.Listen(0, &h)
			require.Error(t, err)
		}
	}
	assert.LessOrEqual(t, goroutinesAfterExit(g0), g0, "goroutines leaked")
	assert.LessOrEqual(t, openFDs(t), fd0, "descriptors leaked")
	runtime.KeepAlive(src)
	runtime.KeepAlive(dst)
}

// TestTimeoutOffStillBoundsSetup: NCCL_GO_TIMEOUT=0 turns off dead-host
// detection only; connection set-up stays bounded (by the timeout's default).
func TestTimeoutOffStillBoundsSetup(t *testing.T) {
	withEnv(t, map[string]string{envTimeout: "0"})
	log := &captureLog{}
	tr := initLoopback(t, log)
	assert.Contains(t, log.String(), "never detected", "turning detection off deserves a WARN")
	bh := handleFor(t, blackhole(t), 0)
	_, err := tr.Connect(0, &bh, nccl.ConnectOptions{})
	require.NoError(t, err)
	id, _ := pendingConn(&bh)
	tr.mu.Lock()
	op := tr.pending[id]
	tr.mu.Unlock()
	require.NotNil(t, op)
	assert.Equal(t, op.start+int64(timeout.Default), op.deadline, "a black hole must still end the connect")
}

// A receive's test returns as soon as its own request is complete: the
// socket is not read again first (on a ping-pong that read would find it
// empty, a system call on the round trip's critical path), and the message
// behind it is left to the next call, which must still deliver it.
func TestTestReturnsOnceItsMessageIsRead(t *testing.T) {
	withEnv(t, map[string]string{envNThreads: "0"})
	tr := initLoopback(t, &captureLog{})
	s, r := pair(t, tr)
	var src [2][8]byte
	var dst [2][8]byte
	var rqs [2]nccl.Request
	for i := range rqs {
		var err error
		rqs[i], err = r.Irecv([]nccl.RecvBuffer{{Data: bufPtr(dst[i][:]), Size: 8, Tag: 1}})
		require.NoError(t, err)
	}
	for i := range src {
		pattern(src[i][:], i+1)
		sq, err := s.Isend(bufPtr(src[i][:]), 8, 1, 0)
		require.NoError(t, err)
		done, n, err := s.Test(sq)
		require.NoError(t, err)
		require.True(t, done, "an 8-byte send to an idle local peer completes in isend")
		require.Equal(t, 8, n)
	}
	sizes := []int{-1}
	deadline := time.Now().Add(10 * time.Second)
	for {
		done, err := r.Test(rqs[0], sizes)
		require.NoError(t, err)
		if done {
			break
		}
		require.True(t, time.Now().Before(deadline), "the first message never arrived")
		runtime.Gosched()
	}
	assert.Equal(t, []int{8}, sizes)
	assert.Equal(t, src[0], dst[0])
	assert.Zero(t, r.reqs.At(int(rqs[1])).matched, "testing the first receive went on to read the second message")
	done, err := r.Test(rqs[1], sizes)
	require.NoError(t, err)
	require.True(t, done, "the second message, already in the socket, is read by the next test")
	assert.Equal(t, src[1], dst[1])
}

// After a message with bypassMin bytes or more inline the receiver reads the
// next header alone and that message's payload straight into its buffer; a
// run of sizes on both sides of the threshold, all in the socket before the
// first test, must still land byte for byte.
func TestInlineSizesAroundTheDirectReadThreshold(t *testing.T) {
	withEnv(t, map[string]string{envNThreads: "0"}) // every payload inline
	tr := initLoopback(t, &captureLog{})
	s, r := pair(t, tr)
	sizes := []int{bypassMin, 8, bypassMin - 1, bypassMin + 8<<10, 0, bypassMin, 100 << 10, 1, bypassMin}
	src, dst, rqs := postRecvs(t, r, sizes, 3, 11)
	var sqs []nccl.Request
	off := 0
	for _, n := range sizes {
		q, err := s.Isend(bufPtr(src[off:]), n, 3, 0)
		require.NoError(t, err)
		sqs = append(sqs, q)
		off += n
	}
	deadline := time.Now().Add(10 * time.Second)
	for i := range sizes {
		got := []int{-1}
		for {
			sd, _, err := s.Test(sqs[i])
			require.NoError(t, err)
			if sd {
				break
			}
			require.True(t, time.Now().Before(deadline), "send %d never completed", i)
			runtime.Gosched()
		}
		for {
			done, err := r.Test(rqs[i], got)
			require.NoError(t, err)
			if done {
				break
			}
			require.True(t, time.Now().Before(deadline), "receive %d never completed", i)
			runtime.Gosched()
		}
		require.Equal(t, sizes[i], got[0], "message %d", i)
	}
	require.Equal(t, src, dst)
}
