# Real NCCL end to end on a GPU machine, and what of it can be checked without one.
# See docs/e2e-gpu.md.
#   make e2e-gpu       one GPU, two ranks posing as two hosts: correctness on both
#                      libraries, log checks, Go vs NCCL Socket busbw (build/e2e/)
#   make e2e-glibc     the libraries need no newer glibc than GLIBC_FLOOR
#   make e2e-selftest  shellcheck, pyflakes, unit tests, gloo dry run (no GPU)
# mk/plugin.mk owns the rules for both libraries; this fragment is read before it,
# so it names the v9/v10 build's path itself.
E2E_SO_V9V10 := $(BUILD)/libnccl-net-go-v9v10.so
# The oldest glibc among the GPU images we target (RHEL/Rocky 9: 2.34).
GLIBC_FLOOR ?= 2.34

.PHONY: e2e-gpu e2e-glibc e2e-selftest

e2e-gpu: $(SO) $(E2E_SO_V9V10)
	e2e/run-gpu.sh --plugin $(SO) --plugin-v9v10 $(E2E_SO_V9V10)

e2e-glibc: $(SO) $(E2E_SO_V9V10)
	e2e/check-glibc.sh --floor $(GLIBC_FLOOR) $(SO) $(E2E_SO_V9V10)

e2e-selftest: $(SO) $(E2E_SO_V9V10)
	e2e/selftest.sh --plugin $(SO) --plugin-v9v10 $(E2E_SO_V9V10)

TEST_TARGETS += e2e-glibc e2e-selftest
# python3-torch (CPU build) lets the self test run the suite for real with gloo.
APT_PACKAGES += binutils shellcheck python3 python3-pyflakes python3-torch
