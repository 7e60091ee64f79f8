#!/usr/bin/env bash
# Builds the real-verbs Go test binaries that the Soft-RoCE lane runs in the guest:
# one `go test -c` binary per package under ./ib/... that has tests, named
# <dir with / replaced by ->.test in OUTDIR, plus <name>.dir holding the package's
# source directory (the lane runs each binary there, as go test would). OUTDIR is
# emptied first so a removed package cannot leave a stale binary behind. When
# there is no ./ib yet, OUTDIR/STATUS says so and the lane reports it as a skip.
#
# Usage: scripts/rdma/build-tests.sh OUTDIR    (GO, RDMA_GOTEST_FLAGS honoured)
set -euo pipefail
out=${1:?usage: build-tests.sh OUTDIR}
GO=${GO:-go}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
rm -rf "$out"
mkdir -p "$out"

if [ ! -d ib ] || [ -z "$(find ib -name '*.go' -print -quit)" ]; then
  msg="nothing ib-related was found: there is no ./ib package yet, so no real-verbs Go tests ran"
  echo "rdma-tests: $msg"
  echo "$msg" >"$out/STATUS"
  exit 0
fi
# -e: a package that does not compile must fail the lane, not vanish from it.
mapfile -t pkgs < <($GO list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.Dir}}{{end}}' ./ib/...)
if [ ${#pkgs[@]} -eq 0 ]; then
  msg="no package under ./ib/... has tests"
  echo "rdma-tests: $msg"
  echo "$msg" >"$out/STATUS"
  exit 0
fi
for dir in "${pkgs[@]}"; do
  rel=${dir#"$repo"/}
  name=${rel//\//-}
  echo "rdma-tests: go test -c ${RDMA_GOTEST_FLAGS:-} -o $out/$name.test ./$rel"
  # shellcheck disable=SC2086 # RDMA_GOTEST_FLAGS is a flag list, e.g. "-race"
  $GO test -c ${RDMA_GOTEST_FLAGS:-} -o "$out/$name.test" "./$rel"
  # A package whose tests are all external can still produce no binary.
  [ -f "$out/$name.test" ] && echo "$dir" >"$out/$name.dir"
done
