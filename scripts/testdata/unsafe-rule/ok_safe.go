package fixture

func OK() {}
