package socket

import "unsafe"

func bufPtr(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }
