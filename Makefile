# libnccl-net-go build.
#
# Each area keeps its targets in mk/<area>.mk and adds them to TEST_TARGETS
# (make test), BENCH_TARGETS (make bench), CHECK_TARGETS (make check) and the
# Debian packages they need to APT_PACKAGES. A target gets a trailing
# "## what it does" comment so that `make help` lists it.
#
# Include order: mk/plugin.mk and mk/harness.mk first (they build the
# libraries and the C harness the other areas run), then every other fragment
# in name order. The paths several fragments use are defined here, once, so a
# fragment may use them in its prerequisites wherever it is included; a
# variable only one fragment needs stays in that fragment.
SHELL := /bin/bash
GO ?= go
BUILD ?= build

# Artefacts shared by several fragments (the rules are in the fragment named):
# the default library and the same exporting only v9 and v10 (plugin.mk), the
# SDK example's library and the vendor template's load check (example.mk), the
# C conformance and bench harness (harness.mk).
SO        := $(BUILD)/libnccl-net-go.so
SO_V9V10  := $(BUILD)/libnccl-net-go-v9v10.so
SHM_SO    := $(BUILD)/libnccl-net-shm.so
LOADCHECK := $(BUILD)/loadcheck
HARNESS   := $(BUILD)/ncclnet-harness
# Everything a plugin library is built from.
GO_SOURCES := $(shell find . -name '*.go' -not -name '*_test.go' -not -path './build/*' -not -path './.rdma/*' -not -path '*/testdata/*' 2>/dev/null) \
              $(wildcard plugin/*.c plugin/*.h plugin/exports.map nccl/include/*.h) go.mod go.sum scripts/build-plugin.sh
# NCCL (and our socket transport) fall back to lo only when no other interface
# is up; harness runs pin it so they behave the same on any fresh machine.
HARNESS_IFNAME ?= lo
HARNESS_ENV := NCCL_SOCKET_IFNAME=$(HARNESS_IFNAME)

TEST_TARGETS :=
BENCH_TARGETS :=
CHECK_TARGETS :=
APT_PACKAGES :=

.PHONY: all test check bench deps help clean
.DEFAULT_GOAL := all
all: $(SO)

MK_FIRST := mk/plugin.mk mk/harness.mk
include $(MK_FIRST)
include $(filter-out $(MK_FIRST),$(sort $(wildcard mk/*.mk)))

deps: ## install the Debian packages the tests need (idempotent; nothing to do when present)
	@scripts/deps.sh $(sort $(APT_PACKAGES))

test: deps $(TEST_TARGETS) ## every test, as CI runs it (the README's command; about 10 minutes)
	@echo "all test targets passed: $(TEST_TARGETS)"

check: $(filter lint,$(CHECK_TARGETS)) $(filter-out lint,$(CHECK_TARGETS)) ## quick pre-push check, under 3 minutes: lint, unit tests with -race -short (no in-process TestConformance), C conformance of the default library, test-deploy
	@echo "check passed: $(CHECK_TARGETS) (make test runs everything: full -race unit tests, every harness, Prometheus, shm, e2e checks, the Soft-RoCE lane)"

bench: $(BENCH_TARGETS) ## every benchmark (run under the exclusive lock; see docs/performance.md)

help: ## list the targets and what they do
	@echo "usage: make [TARGET] [VAR=value ...]   (variables: docs/configuration.md, 'Build and test knobs')"
	@awk 'BEGIN { FS = ":[^#]*## " } /^[A-Za-z0-9_.-]+:[^=].*## / { printf "  %-24s %s\n", $$1, $$2 }' \
	  Makefile $(MK_FIRST) $(filter-out $(MK_FIRST),$(sort $(wildcard mk/*.mk)))
	@echo "make test runs: $(TEST_TARGETS)"
	@echo "make check runs: $(CHECK_TARGETS)"

clean: ## remove build/ (the Soft-RoCE image in .rdma/ stays)
	rm -rf $(BUILD)
