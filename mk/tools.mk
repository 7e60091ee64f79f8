# Operator tooling (issue 13): the ncclnet-go command and its C selftest helper,
# the Grafana dashboard and Prometheus alerting rules (deploy/), and the Debian
# package (packaging/). docs/operations.md describes all of it.
#
#   make                   also builds build/ncclnet-go and build/ncclnet-go-selftest
#   make install           also installs them ($(BINDIR), $(LIBEXECDIR)/ncclnet-go)
#   make uninstall         removes them again (same PREFIX, DESTDIR, ...)
#   make test-install      install and uninstall into a staging DESTDIR
#   make deb               build/libnccl-net-go_<version>_amd64.deb
#   make test-tools        the command's and internal/diag's tests, promtool on deploy/
#   make test-deb          lintian, then dpkg -i, ncclnet-go selftest on the installed
#                          library, dpkg -r; leaves the machine as it was
NCCLNET_VERSION := $(shell sed -n 's/^var Version = "\(.*\)"/\1/p' plugin/version.go)
TOOLS_CMD := $(BUILD)/ncclnet-go
TOOLS_HELPER := $(BUILD)/ncclnet-go-selftest
# The helper reuses the conformance harness's loader, process pair and
# connection set-up; its own main is cmd/ncclnet-go/helper/selftest.c.
TOOLS_HELPER_SRCS := cmd/ncclnet-go/helper/selftest.c $(addprefix harness/,util.c netapi.c proc.c link.c)
TOOLS_CFLAGS ?= -std=c11 -O2 -g -Wall -Wextra -Werror -D_FORTIFY_SOURCE=2 -fstack-protector-strong -fPIE
TOOLS_LDFLAGS ?= -pie -Wl,-z,relro -Wl,-z,now
BINDIR ?= $(PREFIX)/bin
LIBEXECDIR ?= $(PREFIX)/libexec
DEB := $(BUILD)/libnccl-net-go_$(NCCLNET_VERSION)_amd64.deb
.PHONY: tools test-tools test-deploy deb test-deb test-install install-tools uninstall-tools
all: tools
tools: $(TOOLS_CMD) $(TOOLS_HELPER) ## build build/ncclnet-go and its selftest helper (part of make)

# PIE, full RELRO, and the plugin's version, so that `ncclnet-go --version` and the
# library's init line agree.
$(TOOLS_CMD): $(GO_SOURCES) mk/tools.mk | deps-build
	@mkdir -p $(dir $@)
	CGO_ENABLED=1 CGO_CFLAGS="$${CGO_CFLAGS:--O2 -g} -D_FORTIFY_SOURCE=2 -fstack-protector-strong" $(GO) build -trimpath -buildmode=pie \
		-ldflags "-X main.version=$(NCCLNET_VERSION) -extldflags '-Wl,-z,relro -Wl,-z,now'" -o $@ ./cmd/ncclnet-go

$(TOOLS_HELPER): $(TOOLS_HELPER_SRCS) $(HARNESS_HDRS) mk/tools.mk
	@mkdir -p $(dir $@)
	$(CC) $(TOOLS_CFLAGS) -Iharness -Inccl/include -pthread -o $@ $(TOOLS_HELPER_SRCS) $(TOOLS_LDFLAGS) -ldl

# `make install` (mk/plugin.mk) installs the library; this adds the command.
install: install-tools
install-tools: $(TOOLS_CMD) $(TOOLS_HELPER)
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBEXECDIR)/ncclnet-go
	install -m 0755 $(TOOLS_CMD) $(DESTDIR)$(BINDIR)/ncclnet-go
	install -m 0755 $(TOOLS_HELPER) $(DESTDIR)$(LIBEXECDIR)/ncclnet-go/ncclnet-go-selftest
	@echo "installed $(DESTDIR)$(BINDIR)/ncclnet-go (+ $(LIBEXECDIR)/ncclnet-go/ncclnet-go-selftest)"

uninstall: uninstall-tools
uninstall-tools:
	rm -f $(DESTDIR)$(BINDIR)/ncclnet-go $(DESTDIR)$(LIBEXECDIR)/ncclnet-go/ncclnet-go-selftest
	@! [ -d $(DESTDIR)$(LIBEXECDIR)/ncclnet-go ] || rmdir --ignore-fail-on-non-empty $(DESTDIR)$(LIBEXECDIR)/ncclnet-go

# The command's tests use the library and the helper built here (they build
# their own when run by plain `go test`).
test-tools: $(SO) $(TOOLS_HELPER) test-deploy ## ncclnet-go's and internal/diag's tests (-race) with the built library and helper, and test-deploy
	$(GO) vet ./cmd/ncclnet-go/ ./internal/diag/
	$(HARNESS_ENV) NCCLNET_GO_TEST_PLUGIN=$(abspath $(SO)) NCCLNET_GO_TEST_HELPER=$(abspath $(TOOLS_HELPER)) \
		$(GO) test -race -count=1 ./cmd/ncclnet-go/ ./internal/diag/

# The alerting rules: syntax, and their unit tests (promtool test rules). The
# dashboard's and the rules' expressions are evaluated against a live plugin by
# test-prometheus (scripts/metrics/prometheus-e2e.sh).
test-deploy: ## promtool check and test of the alerting rules, static checks of the Grafana dashboard
	promtool check rules deploy/prometheus/ncclnet-alerts.yml
	promtool test rules deploy/prometheus/ncclnet-alerts.test.yml
	deploy/check-dashboard.sh deploy/grafana/ncclnet-go.json

deb: $(DEB) ## build/libnccl-net-go_<version>_amd64.deb (docs/operations.md)
$(DEB): $(SO) $(TOOLS_CMD) $(TOOLS_HELPER) $(wildcard packaging/* packaging/*/*) $(wildcard deploy/*/*) README.md $(wildcard docs/*.md)
	packaging/build-deb.sh --version $(NCCLNET_VERSION) --lib $(SO) --cmd $(TOOLS_CMD) --helper $(TOOLS_HELPER) --out $@

test-install: $(SO) $(TOOLS_CMD) $(TOOLS_HELPER) ## make install and make uninstall into a staging DESTDIR: every file where it belongs, and gone again
	packaging/test-install.sh $(NCCLNET_VERSION)

test-deb: $(DEB) ## lintian, dpkg -i, the installed selftest, dpkg --purge (leaves the machine as it was)
	$(HARNESS_ENV) packaging/test-deb.sh $(DEB)

TEST_TARGETS += test-tools test-install test-deb
CHECK_TARGETS += test-deploy
# promtool comes with prometheus (mk/metrics.mk); lintian checks the package,
# dpkg-dev computes its dependencies (dpkg-shlibdeps).
APT_PACKAGES += prometheus lintian dpkg-dev jq

# test-prometheus (mk/metrics.mk) also checks the dashboard and the alerting
# rules against a live plugin, with the command and the helper built here.
test-prometheus: $(TOOLS_CMD) $(TOOLS_HELPER)
# The Soft-RoCE lane runs ncclnet-go devices and selftest over rxe0
# (scripts/rdma/lane.sh).
test-rdma: $(TOOLS_CMD) $(TOOLS_HELPER)
