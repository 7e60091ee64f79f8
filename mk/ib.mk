# The IB verbs transport (packages ib, ib/verbs and ib/internal/{ibv,softnic,sysfs}).
# Unit tests run the whole protocol on the in-process software NIC, conformance
# suite included (every mode, under -race: the suite hands off-heap, registered
# buffers); they run in go-test with the rest of ./... . The real libibverbs tests
# skip here (no RDMA device) and run in the Soft-RoCE lane (make test-rdma,
# mk/rdma.mk). ib/internal/ibv compiles a C shim against <infiniband/verbs.h> but
# never links -libverbs (it dlopens libibverbs.so.1).
.PHONY: test-ib bench-ib

# test-ib: only the ib packages (what go-test runs for them), for a quick check.
test-ib: ## the ib packages alone (vet, tests under -race), as go-test runs them
	$(GO) vet ./ib/...
	$(GO) test -race -count=1 ./ib/...

bench-ib: ## ib data path on the software NIC
	$(GO) test -run '^$$' -bench . -benchmem ./ib/

BENCH_TARGETS += bench-ib
APT_PACKAGES += libibverbs-dev
