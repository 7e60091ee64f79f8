# The C conformance and benchmark harness (harness/): build/ncclnet-harness, and
# the targets that run it against the default plugin $(SO) (rule in mk/plugin.mk).
HARNESS := $(BUILD)/ncclnet-harness
HARNESS_SRCS := $(sort $(wildcard harness/*.c))
HARNESS_HDRS := $(wildcard harness/*.h nccl/include/*.h)
HARNESS_CFLAGS ?= -std=c11 -O2 -g -Wall -Wextra -Werror
# NCCL (and our socket transport) only falls back to lo when no other interface
# is up; pin it so the tests behave the same on any fresh machine.
HARNESS_IFNAME ?= lo
HARNESS_ENV := NCCL_SOCKET_IFNAME=$(HARNESS_IFNAME)
HARNESS_VERSIONS ?= 8,9,10,11,12

$(HARNESS): $(HARNESS_SRCS) $(HARNESS_HDRS) mk/harness.mk
	@mkdir -p $(dir $@)
	$(CC) $(HARNESS_CFLAGS) -Inccl/include -pthread -o $@ $(HARNESS_SRCS) -ldl

# A deliberately broken plugin: the self-test requires the harness to fail it.
HARNESS_BAD := $(BUILD)/libnccl-net-bad.so
$(HARNESS_BAD): harness/testdata/badplugin.c $(HARNESS_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(HARNESS_CFLAGS) -Inccl/include -fPIC -shared -o $@ $<

.PHONY: harness harness-selftest conformance conformance-striped demo harness-bench
harness: $(HARNESS)

# The checks can fail: a broken plugin must get FAILs, exit 1 and a caught hang.
harness-selftest: $(HARNESS) $(HARNESS_BAD)
	harness/selftest.sh $(HARNESS) $(HARNESS_BAD)

# Every check of the NCCL net contract for every API version (exit 1 on any FAIL).
conformance: $(HARNESS) $(SO)
	$(HARNESS_ENV) $(HARNESS) conformance --plugin $(SO) --versions $(HARNESS_VERSIONS)

# The main job: 16 x 64 MiB from one process to another, verified, with GB/s.
demo: $(HARNESS) $(SO)
	$(HARNESS_ENV) $(HARNESS) transfer --plugin $(SO)

# Plugin vs plain TCP, latency and bandwidth (numbers go in docs/performance.md).
harness-bench: $(HARNESS) $(SO)
	$(HARNESS_ENV) $(HARNESS) bench --plugin $(SO) all

# The socket transport's default layout depends on the CPU count (no data
# streams below 8 CPUs); this run forces 4 striped streams so both layouts are
# checked through the C ABI on any machine.
conformance-striped: $(HARNESS) $(SO)
	$(HARNESS_ENV) NCCL_SOCKET_NTHREADS=4 $(HARNESS) conformance --plugin $(SO) --versions 9,12

TEST_TARGETS += harness-selftest conformance conformance-striped
BENCH_TARGETS += harness-bench
APT_PACKAGES += gcc libc6-dev make
