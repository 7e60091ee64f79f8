package socket

import (
	"bytes"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// fakeIfaces is an injected interface list.
type fakeIfaces []Iface

func (f fakeIfaces) Interfaces() ([]Iface, error) { return f, nil }

// newLoopback is a transport whose only interface is lo (127.0.0.1), so
// tests do not depend on the host's network set-up.
func newLoopback() *Transport {
	return &Transport{
		ifaces:  fakeIfaces{{Name: "lo", Index: 1, Up: true, Running: true, Addrs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/8")}}},
		sysRoot: "testdata/sys-none",
	}
}

// connectAccept drives Connect (on a copy of h, as NCCL keeps its own) and
// l.Accept alternately until both return a comm, failing tb after 10 s.
func connectAccept(tb testing.TB, tr *Transport, l nccl.Listener, h nccl.Handle) (nccl.SendComm, nccl.RecvComm) {
	tb.Helper()
	var s nccl.SendComm
	var r nccl.RecvComm
	var err error
	deadline := time.Now().Add(10 * time.Second)
	for s == nil || r == nil {
		if s == nil {
			if s, err = tr.Connect(0, &h, nccl.ConnectOptions{}); err != nil {
				tb.Fatalf("Connect: %v", err)
			}
		}
		if r == nil {
			if r, err = l.Accept(); err != nil {
				tb.Fatalf("Accept: %v", err)
			}
		}
		if time.Now().After(deadline) {
			tb.Fatal("connection set-up timed out")
		}
		runtime.Gosched()
	}
	return s, r
}

// withEnv installs a settings lookup for the test (restored at cleanup);
// nothing else is set.
func withEnv(t testing.TB, env map[string]string) {
	t.Helper()
	ncclenv.SetLookup(func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	})
	t.Cleanup(func() { ncclenv.SetLookup(nil) })
}

// captureLog records everything logged, for checking WARN texts.
type captureLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *captureLog) add(level, format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(&l.buf, "%s %s\n", level, fmt.Sprintf(format, args...))
}

func (l *captureLog) Warnf(format string, args ...any)                { l.add("WARN", format, args...) }
func (l *captureLog) Infof(_ nccl.Subsys, format string, args ...any) { l.add("INFO", format, args...) }
func (l *captureLog) Tracef(nccl.Subsys, string, ...any)              {}

func (l *captureLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func netip_MustParseAddrPort(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func itoa(i int) string { return fmt.Sprint(i) }

// postRecvs posts one receive of each size, back to back in one buffer, and
// returns the bytes the sender is to send (a pattern), that buffer, and the
// requests in order.
func postRecvs(t *testing.T, r nccl.RecvComm, sizes []int, tag, seed int) (src, dst []byte, rqs []nccl.Request) {
	t.Helper()
	total := 0
	for _, n := range sizes {
		total += n
	}
	src, dst = make([]byte, total), make([]byte, total)
	pattern(src, seed)
	off := 0
	for _, n := range sizes {
		q, err := r.Irecv([]nccl.RecvBuffer{{Data: bufPtr(dst[off:]), Size: n, Tag: tag}})
		require.NoError(t, err)
		rqs = append(rqs, q)
		off += n
	}
	return src, dst, rqs
}
