# Reliability (docs/reliability.md):
#   make test-faults   the fault lane: two network namespaces, the plugin driven
#                      through its C ABI by `ncclnet-harness faults`, the path
#                      broken on purpose (tbf, link down, our impairment relay,
#                      SIGKILL/SIGSTOP, garbage connections, aborts)
#   make faults-selftest  the lane's checks fail on a plugin with known defects
#   make fuzz          every Go fuzz target in the module, FUZZTIME each
# This fragment is read before mk/harness.mk, so it names the harness's path
# itself.
IMPAIR := $(BUILD)/impair
FAULTS_HARNESS := $(BUILD)/ncclnet-harness
FAULTY_SO := $(BUILD)/libnccl-net-faulty.so
FUZZTIME ?= 15s

$(IMPAIR): $(filter-out %_test.go,$(wildcard tools/impair/*.go)) go.mod
	$(GO) build -o $@ ./tools/impair

$(FAULTY_SO): scripts/faults/testdata/faultyplugin.c $(wildcard nccl/include/*.h)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -g -Wall -Wextra -Werror -Inccl/include -fPIC -shared -o $@ $<

.PHONY: test-faults faults-selftest fuzz
test-faults: faults-selftest $(FAULTS_HARNESS) $(SO) $(SHM_SO) $(IMPAIR)
	scripts/faults/run.sh --plugin $(SO) --shm-plugin $(SHM_SO) --harness $(FAULTS_HARNESS) --impair $(IMPAIR)

faults-selftest: $(FAULTS_HARNESS) $(FAULTY_SO)
	scripts/faults/selftest.sh $(FAULTS_HARNESS) $(FAULTY_SO)

fuzz:
	@FUZZTIME=$(FUZZTIME) GO="$(GO)" scripts/faults/fuzz.sh

TEST_TARGETS += test-faults fuzz
# ip and tc (iproute2), flock (util-linux), timeout (coreutils).
APT_PACKAGES += iproute2 util-linux coreutils
