package fixture

import "unsafe" // a violation: not named *_unsafe.go

var _ = unsafe.Sizeof(0)
