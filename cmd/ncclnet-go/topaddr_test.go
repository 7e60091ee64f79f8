package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// An endpoint that answers without end (another service on a port of the
// range) costs top at most maxScrapeBytes, and is reported as not ours.
func TestTopStopsReadingAnOversizedAnswer(t *testing.T) {
	defer func(n int64) { maxScrapeBytes = n }(maxScrapeBytes)
	maxScrapeBytes = 1 << 20
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		line := []byte("# " + strings.Repeat("x", 1000) + "\n")
		for i := 0; i < 4<<10; i++ { // 4 MiB of comments, a valid exposition
			if _, err := w.Write(line); err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	sc := (&scraper{client: &http.Client{Timeout: 10 * time.Second}}).scrapeOne(srv.URL + "/metrics")
	require.Error(t, sc.err)
	assert.Contains(t, sc.err.Error(), "more than 1 MiB")
}
