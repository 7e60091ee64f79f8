# The C conformance and benchmark harness (harness/): $(HARNESS), and the
# targets that run it against the default plugin $(SO) (rule in mk/plugin.mk).
HARNESS_SRCS := $(sort $(wildcard harness/*.c))
HARNESS_HDRS := $(wildcard harness/*.h nccl/include/*.h)
HARNESS_CFLAGS ?= -std=c11 -O2 -g -Wall -Wextra -Werror
HARNESS_VERSIONS ?= 8,9,10,11,12

$(HARNESS): $(HARNESS_SRCS) $(HARNESS_HDRS) mk/harness.mk
	@mkdir -p $(dir $@)
	$(CC) $(HARNESS_CFLAGS) -Inccl/include -pthread -o $@ $(HARNESS_SRCS) -ldl

# A deliberately broken plugin: the self-test requires the harness to fail it.
HARNESS_BAD := $(BUILD)/libnccl-net-bad.so
$(HARNESS_BAD): harness/testdata/badplugin.c $(HARNESS_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(HARNESS_CFLAGS) -Inccl/include -fPIC -shared -o $@ $<

# harness/util.c's helpers, checked on their own.
HARNESS_UTIL_TEST := $(BUILD)/harness-util-test
$(HARNESS_UTIL_TEST): harness/testdata/util_test.c harness/util.c $(HARNESS_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(HARNESS_CFLAGS) -Inccl/include -pthread -o $@ harness/testdata/util_test.c harness/util.c

.PHONY: harness harness-selftest conformance conformance-striped demo harness-bench
harness: $(HARNESS) ## build the C harness

harness-selftest: $(HARNESS) $(HARNESS_BAD) $(HARNESS_UTIL_TEST) $(SO) ## the harness fails a broken plugin, exits 1 and catches a hang; bench --verbose; util.c's helpers
	$(HARNESS_UTIL_TEST)
	harness/selftest.sh $(HARNESS) $(HARNESS_BAD) $(SO)

conformance: $(HARNESS) $(SO) ## every check of the NCCL net contract, API v8..v12, two processes, through the C ABI
	$(HARNESS_ENV) $(HARNESS) conformance --plugin $(SO) --versions $(HARNESS_VERSIONS)

demo: $(HARNESS) $(SO) ## 16 x 64 MiB from one process to another through the plugin, verified, with GB/s
	$(HARNESS_ENV) $(HARNESS) transfer --plugin $(SO)

harness-bench: $(HARNESS) $(SO) ## plugin vs plain TCP: latency and bandwidth (docs/performance.md)
	$(HARNESS_ENV) $(HARNESS) bench --plugin $(SO) all

# The socket transport's default layout depends on the CPU count (no data
# streams below 8 CPUs); this run forces 4 striped streams so both layouts are
# checked through the C ABI on any machine.
conformance-striped: $(HARNESS) $(SO) ## conformance with 4 striped socket streams (v9, v12)
	$(HARNESS_ENV) NCCL_SOCKET_NTHREADS=4 $(HARNESS) conformance --plugin $(SO) --versions 9,12

TEST_TARGETS += harness-selftest conformance conformance-striped
CHECK_TARGETS += conformance
BENCH_TARGETS += harness-bench
APT_PACKAGES += gcc libc6-dev make
