//go:build race

package shm

// raceEnabled: under the race detector the suite's byte-by-byte pattern checks
// of 1 GiB messages take minutes, so the full range runs without -race (the
// C harness checks 1 GiB on every make test too).
const raceEnabled = true
