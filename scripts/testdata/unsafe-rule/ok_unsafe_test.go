package fixture

import (
	"testing"
	"unsafe"
)

func TestX(t *testing.T) { _ = unsafe.Sizeof(t) }
