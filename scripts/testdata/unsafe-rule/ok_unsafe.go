package fixture

import "unsafe"

var _ = unsafe.Sizeof(0)
