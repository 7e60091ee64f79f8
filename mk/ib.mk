# The IB verbs transport (package ib and ib/verbs, ib/ibv, ib/softnic, ib/sysfs).
# Unit tests run the whole protocol on the in-process software NIC; the real
# libibverbs tests skip here (no RDMA device) and run in the Soft-RoCE lane
# (make test-rdma, mk/rdma.mk). ib/ibv compiles a C shim against
# <infiniband/verbs.h> but never links -libverbs (it dlopens libibverbs.so.1).
.PHONY: test-ib bench-ib

# go-test (mk/plugin.mk) runs ./ib/... with -race, where TestConformance skips
# itself: the nccltest suite hands Go-heap buffers that checkptr (on under
# -race) will not let the software NIC address. This runs it without -race.
test-ib: ## ib's nccltest conformance on the software NIC, without -race (go-test runs the rest)
	$(GO) test -count=1 -run '^TestConformance$$' ./ib/

bench-ib: ## ib data path on the software NIC
	$(GO) test -run '^$$' -bench . -benchmem ./ib/

TEST_TARGETS += test-ib
BENCH_TARGETS += bench-ib
APT_PACKAGES += libibverbs-dev
