package ib

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// setEnv makes the NCCL settings exactly kv (plus NCCL_SOCKET_IFNAME=lo unless
// given) for the test; the lookup is process-wide, so these tests do not
// run in parallel.
func setEnv(t *testing.T, kv ...string) {
	t.Helper()
	m := map[string]string{"NCCL_SOCKET_IFNAME": "lo"}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	ncclenv.SetLookup(func(k string) (string, bool) { v, ok := m[k]; return v, ok })
	t.Cleanup(func() { ncclenv.SetLookup(nil) })
}

// captureLog records log lines for assertions.
type captureLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *captureLog) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, s)
}
func (l *captureLog) Warnf(f string, a ...any)                 { l.add("WARN " + fmt.Sprintf(f, a...)) }
func (l *captureLog) Infof(_ nccl.Subsys, f string, a ...any)  { l.add("INFO " + fmt.Sprintf(f, a...)) }
func (l *captureLog) Tracef(_ nccl.Subsys, f string, a ...any) {}
func (l *captureLog) has(sub string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.lines {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
func (l *captureLog) count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.lines {
		if strings.Contains(s, sub) {
			n++
		}
	}
	return n
}
func (l *captureLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// host is one transport instance ("node") on a software fabric.
type host struct {
	t    *Transport
	log  *captureLog
	root string // its sysfs tree
}

func newHost(t *testing.T, f *softnic.Fabric, feat verbs.Features, devs ...string) *host {
	t.Helper()
	root := t.TempDir()
	require.NoError(t, f.WriteSysfs(root))
	h := &host{t: NewWithOptions(Options{Provider: f.Provider(feat, devs...), SysfsRoot: root}), log: &captureLog{}, root: root}
	require.NoError(t, h.t.Init(nccl.InitContext{Log: h.log}))
	// Cleanups run last-in first-out: the NIC is checked after Finalize.
	t.Cleanup(func() { assert.Empty(t, f.Violations(), "use-after-free or leak reported by the software NIC") })
	t.Cleanup(func() { require.NoError(t, h.t.Finalize()) })
	return h
}

// within polls f until it reports done, failing the test after a bound: no
// test may hang.
func within(t *testing.T, what string, f func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		done, err := f()
		require.NoError(t, err, what)
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not done after 10s", what)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// listenOn opens a listen on h's device dev; it is closed when the test
// ends at the latest (Close is idempotent).
func listenOn(t *testing.T, h *host, dev int) (nccl.Listener, *nccl.Handle) {
	t.Helper()
	var hd nccl.Handle
	l, err := h.t.Listen(dev, &hd)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l, &hd
}

// connectPair connects a's device sdev (sender) to b's device rdev (receiver).
func connectPair(t *testing.T, a *host, sdev int, b *host, rdev int) (*sendComm, *recvComm) {
	t.Helper()
	l, h := listenOn(t, b, rdev)
	defer func() { require.NoError(t, l.Close()) }()
	return connectVia(t, a, sdev, l, h)
}

// connectVia connects a's device sdev to the listen l (handle h); the comms
// are closed when the test ends.
func connectVia(t *testing.T, a *host, sdev int, l nccl.Listener, h *nccl.Handle) (*sendComm, *recvComm) {
	t.Helper()
	var sc nccl.SendComm
	var rc nccl.RecvComm
	within(t, "connect/accept", func() (bool, error) {
		var err error
		if sc == nil {
			if sc, err = a.t.Connect(sdev, h, nccl.ConnectOptions{TrafficClass: nccl.TrafficClassUndef}); err != nil {
				return false, err
			}
		}
		if rc == nil {
			if rc, err = l.Accept(); err != nil {
				return false, err
			}
		}
		return sc != nil && rc != nil, nil
	})
	t.Cleanup(func() { _ = sc.Close(); _ = rc.Close() })
	return sc.(*sendComm), rc.(*recvComm)
}

// buf is test memory with a registration on a comm.
type buf struct {
	b  []byte
	mh nccl.MemHandle
}

func (x *buf) ptr() unsafe.Pointer { return unsafe.Pointer(&x.b[0]) }

// newBuf allocates outside the Go heap, as NCCL's buffers are: the MR cache
// page-rounds registrations, which is only valid on memory we own whole.
func newBuf(t *testing.T, c nccl.Comm, size int, fill byte) *buf {
	t.Helper()
	m, err := unix.Mmap(-1, 0, max(size, 1), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(m) })
	copy(m, bytes.Repeat([]byte{fill}, len(m)))
	x := &buf{b: m}
	mh, err := c.RegMr(x.ptr(), len(x.b), nccl.PtrHost)
	require.NoError(t, err)
	x.mh = mh
	t.Cleanup(func() { _ = c.DeregMr(mh) })
	return x
}

func pattern(n int, seed byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*7) ^ seed
	}
	return p
}

// transfer sends the given sizes as one grouped receive (tags 0..n-1) and
// returns what each receive buffer got and the reported sizes.
func transfer(t *testing.T, sc *sendComm, rc *recvComm, sendSizes, recvCaps []int) ([][]byte, []int) {
	t.Helper()
	n := len(recvCaps)
	rbufs := make([]*buf, n)
	rb := make([]nccl.RecvBuffer, n)
	for i := range rb {
		rbufs[i] = newBuf(t, rc, recvCaps[i], 0xee)
		rb[i] = nccl.RecvBuffer{Data: rbufs[i].ptr(), Size: recvCaps[i], Tag: i, MH: rbufs[i].mh}
	}
	rreq, err := rc.Irecv(rb)
	require.NoError(t, err)
	require.NotEqual(t, nccl.NoRequest, rreq)
	sreqs := make([]nccl.Request, n)
	for i := n - 1; i >= 0; i-- { // tags pick the buffer whatever the order
		sb := newBuf(t, sc, sendSizes[i], 0)
		copy(sb.b, pattern(sendSizes[i], byte(i)))
		within(t, "isend", func() (bool, error) {
			r, err := sc.Isend(sb.ptr(), sendSizes[i], i, sb.mh)
			sreqs[i] = r
			return r != nccl.NoRequest, err
		})
	}
	sizes := make([]int, n)
	within(t, "recv test", func() (bool, error) { return rc.Test(rreq, sizes) })
	for i := range sreqs {
		within(t, "send test", func() (bool, error) {
			done, sz, err := sc.Test(sreqs[i])
			if done {
				require.Equal(t, sendSizes[i], sz)
			}
			return done, err
		})
	}
	out := make([][]byte, n)
	for i := range out {
		out[i] = rbufs[i].b
	}
	return out, sizes
}

func twoHosts(t *testing.T, cfg softnic.DeviceConfig) (*softnic.Fabric, *host, *host) {
	f := softnic.NewFabric()
	a, b := cfg, cfg
	a.Name, b.Name = "simA_0", "simB_0"
	f.AddDevice(a)
	f.AddDevice(b)
	return f, newHost(t, f, verbs.Features{}, "simA_0"), newHost(t, f, verbs.Features{}, "simB_0")
}

// mmapBytes is n bytes outside the Go heap, unmapped when the test ends.
func mmapBytes(t testing.TB, n int) []byte {
	t.Helper()
	m, err := unix.Mmap(-1, 0, max(n, 1), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(m) })
	return m
}

// fakeGPU is an address NCCL could pass for GPU memory: a dma-buf
// registration names it, the host never dereferences it.
func fakeGPU(addr uintptr) unsafe.Pointer { return unsafe.Add(unsafe.Pointer(nil), addr) }

// memfd stands in for a GPU dma-buf fd: the software NIC maps it.
func memfd(t testing.TB, size int) int {
	t.Helper()
	fd, err := unix.MemfdCreate("dmabuf", 0)
	require.NoError(t, err)
	require.NoError(t, unix.Ftruncate(fd, int64(size)))
	t.Cleanup(func() { _ = unix.Close(fd) })
	return fd
}
