#!/usr/bin/env bash
# Builds an NCCL net plugin shared library from a Go main package that imports
# github.com/libnccl-net-go/libnccl-net-go/plugin and registers its transport(s).
#
#   scripts/build-plugin.sh --name <NcclNetName> --out build/libnccl-net-<x>.so [--only-v9-v10] [--race] <go package>
#
# --name is what NCCL_NET matches (case-insensitively); the file name is what
# NCCL_NET_PLUGIN=<x> finds (libnccl-net-<x>.so). The library exports only the
# ncclNetPlugin_vN tables (plugin/exports.map).
# --race builds with the Go race detector, for tests only (make concurrent-race).
set -euo pipefail
name="Go"; out=""; only=""; pkg=""; race=()
while [ $# -gt 0 ]; do
  case "$1" in
    --name) name="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --only-v9-v10) only="-DNCCL_GO_ONLY_V9_V10"; shift ;;
    --race) race=(-race); shift ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    -*) echo "build-plugin: unknown option $1" >&2; exit 2 ;;
    *) pkg="$1"; shift ;;
  esac
done
if [ -z "$out" ] || [ -z "$pkg" ]; then
  echo "usage: $0 --name <NcclNetName> --out <file.so> [--only-v9-v10] <go package>" >&2
  exit 2
fi
case "$name" in *[!A-Za-z0-9_.+-]*|"") echo "build-plugin: --name must be [A-Za-z0-9_.+-]+" >&2; exit 2 ;; esac
root="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$(dirname "$out")"
export CGO_ENABLED=1
lib=$(basename "$out" .so)
case "$lib" in *[!A-Za-z0-9_.+-]*|"") echo "build-plugin: --out must name a file of [A-Za-z0-9_.+-]+ (libnccl-net-<x>.so)" >&2; exit 2 ;; esac
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -DNCCL_GO_PLUGIN_NAME=\"$name\" -DNCCL_GO_PLUGIN_LIB=\"$lib\" $only"
# -z nodelete: NCCL 2.28+ dlclose()s plugins; a Go runtime cannot be unloaded.
# --version-script: export only the plugin tables.
ldextra=""
if [ ${#race[@]} -gt 0 ]; then
  # The race runtime (ThreadSanitizer) maps shadow memory for the low
  # application addresses only; dlopen() puts a library near 0x7f..., where its
  # start-up fails ("ThreadSanitizer failed to allocate ... bytes"). Linking the
  # library's segments at a fixed low address keeps them inside that range.
  ldextra=" -Wl,-Ttext-segment=0x800000000"
fi
go build "${race[@]}" -buildmode=c-shared -trimpath \
  -ldflags "-s=false -extldflags '-Wl,-z,nodelete -Wl,--version-script=$root/plugin/exports.map$ldextra'" \
  -o "$out" "$pkg"
rm -f "${out%.so}.h"
echo "built $out (NCCL_NET name \"$name\"${only:+, v9/v10 tables only}${race:+, race detector})"
