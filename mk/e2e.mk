# Real NCCL end to end on a GPU machine, and what of it can be checked without one.
# See docs/e2e-gpu.md.
#   make e2e-gpu       one GPU, two ranks posing as two hosts: correctness on both
#                      libraries, log checks, Go vs NCCL Socket busbw (build/e2e/)
#   make e2e-glibc     the libraries need no newer glibc than GLIBC_FLOOR
#   make e2e-selftest  shellcheck, pyflakes, unit tests, gloo dry run (no GPU)
#   make e2e-kill      one GPU: a rank SIGKILLed, with and without a forked child
#                      outliving it; our plugin next to NCCL Socket (build/e2e-kill/)
#   make gpu-round     what a device session runs in one bounded command
#                      (e2e/gpu-round.sh; output in build/gpu-round/)
#   make rxe-probe     can this host run Soft-RoCE, and the ib transport next to
#                      ib_write_bw over it, natively (root; e2e/rxe-probe.sh)
# mk/plugin.mk owns the rules for both libraries ($(SO), $(SO_V9V10)).
# The oldest glibc among the GPU images we target (RHEL/Rocky 9: 2.34).
GLIBC_FLOOR ?= 2.34

.PHONY: e2e-gpu e2e-kill e2e-glibc e2e-selftest rxe-probe gpu-round

e2e-gpu: $(SO) $(SO_V9V10) ## real NCCL on one GPU, both libraries (needs a GPU machine)
	e2e/run-gpu.sh --plugin $(SO) --plugin-v9v10 $(SO_V9V10)

e2e-kill: $(SO) ## real NCCL on one GPU: how long a rank waits for a killed peer, with and without its forked child (needs a GPU machine)
	"$${E2E_PYTHON:-python3}" e2e/nccl_e2e.py kill --plugin $(SO)

e2e-glibc: $(SO) $(SO_V9V10) ## the libraries need no newer glibc than GLIBC_FLOOR
	e2e/check-glibc.sh --floor $(GLIBC_FLOOR) $(SO) $(SO_V9V10)

e2e-selftest: $(SO) $(SO_V9V10) $(HARNESS) ## the GPU e2e scripts without a GPU: shellcheck, pyflakes, unit tests, gloo dry run, gpu-round
	e2e/selftest.sh --plugin $(SO) --plugin-v9v10 $(SO_V9V10)

gpu-round: $(SO) $(SO_V9V10) $(HARNESS) $(TOOLS_CMD) $(TOOLS_HELPER) ## a device session's one command: facts, rxe-probe, real NCCL kill check, correctness and 5 alternating rounds of Go and Socket bandwidth, harness bench (GPU host)
	e2e/gpu-round.sh --build $(BUILD)

rxe-probe: $(SO) $(HARNESS) $(TOOLS_CMD) $(TOOLS_HELPER) ## native Soft-RoCE on this host: ib transport next to ib_write_bw (root; exit 77: cannot)
	e2e/rxe-probe.sh --build $(BUILD)

TEST_TARGETS += e2e-glibc e2e-selftest
# python3-torch (CPU build) lets the self test run the suite for real with gloo.
APT_PACKAGES += binutils shellcheck python3 python3-pyflakes python3-torch
