# The Soft-RoCE lane: real ibverbs over rxe0 inside a qemu (TCG) guest booted from
# Debian's stock kernel. See docs/softroce-lane.md.
#   make test-rdma    verbs smoke test, ./ib/... real-verbs Go tests (TestReal*: the
#                     conformance suite once per mode, abort rounds), and the C
#                     conformance harness over rxe0 with the ib transport forced
#   make bench-rdma   harness `bench bw` next to ib_write_bw, `bench lat` next to
#                     ib_write_lat, on the same rxe0
#   make rdma-setup   only fetch the kernel and build the guest image (.rdma/)
# RDMA_GOTEST_FLAGS goes to `go test -c` (default -race: the real-verbs paths run
# only here, and under TCG the race detector costs little extra); RDMA_LANE_STRICT=1 makes
# every skipped section a failure; RDMA_TIMEOUT bounds one guest run (seconds).
RDMA_TESTS_DIR := $(BUILD)/rdma-tests
RDMA_HARNESS_BIN ?= $(HARNESS)
RDMA_TIMEOUT ?= 2400
RDMA_GOTEST_FLAGS ?= -race
RDMA_BENCH_TIMEOUT ?= 1500

# The harness (mk/harness.mk) and the plugin are built by their own fragments;
# until the harness exists the lane says so instead of failing to find a rule.
ifneq ($(wildcard mk/harness.mk),)
RDMA_HARNESS_STATE := present
RDMA_HARNESS_DEPS := $(SO) $(RDMA_HARNESS_BIN)
else
RDMA_HARNESS_STATE := absent
RDMA_HARNESS_DEPS :=
endif

.PHONY: rdma-setup rdma-tests test-rdma bench-rdma

rdma-setup: ## fetch the kernel and build the Soft-RoCE guest image (.rdma/) only
	@scripts/rdma/setup.sh

rdma-tests: ## build the real-verbs Go test binaries for the guest
	@GO="$(GO)" RDMA_GOTEST_FLAGS="$(RDMA_GOTEST_FLAGS)" scripts/rdma/build-tests.sh $(RDMA_TESTS_DIR)

test-rdma: rdma-setup rdma-tests $(RDMA_HARNESS_DEPS) $(BUILD)/ncclnet-go $(BUILD)/ncclnet-go-selftest ## the Soft-RoCE lane: real libibverbs over rxe0 in a qemu guest (slow)
	@RDMA_LANE_IB=$$(GO="$(GO)" scripts/rdma/ib-state.sh) RDMA_LANE_HARNESS=$(RDMA_HARNESS_STATE) \
	  RDMA_LANE_BUILD=$(BUILD) scripts/rdma/run.sh --no-setup --timeout $(RDMA_TIMEOUT) -- scripts/rdma/lane.sh test

bench-rdma: rdma-setup $(RDMA_HARNESS_DEPS) ## harness bandwidth next to ib_write_bw on the same rxe0
	@RDMA_LANE_IB=$$(GO="$(GO)" scripts/rdma/ib-state.sh) RDMA_LANE_HARNESS=$(RDMA_HARNESS_STATE) \
	  RDMA_LANE_BUILD=$(BUILD) scripts/rdma/run.sh --no-setup --bench --timeout $(RDMA_BENCH_TIMEOUT) -- scripts/rdma/lane.sh bench

TEST_TARGETS += test-rdma
BENCH_TARGETS += bench-rdma
APT_PACKAGES += $(strip $(file < scripts/rdma/packages.txt))
