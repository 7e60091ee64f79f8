package fixture

// A violation: the suffix claims unsafe code that is not here.
func Safe() int { return 1 }
