#!/usr/bin/env bash
# Tries the template as a new vendor would: the steps of docs/extending.md,
# "Start from the template", run verbatim in a fresh module under build/, then
# a load check of the result as NCCL would load it (dlopen, ncclNetPlugin_v10,
# init, devices, getProperties). Exits non-zero at the first step that fails.
#
#   example/template/check.sh [loadcheck binary]
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
loadcheck="${1:-$repo/build/loadcheck}"
mkdir -p "$repo/build"
work="$(mktemp -d "$repo/build/template-check.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cd "$work"

# Step 1: copy the template into a new module of your own.
cp -r "$repo/example/template/myfabric" "$repo/example/template/cmd" .
go mod init example.com/myfabric
# Step 2: depend on libnccl-net-go (a local checkout, through replace).
go mod edit -require=github.com/libnccl-net-go/libnccl-net-go@v0.0.0 \
  -replace=github.com/libnccl-net-go/libnccl-net-go="$repo"
# Step 3: point the main package at your copy of the transport.
sed -i 's#github.com/libnccl-net-go/libnccl-net-go/example/template/myfabric#example.com/myfabric/myfabric#' \
  cmd/libnccl-net-myfabric/main.go
go mod tidy
go test ./...
# Step 4: build the plugin library.
bash "$repo/scripts/build-plugin.sh" --name MyFabric --out build/libnccl-net-myfabric.so ./cmd/libnccl-net-myfabric
# Step 5: check that it loads.
NCCL_DEBUG=INFO "$loadcheck" build/libnccl-net-myfabric.so 2>build/loadcheck.log || { cat build/loadcheck.log >&2; exit 1; }
cat build/loadcheck.log >&2
# The glue's own lines speak with the vendor's name and library, not ours.
grep -q '^loadcheck: plugin INFO (libnccl-net-myfabric): NET/MyFabric : libnccl-net-go ' build/loadcheck.log ||
  { echo "template-check: the glue's init line does not read 'NET/MyFabric : ...' from libnccl-net-myfabric" >&2; exit 1; }
if grep -q 'NET/Go :' build/loadcheck.log; then
  echo "template-check: a glue line still reads 'NET/Go :' in the vendor's library" >&2; exit 1
fi
nm -D --defined-only build/libnccl-net-myfabric.so | grep ' ncclNetPlugin_v12$' >/dev/null
echo "template-check: the template builds into a loadable plugin following docs/extending.md"
