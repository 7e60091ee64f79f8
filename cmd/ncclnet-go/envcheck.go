package main

import "github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"

// Problems with a set value, as `env` reports them.
const (
	problemInvalid = "invalid"      // the plugin ignores the value (or replaces it by a bound)
	problemPartial = "read in part" // the plugin uses part of it (text after a number is ignored)
)

// checkSetting reads raw as the plugin reads s, through the setting's own
// reader (ncclenv.Check): problem is "" when the plugin uses the value as
// written (no WARN), else problemInvalid or problemPartial with why, which
// ends in what the plugin uses instead.
func checkSetting(s ncclenv.Setting, raw string) (problem, why string) {
	v, ok := ncclenv.Check(s.Name, raw)
	switch {
	case !ok || v.OK():
		return "", ""
	case v.Invalid:
		return problemInvalid, v.Why
	}
	return problemPartial, v.Why
}
