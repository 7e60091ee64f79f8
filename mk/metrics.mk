# Per-device Prometheus metrics (package metrics): benchmarks, and an
# end-to-end check against a real Prometheus server scraping the plugin while the
# C harness moves data (scripts/metrics/prometheus-e2e.sh). The unit tests run
# in go-test with every other package.
.PHONY: test-prometheus bench-metrics

# METRICS_E2E_SIZE / METRICS_E2E_ITERS pick the transfer the counters must match.
METRICS_E2E_SIZE ?= 1048576
METRICS_E2E_ITERS ?= 64
# HARNESS_ENV (top Makefile) pins the socket interface the transfer uses.
test-prometheus: $(SO) $(HARNESS) ## a real Prometheus scrapes the plugin while the harness moves data; counters must match
	$(HARNESS_ENV) scripts/metrics/prometheus-e2e.sh --plugin $(SO) --harness $(HARNESS) \
		--size $(METRICS_E2E_SIZE) --iters $(METRICS_E2E_ITERS)

bench-metrics: ## metrics counting cost
	$(GO) test -run '^$$' -bench . -benchmem ./metrics/

TEST_TARGETS += test-prometheus
BENCH_TARGETS += bench-metrics
# prometheus ships promtool too; curl and jq talk to its HTTP API;
# node_exporter's textfile collector reads the textfile mode's files.
APT_PACKAGES += prometheus prometheus-node-exporter curl jq
