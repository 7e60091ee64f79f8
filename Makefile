# libnccl-net-go build. Each area keeps its targets in mk/<area>.mk and adds itself
# to TEST_TARGETS / BENCH_TARGETS / APT_PACKAGES; this file only wires them up.
SHELL := /bin/bash
GO ?= go
BUILD ?= build
export GOFLAGS ?= -mod=mod
SO := $(BUILD)/libnccl-net-go.so

TEST_TARGETS :=
BENCH_TARGETS :=
APT_PACKAGES :=

.PHONY: all test bench deps clean
all: $(SO)

include $(sort $(wildcard mk/*.mk))

# deps installs the Debian packages the tests need (idempotent; no-op when present).
deps:
	@scripts/deps.sh $(sort $(APT_PACKAGES))

test: deps $(TEST_TARGETS)
	@echo "all test targets passed: $(TEST_TARGETS)"

bench: $(BENCH_TARGETS)

clean:
	rm -rf $(BUILD)
