// Package clock is the plugin's one monotonic clock: nanoseconds as an int64,
// read without allocating or locking, so the data path can stamp requests and
// rate-limit its checks with it.
package clock

import "time"

// epoch anchors the clock; time.Since uses the monotonic reading.
var epoch = time.Now()

// Now returns monotonic nanoseconds. It is never 0, so 0 can mean "not set".
func Now() int64 { return int64(time.Since(epoch)) + 1 }

// Since is the time elapsed since t, a value Now returned.
func Since(t int64) time.Duration { return time.Duration(Now() - t) }
