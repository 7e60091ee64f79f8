// Package metrics owns the plugin's per-device traffic counters and their
// exposition to Prometheus.
//
// The plugin glue counts every request at the C boundary, so every transport,
// vendor transports included, gets the same metrics without doing anything.
// Counting is a few atomic adds on a *Device looked up once per comm: no locks,
// allocation or map lookups per message. A collector reads the counters at scrape
// time.
//
// Exposure is off by default. Start (called once per plugin init, reference
// counted) reads NCCL_GO_METRICS_PORT / _BIND / _LOCAL_RANK to serve /metrics on
// base port + local rank, and NCCL_GO_METRICS_TEXTFILE_DIR / _INTERVAL to write
// an atomically replaced file for node_exporter's textfile collector. Both use a
// private prometheus.Registry: the plugin runs inside the application's process
// and must not touch the global default registry. Failing to expose is a WARN,
// never an error. docs/metrics.md lists every metric and setting.
package metrics
