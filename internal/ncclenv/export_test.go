package ncclenv

// Accessors only the tests need.

func (g *Group) Prefix() string { return g.prefix }

func (b *base) Setting() Setting { return b.s }

func (b *base) IsSet() bool { _, ok := Value(b.s.Name); return ok }
