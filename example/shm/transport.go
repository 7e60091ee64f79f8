package shm

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/internal/slots"
	"github.com/libnccl-net-go/libnccl-net-go/internal/timeout"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Transport is the shared-memory fabric: one virtual device, "shm0", reaching
// every rank of this host.
type Transport struct {
	log   nccl.Logger
	mu    sync.Mutex
	ready bool
	boot  [16]byte // this host's boot id: handles from another host are refused
	// pending connects; the connector's handle copy holds the attempt's Ref,
	// so a stale or forged retry finds nothing.
	pending slots.Table[pendingConnect]
}

// New returns an uninitialised transport, for nccl.Register.
func New() nccl.Transport { return &Transport{} }

// Name implements nccl.Transport.
func (t *Transport) Name() string { return "shm" }

// Init implements nccl.Transport. The device exists when the connection
// directory is a writable directory; otherwise the glue falls back. It
// removes the connection files there that no live process holds (sweep.go).
func (t *Transport) Init(ctx nccl.InitContext) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.log = ctx.Logger()
	if settingDisable.Get(t.log) {
		return fmt.Errorf("%w: %s=1", nccl.ErrNoDevice, envDisable)
	}
	dir := settingDir.Get()
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("%w: %s=%s is not a directory (set it to a tmpfs such as /dev/shm)", nccl.ErrNoDevice, envDir, dir)
	}
	if err := unix.Access(dir, unix.W_OK|unix.X_OK); err != nil {
		return fmt.Errorf("%w: %s=%s is not writable: %v", nccl.ErrNoDevice, envDir, dir, err)
	}
	sweep(dir, t.log)
	t.boot = readBootID()
	t.ready = true
	if d := peerTimeout(t.log); d <= 0 {
		t.log.Warnf("%s : NCCL_GO_TIMEOUT=%v: dead-peer detection is off; a comm whose peer process died fails only when NCCL aborts it, and connection set-up is bounded by the default %v", logPrefix, d, timeout.Default)
	}
	t.log.Infof(nccl.SubsysInit|nccl.SubsysNet, "%s : connection files in %s, %d-byte rings", logPrefix, dir, ringSizeSetting(t.log))
	return nil
}

// readBootID returns the kernel's boot id, a per-host-per-boot random value;
// zero when unavailable, which disables the same-host check.
func readBootID() (id [16]byte) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return id
	}
	raw, err := hex.DecodeString(strings.ReplaceAll(strings.TrimSpace(string(b)), "-", ""))
	if err == nil && len(raw) == len(id) {
		copy(id[:], raw)
	}
	return id
}

// Devices implements nccl.Transport.
func (t *Transport) Devices() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.ready {
		return 0
	}
	return 1
}

// Properties implements nccl.Transport.
func (t *Transport) Properties(dev int) (nccl.Properties, error) {
	if dev != 0 {
		return nccl.Properties{}, nccl.Errorf(nccl.InvalidArgument, "NET/GoShm : device %d does not exist; shm has one device, 0", dev)
	}
	h := fnv.New64a()
	t.mu.Lock()
	h.Write(t.boot[:])
	log := t.log
	t.mu.Unlock()
	speed := settingSpeed.Get(log)
	return nccl.Properties{
		Name:         "shm0",
		PCIPath:      "", // virtual: no PCI device behind it
		GUID:         h.Sum64(),
		PtrSupport:   nccl.PtrHost,
		Speed:        int(speed),
		MaxComms:     65536,
		MaxRecvs:     maxRecvs,
		MaxP2PBytes:  nccl.MaxNetSizeBytes,
		MaxCollBytes: nccl.MaxCollSize,
	}, nil
}

// Finalize implements nccl.Transport: connects NCCL abandoned are released;
// open comms belong to NCCL, which closes them.
func (t *Transport) Finalize() error {
	t.pending.Range(func(ref slots.Ref, pc *pendingConnect) bool {
		if t.pending.Remove(ref) != nil {
			pc.release()
		}
		return true
	})
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ready = false
	return nil
}

func (t *Transport) logger() nccl.Logger {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.log == nil {
		return nccl.DiscardLogger{}
	}
	return t.log
}

// Handle layout. NCCL copies all 128 bytes to the connector; the connector's
// copy is then reused on every connect retry, so after the first call it holds
// pendingMagic and the id of the attempt instead.
const (
	handleMagic  = 0x31484d48534f474e // "NGOSHMH1"
	pendingMagic = 0x31444e504d48534e // "NSHMPND1"
	hOffBoot     = 8
	hOffSecret   = 24
	hOffPath     = 56
	maxPathLen   = nccl.HandleSize - hOffPath - 1 // NUL-terminated
	secretLen    = 32
)

func encodeHandle(h *nccl.Handle, boot [16]byte, secret []byte, path string) {
	*h = nccl.Handle{}
	binary.LittleEndian.PutUint64(h[0:], handleMagic)
	copy(h[hOffBoot:], boot[:])
	copy(h[hOffSecret:], secret)
	copy(h[hOffPath:], path)
}

func decodeHandle(h *nccl.Handle) (boot [16]byte, secret []byte, path string, err error) {
	if binary.LittleEndian.Uint64(h[0:]) != handleMagic {
		return boot, nil, "", nccl.Errorf(nccl.InvalidArgument, "NET/GoShm : connect got a handle that no shm listener wrote (does the listening rank load another net plugin?)")
	}
	copy(boot[:], h[hOffBoot:])
	secret = append([]byte(nil), h[hOffSecret:hOffSecret+secretLen]...)
	p := h[hOffPath:]
	i := bytes.IndexByte(p, 0)
	if i < 0 {
		return boot, nil, "", nccl.Errorf(nccl.InvalidArgument, "%s : connect got a handle whose path is not terminated", logPrefix)
	}
	path = string(p[:i])
	if !isConnPath(path) {
		// The handle comes from another process: never open what it names
		// unless it is one of our connection files.
		return boot, nil, "", nccl.Errorf(nccl.InvalidArgument, "%s : connect got a handle naming %q, which is not a shm connection file", logPrefix, path)
	}
	return boot, secret, path, nil
}

// connFilePrefix starts the name of every connection file:
// ncclgo-shm-<listener pid>-<16 hex digits>.
const connFilePrefix = "ncclgo-shm-"

// isConnPath reports whether path is an absolute, clean path to a file named
// as Listen names them.
func isConnPath(path string) bool {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return false
	}
	name, ok := strings.CutPrefix(filepath.Base(path), connFilePrefix)
	if !ok {
		return false
	}
	pid, rnd, ok := strings.Cut(name, "-")
	if !ok || pid == "" || len(rnd) != 16 {
		return false
	}
	for _, c := range pid {
		if c < '0' || c > '9' {
			return false
		}
	}
	for _, c := range rnd {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
