# Per-device Prometheus metrics (package metrics): unit tests, benchmarks, and an
# end-to-end check against a real Prometheus server scraping the plugin while the
# C harness moves data (scripts/metrics/prometheus-e2e.sh).
.PHONY: test-metrics test-prometheus bench-metrics

test-metrics:
	$(GO) vet ./metrics/
	$(GO) test -race -count=1 ./metrics/

# METRICS_E2E_SIZE / METRICS_E2E_ITERS pick the transfer the counters must match.
METRICS_E2E_SIZE ?= 1048576
METRICS_E2E_ITERS ?= 64
# HARNESS_ENV (mk/harness.mk) pins the socket interface the transfer uses.
test-prometheus: $(SO) $(BUILD)/ncclnet-harness
	$(HARNESS_ENV) scripts/metrics/prometheus-e2e.sh --plugin $(SO) --harness $(BUILD)/ncclnet-harness \
		--size $(METRICS_E2E_SIZE) --iters $(METRICS_E2E_ITERS)

bench-metrics:
	$(GO) test -run '^$$' -bench . -benchmem ./metrics/

TEST_TARGETS += test-metrics test-prometheus
BENCH_TARGETS += bench-metrics
# prometheus ships promtool too; curl and jq talk to its HTTP API.
APT_PACKAGES += prometheus curl jq
