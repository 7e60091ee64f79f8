#!/usr/bin/env bash
# Real NCCL through libnccl-net-go on one NVIDIA GPU (what `make e2e-gpu` runs).
#
#   e2e/run-gpu.sh [--plugin LIB.so] [--plugin-v9v10 LIB.so] [--out DIR] [-- suite options]
#
# Needs: an NVIDIA GPU with its driver, python3 with a CUDA build of PyTorch (its
# bundled NCCL is the NCCL under test). No Go toolchain: the libraries may be
# copied from the machine that built them. Defaults: build/libnccl-net-go.so,
# build/libnccl-net-go-v9v10.so, output in build/e2e. Settings through the
# environment: E2E_PYTHON (python3), E2E_IFNAME (lo), E2E_MAX_BYTES, E2E_DTYPES,
# E2E_BENCH_MIN/MAX/MIN_TIME, E2E_GO_TRANSPORT (socket), E2E_CUMEM, E2E_PHASE_TIMEOUT;
# see `python3 e2e/nccl_e2e.py suite --help` and docs/e2e-gpu.md.
#
# Exit status: 0 passed, 1 a check failed, 2 usage, 77 no GPU/torch here.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
plugin="$root/build/libnccl-net-go.so"
plugin_v9v10="$root/build/libnccl-net-go-v9v10.so"
out="${E2E_OUT:-$root/build/e2e}"
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --plugin) plugin="$2"; shift 2 ;;
    --plugin-v9v10) plugin_v9v10="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "run-gpu: unknown argument $1 (suite options go after --)" >&2; exit 2 ;;
  esac
done
py="${E2E_PYTHON:-python3}"
command -v "$py" >/dev/null || { echo "run-gpu: $py not found; set E2E_PYTHON to a python with PyTorch" >&2; exit 77; }

for lib in "$plugin" "$plugin_v9v10"; do
  if [ ! -f "$lib" ]; then
    echo "run-gpu: $lib is missing; build both libraries (make build/libnccl-net-go.so build/libnccl-net-go-v9v10.so)" \
         "or pass the copied ones with --plugin/--plugin-v9v10" >&2
    exit 2
  fi
done

# A library copied from the build machine must load here: NCCL only reports a
# failed dlopen at INFO and the run would then fail for a confusing reason.
local_glibc="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')"
if [ -n "$local_glibc" ]; then
  "$here/check-glibc.sh" --floor "$local_glibc" "$plugin" "$plugin_v9v10"
else
  echo "run-gpu: cannot tell this system's glibc version (not glibc?); skipping the symbol version check" >&2
fi

mkdir -p "$out"
set +e
"$py" "$here/nccl_e2e.py" suite --plugin "$(realpath "$plugin")" --plugin-v9v10 "$(realpath "$plugin_v9v10")" \
  --out "$out" "${extra[@]}" 2>&1 | tee "$out/suite.log"
rc=${PIPESTATUS[0]}
set -e
exit "$rc"
