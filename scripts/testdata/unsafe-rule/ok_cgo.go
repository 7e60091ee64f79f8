package fixture

// #include <stdlib.h>
import "C"

import "unsafe"

var _ = unsafe.Pointer(nil)
