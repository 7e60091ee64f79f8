# Reliability (docs/reliability.md): the fault lane, its self-test and the fuzz
# runner. $(HARNESS), $(SO) and $(SHM_SO) are defined in the Makefile.
IMPAIR := $(BUILD)/impair
FAULTY_SO := $(BUILD)/libnccl-net-faulty.so
FUZZTIME ?= 15s

$(IMPAIR): $(filter-out %_test.go,$(wildcard tools/impair/*.go)) go.mod go.sum
	$(GO) build -o $@ ./tools/impair

$(FAULTY_SO): scripts/faults/testdata/faultyplugin.c $(wildcard nccl/include/*.h)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -g -Wall -Wextra -Werror -Inccl/include -fPIC -shared -o $@ $<

.PHONY: impair test-faults faults-selftest fuzz
impair: $(IMPAIR) ## build tools/impair, the user-space loss/delay/link-down relay between two TAP devices

test-faults: faults-selftest $(HARNESS) $(SO) $(SHM_SO) $(IMPAIR) ## the fault lane: two network namespaces, tbf, link down, our impairment relay, SIGKILL/SIGSTOP, stray connections, aborts (root)
	scripts/faults/run.sh --plugin $(SO) --shm-plugin $(SHM_SO) --harness $(HARNESS) --impair $(IMPAIR)

faults-selftest: $(HARNESS) $(FAULTY_SO) ## the fault lane's checks fail on a plugin with known defects
	scripts/faults/selftest.sh $(HARNESS) $(FAULTY_SO)

fuzz: ## every Go fuzz target in the module, FUZZTIME (15s) each; fails on a crash and says how to replay it
	@FUZZTIME=$(FUZZTIME) GO="$(GO)" scripts/faults/fuzz.sh

TEST_TARGETS += test-faults fuzz
# ip and tc (iproute2), flock (util-linux), timeout and tail --pid (coreutils).
APT_PACKAGES += iproute2 util-linux coreutils
