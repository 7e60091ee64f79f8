# The SDK example: the shm transport built into its own plugin library, checked
# by the same C conformance harness as the default library, and the vendor
# template tried the way docs/extending.md tells a new user to.
# (Go unit tests of example/... run in go-test with the rest of ./...)
SHM_SO := $(BUILD)/libnccl-net-shm.so
LOADCHECK := $(BUILD)/loadcheck
# Everything the shm library is built from (mk/plugin.mk's list is defined
# after this file is read, so it cannot be used in a prerequisite here).
SHM_SOURCES := $(shell find example/shm nccl plugin metrics -name '*.go' -not -name '*_test.go' 2>/dev/null) \
               $(wildcard plugin/*.c plugin/*.h plugin/exports.map nccl/include/*.h) go.mod scripts/build-plugin.sh

$(SHM_SO): $(SHM_SOURCES)
	scripts/build-plugin.sh --name Shm --out $@ ./example/shm/cmd/libnccl-net-shm

$(LOADCHECK): example/template/loadcheck.c $(wildcard nccl/include/*.h)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -Wall -Wextra -Werror -Inccl/include -o $@ $< -ldl

.PHONY: shm conformance-shm bench-shm template-check
shm: $(SHM_SO)

# The harness forks two processes, so connections cross processes as in a job.
conformance-shm: $(BUILD)/ncclnet-harness $(SHM_SO)
	$(BUILD)/ncclnet-harness conformance --plugin $(SHM_SO) --versions 8,9,10,11,12

bench-shm: $(BUILD)/ncclnet-harness $(SHM_SO)
	$(BUILD)/ncclnet-harness bench --plugin $(SHM_SO) all

template-check: $(LOADCHECK)
	example/template/check.sh $(abspath $(LOADCHECK))

TEST_TARGETS += conformance-shm template-check
BENCH_TARGETS += bench-shm
APT_PACKAGES += gcc libc6-dev binutils
