// Package metrics owns the plugin's per-device traffic counters and their
// exposition to Prometheus.
//
// The plugin glue counts every request at the C boundary, so every transport,
// vendor transports included, gets the same metrics without doing anything.
// Counting is a few atomic adds on a *Device looked up once per comm: no locks,
// allocation or map lookups per message. A collector reads the counters at scrape
// time.
package metrics
