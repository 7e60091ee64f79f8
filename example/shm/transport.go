package shm

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Settings (read through nccl.Env* when used, never cached across Init).
const (
	envDisable = "NCCL_GO_SHM_DISABLE"      // 1: report no device, so the glue falls back
	envDir     = "NCCL_GO_SHM_DIR"          // where connection files are made (tmpfs)
	envRing    = "NCCL_GO_SHM_RING_SIZE"    // bytes of each connection's data ring
	envTimeout = "NCCL_GO_SHM_PEER_TIMEOUT" // heartbeat limit when no pidfd is possible
	envSpeed   = "NCCL_GO_SHM_SPEED"        // advertised Mbps

	defaultDir = "/dev/shm"
	// defaultSpeed is about what two memcpy passes through the ring sustain
	// (12-18 GB/s between two processes on a small VM, see docs/extending.md):
	// NCCL weighs devices by speed, so it should not promise a 400G NIC.
	defaultSpeed = 100000
)

// Transport is the shared-memory fabric: one virtual device, "shm0", reaching
// every rank of this host.
type Transport struct {
	log   nccl.Logger
	mu    sync.Mutex
	ready bool
	boot  [16]byte // this host's boot id: handles from another host are refused
	// pending connects, keyed by the id the connector left in its handle copy.
	pending map[uint64]*pendingConnect
	nextID  uint64
}

// New returns an uninitialised transport, for nccl.Register.
func New() nccl.Transport { return &Transport{} }

// Name implements nccl.Transport.
func (t *Transport) Name() string { return "shm" }

// Init implements nccl.Transport. The device exists when the connection
// directory is a writable directory; otherwise the glue falls back.
func (t *Transport) Init(ctx nccl.InitContext) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.log = ctx.Log
	if t.log == nil {
		t.log = nccl.DiscardLogger{}
	}
	if nccl.EnvBool(t.log, envDisable, false) {
		return fmt.Errorf("%w: %s=1", nccl.ErrNoDevice, envDisable)
	}
	dir := nccl.EnvString(envDir, defaultDir)
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("%w: %s=%s is not a directory (set it to a tmpfs such as /dev/shm)", nccl.ErrNoDevice, envDir, dir)
	}
	if err := unix.Access(dir, unix.W_OK|unix.X_OK); err != nil {
		return fmt.Errorf("%w: %s=%s is not writable: %v", nccl.ErrNoDevice, envDir, dir, err)
	}
	t.boot = readBootID()
	t.pending = make(map[uint64]*pendingConnect)
	t.ready = true
	t.log.Infof(nccl.SubsysInit|nccl.SubsysNet, "NET/Shm : connection files in %s, %d-byte rings", dir, ringSizeSetting(t.log))
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
		return nccl.Properties{}, nccl.Errorf(nccl.InvalidArgument, "NET/Shm : device %d does not exist; shm has one device, 0", dev)
	}
	h := fnv.New64a()
	t.mu.Lock()
	h.Write(t.boot[:])
	log := t.log
	t.mu.Unlock()
	speed := nccl.EnvInt(log, envSpeed, defaultSpeed)
	if speed <= 0 {
		speed = defaultSpeed
	}
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
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, pc := range t.pending {
		pc.release()
		delete(t.pending, id)
	}
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

func peerTimeout(log nccl.Logger) time.Duration {
	return nccl.EnvDuration(log, envTimeout, defaultTimeout, time.Second)
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
		return boot, nil, "", nccl.Errorf(nccl.InvalidArgument, "NET/Shm : connect got a handle that no shm listener wrote (does the listening rank load another net plugin?)")
	}
	copy(boot[:], h[hOffBoot:])
	secret = append([]byte(nil), h[hOffSecret:hOffSecret+secretLen]...)
	p := h[hOffPath:]
	if i := bytes.IndexByte(p, 0); i >= 0 {
		p = p[:i]
	}
	return boot, secret, string(p), nil
}
