package fixture

import (
	"fmt"
	u "unsafe" // a violation, even renamed
)

var _ = fmt.Sprint(u.Sizeof(0))
