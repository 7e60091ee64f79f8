# Checks on the repository's own shell scripts.
#   make lint-scripts   no early-exit reader (head, grep -q, awk exit) in a pipefail
#                       pipeline; the fixture proves the check still finds them.
.PHONY: lint-scripts
lint-scripts: ## no early-exit reader in a pipefail pipeline (and the fixture still gets caught)
	@scripts/lint-pipes.sh
	@n=$$(scripts/lint-pipes.sh scripts/testdata/early-exit.sh 2>/dev/null | grep -c 'early-exit reader' || true); \
	  [ "$$n" = 3 ] || { echo "lint-scripts: the fixture should give 3 findings, gave $$n"; exit 1; }

TEST_TARGETS += lint-scripts
