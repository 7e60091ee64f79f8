#!/usr/bin/env bash
# Fails when a shared library needs a newer glibc than the machines it must load on.
#
#   e2e/check-glibc.sh [--floor X.Y] LIBRARY.so...
#
# The plugin is built on a Debian 12 development machine (glibc 2.36) and copied to
# GPU machines whose images may ship an older glibc; dlopen then fails there with
# "version `GLIBC_2.xx' not found", which NCCL only reports at INFO level and then
# silently falls back to its internal transports. This script reads the versioned
# symbol references (objdump -T) and compares the highest GLIBC_x.y with the floor.
#
# Floor: --floor, else $GLIBC_FLOOR, else 2.34 (the oldest glibc of the CUDA/PyTorch
# images we target: RHEL 9 / Rocky 9 ship 2.34, Ubuntu 22.04 2.35, 24.04 2.39).
# Exit status: 0 within the floor, 1 above it or unreadable, 2 usage.
set -euo pipefail

floor="${GLIBC_FLOOR:-2.34}"
libs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --floor) [ $# -ge 2 ] || { echo "check-glibc: --floor needs a value" >&2; exit 2; }; floor="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    -*) echo "check-glibc: unknown option $1" >&2; exit 2 ;;
    *) libs+=("$1"); shift ;;
  esac
done
if [ ${#libs[@]} -eq 0 ]; then
  echo "usage: $0 [--floor X.Y] LIBRARY.so..." >&2
  exit 2
fi
if ! [[ "$floor" =~ ^[0-9]+\.[0-9]+$ ]]; then
  echo "check-glibc: floor must look like 2.34, got '$floor'" >&2
  exit 2
fi
command -v objdump >/dev/null || { echo "check-glibc: objdump not found (Debian package binutils)" >&2; exit 1; }

# version_gt A B: true when dotted version A sorts after B.
version_gt() { [ "$1" != "$2" ] && [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | tail -n1)" = "$1" ]; }

status=0
for lib in "${libs[@]}"; do
  if [ ! -r "$lib" ]; then
    echo "check-glibc: FAIL $lib: not found or unreadable" >&2
    status=1; continue
  fi
  if ! dyn="$(objdump -T "$lib" 2>&1)"; then
    echo "check-glibc: FAIL $lib: objdump -T failed: $dyn" >&2
    status=1; continue
  fi
  # Only undefined (*UND*) references constrain the loader; the symbol version is
  # the GLIBC_x.y column, possibly in parentheses for hidden versions.
  versions="$(awk '/\*UND\*/' <<<"$dyn" | grep -oE 'GLIBC_[0-9]+(\.[0-9]+)+' | sed 's/^GLIBC_//' | sort -uV || true)"
  if [ -z "$versions" ]; then
    echo "check-glibc: FAIL $lib: no GLIBC_ symbol references found; is it a dynamically linked ELF library?" >&2
    status=1; continue
  fi
  max="$(tail -n1 <<<"$versions")"
  needed="$(objdump -p "$lib" | awk '$1 == "NEEDED" {print $2}' | paste -sd' ' -)"
  echo "check-glibc: $lib needs GLIBC $(paste -sd' ' - <<<"$versions") (max $max, floor $floor); NEEDED: ${needed:-none}"
  if version_gt "$max" "$floor"; then
    offenders="$(awk '/\*UND\*/' <<<"$dyn" | awk -v f="$floor" '
      match($0, /GLIBC_[0-9]+(\.[0-9]+)+/) {
        v = substr($0, RSTART + 6, RLENGTH - 6); split(v, a, "."); split(f, b, ".")
        if (a[1] + 0 > b[1] + 0 || (a[1] + 0 == b[1] + 0 && a[2] + 0 > b[2] + 0)) print "  " $NF "@GLIBC_" v
      }')"
    echo "check-glibc: FAIL $lib needs GLIBC_$max > floor $floor; it will not load on older systems. Symbols:" >&2
    echo "$offenders" >&2
    echo "check-glibc: build on an older distribution, or raise the floor with GLIBC_FLOOR=<x.y> if every target has it" >&2
    status=1
  fi
done
exit $status
