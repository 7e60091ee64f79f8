package fixture

// A violation: cgo outside a *_cgo.go file.

// #include <stdlib.h>
import "C"
