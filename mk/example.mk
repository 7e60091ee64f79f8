# The SDK example: the shm transport built into its own plugin library, checked
# by the same C conformance harness as the default library, and the vendor
# template tried the way docs/extending.md tells a new user to. (The Go unit
# tests of example/... run in go-test with every other package.)
$(SHM_SO): $(GO_SOURCES)
	scripts/build-plugin.sh --name Shm --out $@ ./example/shm/cmd/libnccl-net-shm

$(LOADCHECK): example/template/loadcheck.c $(wildcard nccl/include/*.h)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -Wall -Wextra -Werror -Inccl/include -o $@ $< -ldl

.PHONY: shm conformance-shm bench-shm template-check
shm: $(SHM_SO) ## build build/libnccl-net-shm.so, the SDK example's library

# The harness forks two processes, so connections cross processes as in a job.
conformance-shm: $(HARNESS) $(SHM_SO) ## the C conformance harness against the shm library, API v8..v12
	$(HARNESS) conformance --plugin $(SHM_SO) --versions 8,9,10,11,12

bench-shm: $(HARNESS) $(SHM_SO) ## shm latency and bandwidth beside plain TCP
	$(HARNESS) bench --plugin $(SHM_SO) all

template-check: $(LOADCHECK) ## docs/extending.md's template steps, verbatim, in a fresh module
	example/template/check.sh $(abspath $(LOADCHECK))

TEST_TARGETS += conformance-shm template-check
BENCH_TARGETS += bench-shm
APT_PACKAGES += gcc libc6-dev binutils
