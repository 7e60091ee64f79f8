package socket

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// initLoopback initialises a loopback transport logging into log.
func initLoopback(t *testing.T, log *captureLog) *Transport {
	t.Helper()
	tr := newLoopback()
	require.NoError(t, tr.Init(nccl.InitContext{Log: log}))
	t.Cleanup(func() { tr.Finalize() })
	return tr
}

// pair connects a send and a receive comm, alternating Connect and Accept.
func pair(t *testing.T, tr *Transport) (*sendComm, *recvComm) {
	t.Helper()
	var h nccl.Handle
	l, err := tr.Listen(0, &h)
	require.NoError(t, err)
	defer l.Close()
	s, r := connectAccept(t, tr, l, h)
	t.Cleanup(func() { s.Close(); r.Close() })
	return s.(*sendComm), r.(*recvComm)
}

// listenDecoded listens on tr's device 0 and decodes the handle, for tests
// that play the connector by hand.
func listenDecoded(t *testing.T, tr *Transport) (nccl.Listener, nccl.Handle, handleInfo) {
	t.Helper()
	var h nccl.Handle
	l, err := tr.Listen(0, &h)
	require.NoError(t, err)
	hi, err := decodeHandle(&h, defaultMagic)
	require.NoError(t, err)
	return l, h, hi
}

func bufPtr(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }

func TestHandleRoundTrip(t *testing.T) {
	hi := handleInfo{magic: 0x1122334455667788, version: protoVersion, addr: netip_MustParseAddrPort("10.1.2.3:4567"),
		streams: 17, minChunk: 65536}
	hi.secret[0], hi.secret[15] = 0xaa, 0xbb
	var h nccl.Handle
	encodeHandle(&h, &hi)
	got, err := decodeHandle(&h, hi.magic)
	require.NoError(t, err)
	assert.Equal(t, hi, got)
	_, pending := pendingConn(&h)
	assert.False(t, pending, "a fresh handle carries no connect state")
	setPendingConn(&h, 99)
	id, pending := pendingConn(&h)
	assert.True(t, pending)
	assert.Equal(t, uint64(99), id)
	got, err = decodeHandle(&h, hi.magic)
	require.NoError(t, err, "connector state must not disturb the listener's fields")
	assert.Equal(t, hi, got)

	hi6 := hi
	hi6.addr = netip_MustParseAddrPort("[fd00::5]:80")
	encodeHandle(&h, &hi6)
	got, err = decodeHandle(&h, hi.magic)
	require.NoError(t, err)
	assert.Equal(t, hi6.addr, got.addr)

	_, err = decodeHandle(&h, 1)
	require.Error(t, err)
	assert.Equal(t, nccl.InvalidUsage, nccl.ResultOf(err))
	assert.Contains(t, err.Error(), envMagic)

	bad := h
	binary.LittleEndian.PutUint16(bad[hOffVersion:], protoVersion+1)
	_, err = decodeHandle(&bad, hi.magic)
	assert.ErrorContains(t, err, "protocol version")

	bad = h
	bad[hOffFamily] = 9
	_, err = decodeHandle(&bad, hi.magic)
	assert.ErrorContains(t, err, "family")

	bad = h
	binary.LittleEndian.PutUint16(bad[hOffPort:], 0)
	_, err = decodeHandle(&bad, hi.magic)
	assert.ErrorContains(t, err, "port")

	bad = h
	bad[hOffStreams] = 65
	_, err = decodeHandle(&bad, hi.magic)
	assert.ErrorContains(t, err, "streams")

	var m hello
	m = hello{magic: 5, version: 7, index: ctrlIndex, streams: 3, connID: 0xdead}
	m.secret[3] = 1
	var b [helloLen]byte
	m.encode(b[:])
	assert.Equal(t, m, decodeHello(b[:]))
}

func TestLinkLocalDialUsesOwnInterface(t *testing.T) {
	hi := handleInfo{addr: netip_MustParseAddrPort("[fe80::1]:1234")}
	d := &device{name: "eth7"}
	assert.Equal(t, "[fe80::1%eth7]:1234", dialAddr(hi, d))
	hi.addr = netip_MustParseAddrPort("10.0.0.1:1234")
	assert.Equal(t, "10.0.0.1:1234", dialAddr(hi, d))
}

// TestRogueConnectors: garbage, a wrong magic, a wrong secret and a client
// that says nothing must all be dropped without disturbing the listen; the
// real connector is still accepted.
func TestRogueConnectors(t *testing.T) {
	withEnv(t, map[string]string{envHelloTimeout: "0.3"})
	log := &captureLog{}
	tr := initLoopback(t, log)
	l, h, hi := listenDecoded(t, tr)
	defer l.Close()
	addr := hi.addr.String()

	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	silent := dial()
	garbage := dial()
	garbage.Write([]byte(strings.Repeat("GET / HTTP/1.0\r\n", 4)))
	wrong := func(mut func(*hello)) net.Conn {
		c := dial()
		m := hello{magic: defaultMagic, version: protoVersion, index: ctrlIndex, streams: hi.streams, secret: hi.secret, connID: 7}
		mut(&m)
		var b [helloLen]byte
		m.encode(b[:])
		c.Write(b[:])
		return c
	}
	badMagic := wrong(func(m *hello) { m.magic++ })
	badSecret := wrong(func(m *hello) { m.secret[0] ^= 1 })
	badVersion := wrong(func(m *hello) { m.version++ })
	badIndex := wrong(func(m *hello) { m.index = 200 })

	// Every rogue connection gets closed by the listener.
	for _, c := range []net.Conn{silent, garbage, badMagic, badSecret, badVersion, badIndex} {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := io.ReadAll(c)
		if err != nil {
			// Closing with unread bytes is a reset; a timeout means still open.
			require.ErrorIs(t, err, syscall.ECONNRESET, "the listener must close a rogue connection (not leave it open)")
		}
	}
	r, err := l.Accept()
	require.NoError(t, err)
	require.Nil(t, r, "no rogue connection may be accepted")

	s, r := connectAccept(t, tr, l, h)
	defer s.Close()
	defer r.Close()
	out := log.String()
	assert.Contains(t, out, "socket magic")
	assert.Contains(t, out, "wrong listen secret")
	assert.Contains(t, out, "protocol version")
	assert.Contains(t, out, "no valid hello")
	// The real connection works.
	exchange(t, s.(*sendComm), r.(*recvComm), 1000)
}

// exchange moves one message of size bytes and checks it.
func exchange(t *testing.T, s *sendComm, r *recvComm, size int) {
	t.Helper()
	src := make([]byte, size+1)
	dst := make([]byte, size+1)
	for i := range src {
		src[i] = byte(i*7 + 1)
	}
	rq, err := r.Irecv([]nccl.RecvBuffer{{Data: bufPtr(dst), Size: size, Tag: 1}})
	require.NoError(t, err)
	sq, err := s.Isend(bufPtr(src), size, 1, 0)
	require.NoError(t, err)
	sizes := []int{-1}
	sd, rd := false, false
	deadline := time.Now().Add(20 * time.Second)
	for !sd || !rd {
		if !sd {
			sd, _, err = s.Test(sq)
			require.NoError(t, err)
		}
		if !rd {
			rd, err = r.Test(rq, sizes)
			require.NoError(t, err)
		}
		require.True(t, time.Now().Before(deadline), "exchange timed out")
		runtime.Gosched()
	}
	assert.Equal(t, size, sizes[0])
	assert.Equal(t, src[:size], dst[:size])
}

func TestConnectRefusedRetriesThenFails(t *testing.T) {
	withEnv(t, map[string]string{envRetryCnt: "3", envRetrySleep: "10"})
	log := &captureLog{}
	tr := initLoopback(t, log)
	// A port nobody listens on: bind one, learn its number, close it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	hi := handleInfo{magic: defaultMagic, version: protoVersion, addr: netip_MustParseAddrPort("127.0.0.1:" + itoa(port)),
		streams: 2, minChunk: defaultMinChunk}
	var h nccl.Handle
	encodeHandle(&h, &hi)
	start := time.Now()
	var s nccl.SendComm
	for err == nil && s == nil {
		s, err = tr.Connect(0, &h, nccl.ConnectOptions{})
		require.Less(t, time.Since(start), 20*time.Second)
		time.Sleep(time.Millisecond)
	}
	require.Error(t, err)
	assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
	assert.Contains(t, err.Error(), "127.0.0.1:"+itoa(port))
	assert.Contains(t, log.String(), "after 3 retries")
	assert.Contains(t, log.String(), "127.0.0.1:"+itoa(port))
	// Linear backoff: 10+20+30 ms at least.
	assert.GreaterOrEqual(t, time.Since(start), 60*time.Millisecond)
}

func TestConnectMagicMismatch(t *testing.T) {
	log := &captureLog{}
	tr := initLoopback(t, log)
	var h nccl.Handle
	withEnv(t, map[string]string{envMagic: "0x77"})
	l, err := tr.Listen(0, &h)
	require.NoError(t, err)
	defer l.Close()
	withEnv(t, nil)
	ch := h
	_, err = tr.Connect(0, &ch, nccl.ConnectOptions{})
	require.Error(t, err)
	assert.Equal(t, nccl.InvalidUsage, nccl.ResultOf(err))
	assert.Contains(t, log.String(), "NCCL_SOCKET_MAGIC")
}

// TestPeerResetMidTransfer closes the receiving end while a large message
// is in flight: the sender's Test must fail with SystemError naming the peer,
// and vice versa.
func TestPeerResetMidTransfer(t *testing.T) {
	for _, closeSender := range []bool{false, true} {
		name := map[bool]string{false: "receiver closes", true: "sender closes"}[closeSender]
		t.Run(name, func(t *testing.T) {
			withEnv(t, nil)
			log := &captureLog{}
			tr := initLoopback(t, log)
			s, r := pair(t, tr)
			const size = 256 << 20
			src := make([]byte, size)
			dst := make([]byte, size)
			rq, err := r.Irecv([]nccl.RecvBuffer{{Data: bufPtr(dst), Size: size, Tag: 1}})
			require.NoError(t, err)
			sq, err := s.Isend(bufPtr(src), size, 1, 0)
			require.NoError(t, err)
			// Let the transfer start, not finish: with every byte on the
			// control stream a few calls already move megabytes.
			for i := 0; i < 5; i++ {
				rdone, err := r.Test(rq, nil)
				require.NoError(t, err)
				sdone, _, err := s.Test(sq)
				require.NoError(t, err)
				require.False(t, rdone || sdone, "256 MiB moved in %d calls", i+1)
			}
			var testErr error
			deadline := time.Now().Add(20 * time.Second)
			if closeSender {
				require.NoError(t, s.Close())
				for testErr == nil {
					var done bool
					done, testErr = r.Test(rq, nil)
					require.False(t, done, "the receive cannot complete: the sender closed mid-message")
					require.True(t, time.Now().Before(deadline), "receiver never noticed the closed peer")
					runtime.Gosched()
				}
				assert.Contains(t, testErr.Error(), r.PeerAddr())
			} else {
				require.NoError(t, r.Close())
				for testErr == nil {
					var done bool
					done, _, testErr = s.Test(sq)
					require.False(t, done)
					require.True(t, time.Now().Before(deadline), "sender never noticed the closed peer")
					runtime.Gosched()
				}
				assert.Contains(t, testErr.Error(), s.PeerAddr())
			}
			assert.Equal(t, nccl.SystemError, nccl.ResultOf(testErr))
			assert.Contains(t, log.String(), "WARN")
			runtime.KeepAlive(src)
			runtime.KeepAlive(dst)
		})
	}
}

// A rogue sender speaks the protocol to a listener and then stalls in the
// middle of a message: striped over data streams, or all on the control
// stream (the small-host default).
func TestTimeoutReceiveStalled(t *testing.T) {
	for _, streams := range []string{"4", "0"} {
		t.Run("streams="+streams, func(t *testing.T) { testTimeoutReceiveStalled(t, streams) })
	}
}

func testTimeoutReceiveStalled(t *testing.T, nthreads string) {
	withEnv(t, map[string]string{nccl.EnvTimeout: "0.3", envNThreads: nthreads})
	log := &captureLog{}
	tr := initLoopback(t, log)
	l, _, hi := listenDecoded(t, tr)
	defer l.Close()
	require.Equal(t, nthreads, fmt.Sprint(hi.streams))
	conns := make([]net.Conn, hi.streams+1)
	for i := range conns {
		c, err := net.Dial("tcp", hi.addr.String())
		require.NoError(t, err)
		defer c.Close()
		m := hello{magic: defaultMagic, version: protoVersion, index: i, streams: hi.streams, secret: hi.secret, connID: 42}
		if i == hi.streams {
			m.index = ctrlIndex
		}
		var b [helloLen]byte
		m.encode(b[:])
		_, err = c.Write(b[:])
		require.NoError(t, err)
		conns[i] = c
	}
	var rc nccl.RecvComm
	var err error
	for rc == nil {
		rc, err = l.Accept()
		require.NoError(t, err)
		runtime.Gosched()
	}
	defer rc.Close()
	dst := make([]byte, 1<<20)
	rq, err := rc.Irecv([]nccl.RecvBuffer{{Data: bufPtr(dst), Size: len(dst), Tag: 3}})
	require.NoError(t, err)

	// Nothing sent yet: waiting for the peer is not a failure, however long.
	waitUntil := time.Now().Add(time.Second)
	for time.Now().Before(waitUntil) {
		done, err := rc.Test(rq, nil)
		require.NoError(t, err, "a receive merely waiting for the sender must not time out")
		require.False(t, done)
		time.Sleep(100 * time.Microsecond)
	}

	// A header for a 1 MiB message, and 1000 bytes of it; then silence.
	ctrlLen := uint32(0) // striped: the payload goes on data stream 0
	if hi.streams == 0 {
		ctrlLen = 1 << 20 // everything follows the header
	}
	var hdr [hdrLen]byte
	binary.LittleEndian.PutUint32(hdr[0:], 1<<20)
	binary.LittleEndian.PutUint32(hdr[4:], ctrlLen)
	binary.LittleEndian.PutUint32(hdr[8:], 3)
	binary.LittleEndian.PutUint32(hdr[12:], hdrCheck^0)
	_, err = conns[hi.streams].Write(hdr[:])
	require.NoError(t, err)
	_, err = conns[0].Write(make([]byte, 1000))
	require.NoError(t, err)
	start := time.Now()
	for {
		done, err := rc.Test(rq, nil)
		require.False(t, done)
		if err != nil {
			assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
			assert.Contains(t, err.Error(), "no progress")
			break
		}
		require.Less(t, time.Since(start), 20*time.Second, "the stalled receive never failed")
		time.Sleep(100 * time.Microsecond)
	}
	assert.Contains(t, log.String(), "NCCL_GO_TIMEOUT")
}

// TestTimeoutSendStalled: a receiver that stops reading in the middle of a
// large message makes the send fail once NCCL_GO_TIMEOUT passes, through
// TCP_USER_TIMEOUT (the kernel aborts a connection whose window stayed
// closed that long).
func TestTimeoutSendStalled(t *testing.T) {
	withEnv(t, map[string]string{nccl.EnvTimeout: "0.5"})
	log := &captureLog{}
	tr := initLoopback(t, log)
	// A fake listener that completes the handshake and then never reads.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	hi := handleInfo{magic: defaultMagic, version: protoVersion, addr: netip_MustParseAddrPort(ln.Addr().String()),
		streams: 1, minChunk: defaultMinChunk}
	var h nccl.Handle
	encodeHandle(&h, &hi)
	accepted := make(chan net.Conn, 2)
	go func() {
		for i := 0; i < 2; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			var b [helloLen]byte
			io.ReadFull(c, b[:])
			accepted <- c
		}
	}()
	var s nccl.SendComm
	for s == nil {
		s, err = tr.Connect(0, &h, nccl.ConnectOptions{})
		require.NoError(t, err)
		time.Sleep(time.Millisecond)
	}
	defer s.Close()
	for i := 0; i < 2; i++ {
		defer (<-accepted).Close()
	}
	src := make([]byte, 256<<20)
	sq, err := s.Isend(bufPtr(src), len(src), 0, 0)
	require.NoError(t, err)
	start := time.Now()
	for {
		done, _, err := s.Test(sq)
		require.False(t, done, "256 MiB cannot fit in socket buffers")
		if err != nil {
			assert.Equal(t, nccl.SystemError, nccl.ResultOf(err))
			break
		}
		require.Less(t, time.Since(start), 30*time.Second, "the stalled send never failed")
		time.Sleep(100 * time.Microsecond)
	}
	assert.Contains(t, log.String(), "WARN")
	runtime.KeepAlive(src)
}

func TestRegMrAndFlush(t *testing.T) {
	withEnv(t, nil)
	log := &captureLog{}
	tr := initLoopback(t, log)
	s, r := pair(t, tr)
	b := make([]byte, 64)
	for _, c := range []nccl.Comm{s, r} {
		mh, err := c.RegMr(bufPtr(b), len(b), nccl.PtrHost)
		require.NoError(t, err)
		assert.NotZero(t, mh)
		require.NoError(t, c.DeregMr(mh))
		require.NoError(t, c.DeregMr(0))
		_, err = c.RegMr(bufPtr(b), len(b), nccl.PtrCUDA)
		require.Error(t, err)
		assert.Equal(t, nccl.InternalError, nccl.ResultOf(err))
	}
	assert.Contains(t, log.String(), "socket transport supports host memory only")
	fr, err := r.Iflush([]nccl.RecvBuffer{{Data: bufPtr(b), Size: 8}})
	require.NoError(t, err)
	assert.Equal(t, nccl.NoRequest, fr)
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// TestCloseLeaksNothing: comms closed with requests outstanding release every
// goroutine and descriptor they had.
func TestCloseLeaksNothing(t *testing.T) {
	withEnv(t, map[string]string{envNThreads: "4", envNSocks: "2"})
	log := &captureLog{}
	tr := newLoopback()
	require.NoError(t, tr.Init(nccl.InitContext{Log: log}))
	// Warm up lazily created runtime state (netpoller, timers).
	func() {
		var h nccl.Handle
		l, _ := tr.Listen(0, &h)
		l.Close()
	}()
	runtime.GC()
	g0, fd0 := runtime.NumGoroutine(), openFDs(t)
	var keep [][]byte
	for i := 0; i < 4; i++ {
		var h nccl.Handle
		l, err := tr.Listen(0, &h)
		require.NoError(t, err)
		s, r := connectAccept(t, tr, l, h)
		require.NoError(t, l.Close())
		big := make([]byte, 64<<20)
		small := make([]byte, 64)
		keep = append(keep, big, small)
		_, err = r.Irecv([]nccl.RecvBuffer{{Data: bufPtr(small), Size: 8, Tag: 1}})
		require.NoError(t, err)
		_, err = s.Isend(bufPtr(big), len(big), 2, 0)
		require.NoError(t, err)
		_, err = s.Isend(bufPtr(small), 8, 1, 0)
		require.NoError(t, err)
		done := make(chan struct{})
		go func() { s.Close(); r.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("Close with requests outstanding did not return")
		}
	}
	// A listener that never accepted, and a connect abandoned mid-way.
	var h nccl.Handle
	l, err := tr.Listen(0, &h)
	require.NoError(t, err)
	ch := h
	_, err = tr.Connect(0, &ch, nccl.ConnectOptions{})
	require.NoError(t, err)
	require.NoError(t, l.Close())
	require.NoError(t, tr.Finalize())
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > g0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	assert.LessOrEqual(t, runtime.NumGoroutine(), g0, "goroutines leaked")
	assert.LessOrEqual(t, openFDs(t), fd0, "descriptors leaked")
	runtime.KeepAlive(keep)
}

// TestListenerCloseRightAfterAccept: NCCL closes the listener as soon as
// Accept returned a comm. A hello goroutine that had just handed its
// connection over must not still be filed as greeting, or the listener's Close
// closes the new comm's control stream under it (seen as EBADF on the first
// receive). The window is narrow, so the sequence is repeated.
func TestListenerCloseRightAfterAccept(t *testing.T) {
	withEnv(t, nil)
	log := &captureLog{}
	tr := initLoopback(t, log)
	for i := 0; i < 300 && !t.Failed(); i++ {
		var h nccl.Handle
		l, err := tr.Listen(0, &h)
		require.NoError(t, err)
		s, r := connectAccept(t, tr, l, h)
		require.NoError(t, l.Close())
		exchange(t, s.(*sendComm), r.(*recvComm), 64)
		s.Close()
		r.Close()
	}
	assert.NotContains(t, log.String(), "WARN")
}
