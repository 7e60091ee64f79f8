package plugin

import (
	"encoding/binary"
	"math"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// putProperties is checked against the byte offsets NCCL reads
// (nccl-net-api.md §1.5), independently of our own C headers, for every
// version; nothing may be written past the version's struct.
func TestPropertiesLayoutPerVersion(t *testing.T) {
	p := nccl.Properties{Name: "mlx5_0", PCIPath: "/sys/devices/pci0000:00/0000:00:02.0", GUID: 0x1122334455667788,
		PtrSupport: nccl.PtrHost | nccl.PtrCUDA, RegIsGlobal: true, ForceFlush: true, Speed: 400000, Port: 2,
		Latency: 1.5, MaxComms: 65536, MaxRecvs: 8, VDevs: []int{3, 1, 4, 1, 5, 9},
		MaxP2PBytes: 1 << 33, MaxCollBytes: 1 << 29, MaxMultiRequestSize: 7, RailID: nccl.KnownID(11)}
	layouts := map[int]struct {
		size                                          int
		speed, port, latency, maxComms, maxRecvs      int
		devType, forceFlush, vprops, p2p, coll, multi int
		ndevs, rail                                   int
	}{
		8:  {64, 32, 36, 40, 44, 48, 52, -1, -1, -1, -1, -1, 0, -1},
		9:  {104, 36, 40, 44, 48, 52, 56, 32, 64, 88, 96, -1, 4, -1},
		10: {104, 36, 40, 44, 48, 52, 56, 32, 64, 88, 96, -1, 4, -1},
		11: {112, 36, 40, 44, 48, 52, 56, 32, 64, 88, 96, 104, 4, -1},
		12: {128, 36, 40, 44, 48, 52, 56, 32, 64, 104, 112, 120, 6, 124},
	}
	for v, l := range layouts {
		buf := make([]byte, 256)
		for i := range buf {
			buf[i] = 0xEE
		}
		require.NoError(t, putProperties(v, p, unsafe.Pointer(&buf[0])), "v%d", v)
		le := binary.LittleEndian
		u32 := func(off int) uint32 { return le.Uint32(buf[off:]) }
		name := *(**byte)(unsafe.Pointer(&buf[0]))
		pci := *(**byte)(unsafe.Pointer(&buf[8]))
		require.NotNil(t, name)
		require.NotNil(t, pci)
		assert.Equal(t, p.Name, string(unsafe.Slice(name, len(p.Name)+1)[:len(p.Name)]), "v%d name", v)
		assert.Zero(t, unsafe.Slice(name, len(p.Name)+1)[len(p.Name)], "v%d name is NUL-terminated", v)
		assert.Equal(t, p.PCIPath, string(unsafe.Slice(pci, len(p.PCIPath))), "v%d pciPath", v)
		assert.Equal(t, p.GUID, le.Uint64(buf[16:]), "v%d guid", v)
		assert.EqualValues(t, p.PtrSupport, u32(24), "v%d ptrSupport", v)
		assert.EqualValues(t, 1, u32(28), "v%d regIsGlobal", v)
		assert.EqualValues(t, p.Speed, u32(l.speed), "v%d speed", v)
		assert.EqualValues(t, p.Port, u32(l.port), "v%d port", v)
		assert.Equal(t, p.Latency, math.Float32frombits(u32(l.latency)), "v%d latency", v)
		assert.EqualValues(t, p.MaxComms, u32(l.maxComms), "v%d maxComms", v)
		assert.EqualValues(t, p.MaxRecvs, u32(l.maxRecvs), "v%d maxRecvs", v)
		assert.EqualValues(t, 0, u32(l.devType), "v%d netDeviceType HOST", v)
		assert.EqualValues(t, 0, u32(l.devType+4), "v%d netDeviceVersion", v)
		if l.forceFlush >= 0 {
			assert.EqualValues(t, 1, u32(l.forceFlush), "v%d forceFlush", v)
			assert.EqualValues(t, l.ndevs, u32(l.vprops), "v%d vProps.ndevs (4 slots before v12, 8 in v12)", v)
			for i := 0; i < l.ndevs; i++ {
				assert.EqualValues(t, p.VDevs[i], u32(l.vprops+4+4*i), "v%d vProps.devs[%d]", v, i)
			}
			assert.EqualValues(t, p.MaxP2PBytes, le.Uint64(buf[l.p2p:]), "v%d maxP2pBytes", v)
			assert.EqualValues(t, p.MaxCollBytes, le.Uint64(buf[l.coll:]), "v%d maxCollBytes", v)
		}
		if l.multi >= 0 {
			assert.EqualValues(t, p.MaxMultiRequestSize, u32(l.multi), "v%d maxMultiRequestSize", v)
		}
		if l.rail >= 0 {
			assert.EqualValues(t, 11, int16(le.Uint16(buf[l.rail:])), "v%d railId", v)
			assert.EqualValues(t, -1, int16(le.Uint16(buf[l.rail+2:])), "v%d planeId: unknown is NCCL's undefined", v)
		}
		for i := l.size; i < len(buf); i++ {
			if buf[i] != 0xEE {
				t.Fatalf("v%d: byte %d written past sizeof(ncclNetProperties_v%d_t) = %d", v, i, v, l.size)
			}
		}
	}
	assert.Error(t, putProperties(7, p, unsafe.Pointer(&make([]byte, 256)[0])), "an unknown version is refused")
	assert.Equal(t, uintptr(unsafe.Pointer(persistentCString(p.Name))), uintptr(unsafe.Pointer(persistentCString(p.Name))), "one C copy per string")
}
