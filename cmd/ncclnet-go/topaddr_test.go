package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
)

// An ADDR that is not one of the forms top takes is bad usage (status 2, one
// line naming the argument), not an endpoint top scrapes and reports down: an
// IPv6 address without brackets ("::1" was read as host ":" and port 1,
// "fe80::1:9400" as host "fe80::1"), a URL whose port is not a port.
func TestTopRefusesMalformedAddresses(t *testing.T) {
	for _, in := range []string{"::1", "fe80::1:9400", "a:b:9400", "http://127.0.0.1:99999", "http://127.0.0.1:0/metrics", "http://x:port", "[::1:9400", "[node1]:9400"} {
		_, err := expandAddr(in)
		assert.Error(t, err, in)

		var stdout, stderr bytes.Buffer
		st := run([]string{"top", "--once", "--interval", "100ms", in}, &cli{stdout: &stdout, stderr: &stderr})
		assert.Equal(t, 2, st, "%s: %s", in, stderr.String())
		assert.Contains(t, stderr.String(), in)
	}
}
