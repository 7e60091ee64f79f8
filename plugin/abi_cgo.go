package plugin

/*
#include "shims.h"
*/
import "C"

import (
	"unsafe"

	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// Compile-time checks that the Go side and the C headers agree: each index
// below is a constant that is 0 exactly when they do; any other value (or a
// negative one, which overflows uintptr) fails the build instead of
// corrupting memory inside NCCL's process at run time. The C side pins the
// NCCL structs themselves (nccl/include/net_asserts.h).
var (
	// Handles and requests travel through C as uintptr_t / void*.
	_ = [1]struct{}{}[unsafe.Sizeof(C.uintptr_t(0))-unsafe.Sizeof(uintptr(0))]
	_ = [1]struct{}{}[unsafe.Sizeof(unsafe.Pointer(nil))-unsafe.Sizeof(uintptr(0))]
	// test's sizes array is int*, read as *int32; phandles are void*, read as uintptr.
	_ = [1]struct{}{}[unsafe.Sizeof(C.int(0))-unsafe.Sizeof(int32(0))]
	// The listen handle NCCL copies is nccl.Handle.
	_ = [1]struct{}{}[C.NCCL_NET_HANDLE_MAXSIZE-unsafe.Sizeof(nccl.Handle{})]
	// Tags and ids the C tables pass to Go.
	_ = [1]struct{}{}[C.NCCL_GO_TAG_SEND-tagSend]
	_ = [1]struct{}{}[C.NCCL_GO_TAG_RECV-tagRecv]
	_ = [1]struct{}{}[C.NCCL_GO_TAG_LISTEN-tagListen]
	_ = [1]struct{}{}[C.NCCL_GO_PROF_PLUGIN_ID-profPluginID]
	// ncclResult_t values the glue returns.
	_ = [1]struct{}{}[unsafe.Sizeof(C.ncclResult_t(0))-unsafe.Sizeof(nccl.Result(0))]
	_ = [1]struct{}{}[C.ncclInternalError-nccl.InternalError]
	_ = [1]struct{}{}[C.ncclInvalidArgument-nccl.InvalidArgument]
	_ = [1]struct{}{}[C.ncclRemoteError-nccl.RemoteError]
	// Limits of the contract the glue checks NCCL's arguments against.
	_ = [1]struct{}{}[C.NCCL_NET_MAX_REQUESTS-nccl.MaxRequests]
	_ = [1]struct{}{}[C.NCCL_NET_HANDLE_MAXSIZE-nccl.HandleSize]
	_ = [1]struct{}{}[C.NCCL_MAX_NET_SIZE-nccl.MaxNetSize]
)
