package plugin

/*
#include "shims.h"
*/
import "C"

import (
	"unsafe"

	"github.com/libnccl-net-go/libnccl-net-go/internal/abi"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// putProperties writes p as the ncclNetProperties_vN_t of API version
// `version` at dst. The Go side fills the newest layout, field by field, in
// this one place; tables.c narrows it to older versions.
func putProperties(version int, p nccl.Properties, dst unsafe.Pointer) error {
	var q C.ncclNetProperties_v12_t
	q.name, q.pciPath, q.guid = persistentCString(p.Name), persistentCString(p.PCIPath), C.uint64_t(p.GUID)
	q.ptrSupport, q.regIsGlobal, q.forceFlush = C.int(p.PtrSupport), cBool(p.RegIsGlobal), cBool(p.ForceFlush)
	q.speed, q.port, q.latency = C.int(p.Speed), C.int(p.Port), C.float(p.Latency)
	q.maxComms, q.maxRecvs = C.int(p.MaxComms), C.int(p.MaxRecvs)
	q.netDeviceType, q.netDeviceVersion = C.NCCL_NET_DEVICE_HOST, 0
	n := min(len(p.VDevs), len(q.vProps.devs))
	for i := 0; i < n; i++ {
		q.vProps.devs[i] = C.int(p.VDevs[i])
	}
	q.vProps.ndevs = C.int(n)
	q.maxP2pBytes, q.maxCollBytes = C.size_t(p.MaxP2PBytes), C.size_t(p.MaxCollBytes)
	q.maxMultiRequestSize = C.int(p.MaxMultiRequestSize)
	q.railId, q.planeId = C.int16_t(abi.ID(p.RailID.Get())), C.int16_t(abi.ID(p.PlaneID.Get()))
	if C.ncclGoPutProperties(C.int(version), &q, dst) != 0 {
		return nccl.Errorf(nccl.InternalError, "getProperties for unknown API version %d", version)
	}
	return nil
}

func cBool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}
