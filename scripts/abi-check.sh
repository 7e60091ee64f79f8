#!/usr/bin/env bash
# abi-check.sh LIB SYMBOL...: LIB's dynamic symbol table defines exactly the
# given data symbols (plus nothing else global), LIB is NODELETE, and its
# static TLS stays small.
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
# NCCL dlopens the library late, into a process whose other libraries may
# have used most of glibc's surplus static TLS; a module with initial-exec
# TLS that does not fit fails with "cannot allocate memory in static TLS
# block" (docs/troubleshooting.md). The Go runtime's g slot is 8 bytes; a
# __thread or C dependency that grows it must be a deliberate choice.
tls=$(readelf -lW "$lib" | awk '$1 == "TLS" {print $6}')
if [ -n "$tls" ] && (( tls > 64 )); then
  echo "abi-check: $lib has $((tls)) bytes of static TLS (at most 64 expected)"; exit 1
fi
echo "abi-check: $lib exports exactly: $*; NODELETE set; static TLS $((${tls:-0})) bytes"
