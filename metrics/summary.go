package metrics

import (
	"fmt"
	"strings"
)

// Summary returns one line per device for the log at finalize: traffic each
// direction, and errors and stalls when there were any, so a job's log says
// what each NIC carried even when nobody scraped the metrics.
func Summary() []string {
	devs := Devices()
	lines := make([]string, 0, len(devs))
	for _, d := range devs {
		lines = append(lines, summaryLine(d.Snapshot()))
	}
	return lines
}

func summaryLine(s Snapshot) string {
	var b strings.Builder
	fmt.Fprintf(&b, "device %s", s.Name)
	if s.Port != 0 {
		fmt.Fprintf(&b, " port %d", s.Port)
	}
	fmt.Fprintf(&b, " (%s): sent %s in %d messages, received %s in %d messages",
		s.Transport, humanBytes(s.Bytes[Send]), s.Msgs[Send], humanBytes(s.Bytes[Recv]), s.Msgs[Recv])
	var errs uint64
	for dir := range s.Errors {
		for _, n := range s.Errors[dir] {
			errs += n
		}
	}
	if errs > 0 {
		fmt.Fprintf(&b, ", %d errors", errs)
	}
	if n := s.Stalls[Send] + s.Stalls[Recv]; n > 0 {
		fmt.Fprintf(&b, ", %d stalled requests", n)
	}
	if n := s.Inflight[Send] + s.Inflight[Recv]; n != 0 {
		fmt.Fprintf(&b, ", %d requests still in flight", n)
	}
	return b.String()
}

// humanBytes prints exact bytes for small counts (tests and short runs compare
// them) and a decimal unit with the exact count otherwise.
func humanBytes(n uint64) string {
	const unit = 1000
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.2f %cB (%d bytes)", float64(n)/float64(div), "kMGTP"[exp], n)
}
