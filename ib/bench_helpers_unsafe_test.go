package ib

import (
	"fmt"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/ib/internal/softnic"
	"github.com/libnccl-net-go/libnccl-net-go/ib/verbs"
	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

func byteSize(n int) string {
	if n >= 1<<10 {
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

func setEnvTB(b *testing.B) {
	m := map[string]string{"NCCL_SOCKET_IFNAME": "lo"}
	ncclenv.SetLookup(func(k string) (string, bool) { v, ok := m[k]; return v, ok })
	b.Cleanup(func() { ncclenv.SetLookup(nil) })
}

func benchHost(b *testing.B, f *softnic.Fabric, dev string) *Transport {
	root := b.TempDir()
	if err := f.WriteSysfs(root); err != nil {
		b.Fatal(err)
	}
	tr := NewWithOptions(Options{Provider: f.Provider(verbs.Features{}, dev), SysfsRoot: root})
	if err := tr.Init(nccl.InitContext{}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = tr.Finalize() })
	return tr
}

func benchConnect(b *testing.B, a, r *Transport) (*sendComm, *recvComm) {
	var h nccl.Handle
	l, err := r.Listen(0, &h)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	var sc nccl.SendComm
	var rc nccl.RecvComm
	for deadline := time.Now().Add(10 * time.Second); sc == nil || rc == nil; {
		if sc == nil {
			if sc, err = a.Connect(0, &h, nccl.ConnectOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		if rc == nil {
			if rc, err = l.Accept(); err != nil {
				b.Fatal(err)
			}
		}
		if time.Now().After(deadline) {
			b.Fatal("connect timed out")
		}
	}
	b.Cleanup(func() { _ = sc.Close(); _ = rc.Close() })
	return sc.(*sendComm), rc.(*recvComm)
}

func benchBuf(b *testing.B, c nccl.Comm, size int) *buf {
	m, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		b.Fatal(err)
	}
	mh, err := c.RegMr(unsafe.Pointer(&m[0]), size, nccl.PtrHost)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.DeregMr(mh); _ = unix.Munmap(m) })
	return &buf{b: m, mh: mh}
}
