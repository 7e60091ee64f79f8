# Static checks, fast enough for every make check:
#   go-vet        go vet of every package
#   lint-gofmt    every Go file is gofmt'ed
#   lint-unsafe   the unsafe/cgo file rule of CONVENTIONS.md §1 (scripts/lint-unsafe);
#                 its fixture proves it still finds each kind of violation
#   lint-mod      go.mod and go.sum are tidy: a build never rewrites them
#   lint-staticcheck  staticcheck's default checks (dead code, unused results,
#                 values never read), pinned so that a new release cannot turn CI red
#   lint-scripts  (mk/scripts.mk) no early-exit reader in a pipefail pipeline
.PHONY: lint go-vet lint-gofmt lint-unsafe lint-mod lint-staticcheck
lint: go-vet lint-gofmt lint-unsafe lint-mod lint-staticcheck lint-scripts ## every static check: gofmt, go vet, unsafe file rule, tidy go.mod, staticcheck, pipefail scripts

go-vet: ## go vet ./...
	$(GO) vet ./...

lint-gofmt: ## every Go file is gofmt'ed
	@bad=$$(git ls-files --cached --others --exclude-standard '*.go' | xargs gofmt -l); \
	  if [ -n "$$bad" ]; then echo "lint-gofmt: run gofmt -w on:"; echo "$$bad"; exit 1; fi; \
	  echo "lint-gofmt: every Go file is formatted"

lint-unsafe: ## files importing unsafe are *_unsafe.go, cgo files *_cgo.go (CONVENTIONS.md §1)
	@$(GO) run ./scripts/lint-unsafe -allow scripts/lint-unsafe.allow
	@n=$$($(GO) run ./scripts/lint-unsafe scripts/testdata/unsafe-rule/*.go 2>/dev/null | grep -c ': imports\|: is named' || true); \
	  [ "$$n" = 4 ] || { echo "lint-unsafe: the fixture should give 4 findings, gave $$n"; exit 1; }

lint-mod: ## go.mod and go.sum are tidy (no build rewrites them)
	@$(GO) mod tidy -diff >/dev/null || { echo "lint-mod: go.mod/go.sum are not tidy; run go mod tidy and commit"; $(GO) mod tidy -diff; exit 1; }
	@echo "lint-mod: go.mod and go.sum are tidy"

# Built from the module proxy on first use (about a minute), then cached.
STATICCHECK_VERSION ?= v0.8.2
lint-staticcheck: ## staticcheck ./... (honnef.co/go/tools, pinned)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
	@echo "lint-staticcheck: no findings"

TEST_TARGETS += lint
CHECK_TARGETS += lint
