package plugin

/*
#include <stdlib.h>
#include "shims.h"
*/
import "C"

import (
	"unsafe"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// The calls the glue makes into C: the live environment, NCCL's logger,
// NCCL's profiler callback and the exported tables' optional entries.

func init() {
	ncclenv.SetLookup(cLookupEnv)
	onSetup = func(t nccl.Transport) {
		_, fuses := t.(nccl.VDeviceMaker)
		C.ncclGoSetVDevice(cBool(fuses))
	}
}

// cLookupEnv reads the live C environment: NCCL applies nccl.conf with setenv
// after our runtime copied os.Environ.
func cLookupEnv(name string) (string, bool) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	v := C.getenv(cs)
	if v == nil {
		return "", false
	}
	return C.GoString(v), true
}

type cSink struct{ fn C.ncclDebugLogger_t }

func (s cSink) log(level int, flags uint64, msg string) {
	cs := C.CString(msg)
	C.ncclGoLog(s.fn, C.int(level), C.ulong(flags), cs)
	C.free(unsafe.Pointer(cs))
}

type cProfiler struct{ fn C.ncclProfilerCallback_t }

func (p cProfiler) start(phandle uintptr, typ int, dev int, size int64, tag int, req uintptr) uintptr {
	return uintptr(C.ncclGoProfStart(p.fn, C.uintptr_t(phandle), C.int(typ), C.int(dev), C.uint64_t(size), C.int(tag), C.uintptr_t(req)))
}

func (p cProfiler) stop(ev uintptr) { C.ncclGoProfStop(p.fn, C.uintptr_t(ev)) }
