#!/usr/bin/env bash
# abi-check.sh LIB SYMBOL...: LIB's dynamic symbol table defines exactly the
# given data symbols (plus nothing else global), and LIB is NODELETE.
set -euo pipefail
lib="$1"; shift
want=$(printf '%s\n' "$@" | sort)
have=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[A-Z]$/ {print $3}' | sort)
if [ "$have" != "$want" ]; then
  echo "abi-check: $lib exports unexpected symbols:"; diff <(echo "$want") <(echo "$have") || true
  exit 1
fi
for s in "$@"; do
  nm -D --defined-only "$lib" | grep " [DdBb] $s\$" >/dev/null || { echo "abi-check: $s is not a data symbol in $lib"; exit 1; }
done
readelf -d "$lib" | grep 'NODELETE' >/dev/null || { echo "abi-check: $lib is not linked -z nodelete"; exit 1; }
echo "abi-check: $lib exports exactly: $*; NODELETE set"
