# The plugin glue and the default library: $(SO) and $(SO_V9V10) (paths in the
# top Makefile), the Go unit tests of every package, and the ABI check.
PREFIX ?= /usr/local
LIBDIR ?= $(PREFIX)/lib

# What building the library needs (the ib transport's C shims compile against
# rdma-core's <infiniband/verbs.h>; libibverbs itself is dlopen'ed at run time).
BUILD_APT_PACKAGES := gcc libc6-dev libibverbs-dev make binutils
.PHONY: deps-build
deps-build: ## install what building the library needs
	@scripts/deps.sh $(BUILD_APT_PACKAGES)

$(SO): $(GO_SOURCES) | deps-build
	scripts/build-plugin.sh --name Go --out $@ ./cmd/libnccl-net-go

# A build exporting only ncclNetPlugin_v10 and _v9, so NCCL's adapters for older
# plugin versions get exercised by real NCCL too.
$(SO_V9V10): $(GO_SOURCES) | deps-build
	scripts/build-plugin.sh --name Go --only-v9-v10 --out $@ ./cmd/libnccl-net-go

# The default library built with the Go race detector (tests only; see
# scripts/build-plugin.sh --race for why it is linked at a low address).
SO_RACE := $(BUILD)/libnccl-net-go-race.so
$(SO_RACE): $(GO_SOURCES) | deps-build
	scripts/build-plugin.sh --name Go --race --out $@ ./cmd/libnccl-net-go

# NCCL's threads at once (several progress threads with their own
# communicators, a service thread connecting, registering, closing, and v11+
# init/finalize of extra contexts) against the race build: any data race
# report or corrupt byte fails, for v12, v11 and v10, 3 runs each.
.PHONY: concurrent concurrent-race
concurrent-race: $(HARNESS) $(SO_RACE) ## NCCL's threads at once against a -race build of the library (v12/v11/v10, 3 runs): no race, no corrupt byte
	$(HARNESS_ENV) harness/concurrent-race.sh $(HARNESS) $(SO_RACE) 12,11,10 3 --iters 4000

concurrent: $(HARNESS) $(SO) ## NCCL's threads at once (progress, service, init/finalize) on the library, API v8..v12
	$(HARNESS_ENV) $(HARNESS) concurrent --plugin $(SO) --versions $(HARNESS_VERSIONS)

TEST_TARGETS += concurrent concurrent-race

.PHONY: lib install uninstall go-test go-test-short abi-check
lib: $(SO) ## build build/libnccl-net-go.so (the default target)

# NCCL dlopen()s the plugin by file name, and the loader finds a file outside
# its built-in directories (/usr/local/lib on Debian) only through
# /etc/ld.so.cache: without ldconfig, NCCL_NET_PLUGIN=go (and the unset
# default, libnccl-net.so) fail with "cannot open shared object file" until
# something else runs it. An install into the live system by root refreshes the
# cache (as a package's ldconfig trigger would); one by another user says what
# is left to do; a staged one (DESTDIR) stays silent, since the cache to refresh
# is the target system's (packaging/test-install.sh checks it says nothing).
define LDCONFIG_AFTER
	@if [ -n "$(DESTDIR)" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && ldc=$$(PATH="$$PATH:/sbin:/usr/sbin" command -v ldconfig); then \
	  "$$ldc" && echo "ran ldconfig: the loader's cache is up to date"; \
	else echo "note: run ldconfig as root so that NCCL_NET_PLUGIN=go finds $(LIBDIR)/libnccl-net-go.so (or put $(LIBDIR) on LD_LIBRARY_PATH)"; fi
endef

install: $(SO) ## install libnccl-net-go.so and the libnccl-net.so link under $(LIBDIR) (then ldconfig, when root without DESTDIR)
	install -d $(DESTDIR)$(LIBDIR)
	install -m 0755 $(SO) $(DESTDIR)$(LIBDIR)/libnccl-net-go.so
	ln -sf libnccl-net-go.so $(DESTDIR)$(LIBDIR)/libnccl-net.so
	@echo "installed $(DESTDIR)$(LIBDIR)/libnccl-net-go.so (+ libnccl-net.so link)"
	$(LDCONFIG_AFTER)

# The same PREFIX, LIBDIR, BINDIR, LIBEXECDIR and DESTDIR as the install. The
# libnccl-net.so link is removed only while it still points at our library
# (another plugin may have taken the name since).
uninstall: ## remove what make install installed (same PREFIX/DESTDIR/...), without building anything
	rm -f $(DESTDIR)$(LIBDIR)/libnccl-net-go.so
	@if [ "$$(readlink $(DESTDIR)$(LIBDIR)/libnccl-net.so)" = libnccl-net-go.so ]; then \
	  echo "rm -f $(DESTDIR)$(LIBDIR)/libnccl-net.so"; rm -f $(DESTDIR)$(LIBDIR)/libnccl-net.so; \
	elif [ -e $(DESTDIR)$(LIBDIR)/libnccl-net.so ]; then \
	  echo "kept $(DESTDIR)$(LIBDIR)/libnccl-net.so: it is not our link"; fi
	$(LDCONFIG_AFTER)

# Every package's unit tests, once, under the race detector (go-vet is in lint.mk).
go-test: go-vet ## unit tests of every package with -race (all of them; several minutes)
	$(GO) test -race -count=1 ./...

# What make check runs: -short (tests that move a GiB or wait on purpose skip
# themselves, each saying so) and without the in-process nccltest suites
# (TestConformance: a few minutes under -race); the C conformance harness in
# make check covers that contract through the ABI, and go-test runs them all.
go-test-short: go-vet ## unit tests of every package with -race -short, minus the in-process TestConformance suites
	$(GO) test -race -short -count=1 -skip '^TestConformance$$' ./...

# The library must export the plugin tables and nothing else, and be marked
# NODELETE so NCCL's dlclose cannot unload the Go runtime.
abi-check: $(SO) $(SO_V9V10) ## the libraries export exactly the plugin tables, are NODELETE and keep their static TLS small
	scripts/abi-check.sh $(SO) ncclNetPlugin_v8 ncclNetPlugin_v9 ncclNetPlugin_v10 ncclNetPlugin_v11 ncclNetPlugin_v12
	scripts/abi-check.sh $(SO_V9V10) ncclNetPlugin_v9 ncclNetPlugin_v10

TEST_TARGETS += go-test abi-check
CHECK_TARGETS += go-test-short
APT_PACKAGES += $(BUILD_APT_PACKAGES)

# The glue's cost per message (handle lookup, request table, metrics counting)
# around a transport that does nothing, with metrics counting off and on in the
# same run: the off run is the baseline the ratio is against.
.PHONY: bench-plugin
bench-plugin: ## glue cost per isend+test, metrics off vs on
	@mkdir -p $(BUILD)
	$(GO) test -run '^$$' -bench 'IsendTest' -benchmem -count 5 ./plugin/ | tee $(BUILD)/bench-plugin.txt
	@awk '/IsendTest\/metrics=false/ { if (!off || $$3 < off) off = $$3 } \
	      /IsendTest\/metrics=true/  { if (!on || $$3 < on) on = $$3 } \
	      END { if (!off || !on) { print "bench-plugin: no results"; exit 1 } \
	            printf "isend+test through the glue, best of 5: metrics off %.1f ns, on %.1f ns: +%.1f ns per message, on/off = %.2f\n", off, on, on - off, on / off }' \
	  $(BUILD)/bench-plugin.txt

BENCH_TARGETS += bench-plugin
