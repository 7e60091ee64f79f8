// Package golden compares a transcript a test builds, line by line, with a
// golden text kept in the test: the wire tests of ib and socket pin each
// protocol version's bytes this way.
package golden

import (
	"encoding/hex"
	"fmt"
	"strings"
)

// Diff returns one entry per line where got differs from want (the golden
// text; blank lines around it are ignored), quoting want's line after
// wantSays and got's after gotSays, or "(none)" past either's end. It
// returns nil when the two agree.
func Diff(want string, got []string, wantSays, gotSays string) []string {
	wl := strings.Split(strings.TrimSpace(want), "\n")
	var diff []string
	for i := 0; i < max(len(got), len(wl)); i++ {
		g, w := "(none)", "(none)"
		if i < len(got) {
			g = got[i]
		}
		if i < len(wl) {
			w = wl[i]
		}
		if g != w {
			diff = append(diff, fmt.Sprintf("  %s %q\n  %s %q", wantSays, w, gotSays, g))
		}
	}
	return diff
}

// Hex writes b in hex, a space at each offset in cuts (ascending), so that a
// message's fields read apart in a transcript.
func Hex(b []byte, cuts ...int) string {
	var parts []string
	prev := 0
	for _, c := range append(cuts, len(b)) {
		parts = append(parts, hex.EncodeToString(b[prev:c]))
		prev = c
	}
	return strings.Join(parts, " ")
}
