#!/usr/bin/env bash
# Checks everything of the GPU end-to-end test that can be checked without a GPU
# (part of `make test`, target e2e-selftest):
#   1. shellcheck of e2e/*.sh, py_compile and pyflakes of e2e/*.py
#   2. the Python unit tests (size ladders, busbw formulas, NCCL version and
#      plugin environment, log checks on NCCL-format excerpts, the exit-77 path)
#   3. a dry run of the whole suite with gloo on CPU instead of NCCL (the rank
#      spawning, every collective, the CPU-side expected values, the bandwidth
#      table), then the same with a corrupted result, which must fail
#   4. the kill check (nccl_e2e.py kill) with gloo: a killed peer is noticed, and a
#      forked child of the dead rank that keeps its sockets is caught as a hang
#   5. run-gpu.sh on this GPU-less machine: it must stop with status 77
#   6. gpu-round.sh (the device session's one command) on this machine: every
#      step reports a verdict, the e2e step says it cannot run here, the harness
#      step runs, and the round packs its output
# Steps 3-5 need PyTorch (Debian: python3-torch); without it they are skipped
# with the reason printed, as is step 6 without the harness next to the plugin.
# E2E_STRICT=1 turns those skips into failures.
#
#   e2e/selftest.sh [--plugin LIB.so --plugin-v9v10 LIB.so]
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
plugin=""; plugin_v9v10=""
while [ $# -gt 0 ]; do
  case "$1" in
    --plugin) plugin="$2"; shift 2 ;;
    --plugin-v9v10) plugin_v9v10="$2"; shift 2 ;;
    *) echo "selftest: unknown argument $1" >&2; exit 2 ;;
  esac
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

skip() {
  echo "e2e-selftest: SKIP $*"
  if [ "${E2E_STRICT:-0}" = 1 ]; then echo "e2e-selftest: E2E_STRICT=1 forbids skips" >&2; exit 1; fi
}

# Which python has torch: E2E_PYTHON, else python3, else Debian's own python3
# (a pyenv or venv python3 earlier on PATH does not see python3-torch).
has_torch() { "$1" -c 'import torch, torch.distributed' >/dev/null 2>&1; }
py="${E2E_PYTHON:-}"
if [ -z "$py" ]; then
  for cand in python3 /usr/bin/python3; do
    if command -v "$cand" >/dev/null && has_torch "$cand"; then py="$cand"; break; fi
  done
fi
torch_py=""
if [ -n "$py" ] && has_torch "$py"; then torch_py="$py"; fi
py="${py:-python3}"

echo "e2e-selftest: shellcheck"
command -v shellcheck >/dev/null || { echo "e2e-selftest: shellcheck missing (make deps installs it)" >&2; exit 1; }
shellcheck "$here"/*.sh

echo "e2e-selftest: py_compile"
"$py" -m py_compile "$here"/*.py
# py_compile leaves __pycache__ in the source tree; keep it out of git status.
rm -rf "$here/__pycache__"

# pyflakes finds undefined names in the NCCL-only branches, which no run here
# reaches. Debian's module is installed for /usr/bin/python3.
flakes=""
for cand in "$py" /usr/bin/python3; do
  if "$cand" -m pyflakes --version >/dev/null 2>&1; then flakes="$cand"; break; fi
done
if [ -n "$flakes" ]; then
  echo "e2e-selftest: pyflakes"
  "$flakes" -m pyflakes "$here"/*.py
else
  skip "pyflakes: no python3 here has it (install python3-pyflakes)"
fi

echo "e2e-selftest: unit tests ($("$py" --version 2>&1))"
PYTHONDONTWRITEBYTECODE=1 "$py" -m unittest discover -s "$here" -p 'test_*.py'

gpu_round_check() {
  local dir round
  dir="$(dirname "$plugin")" round="$work/round"
  if "$here/gpu-round.sh" --build "$dir" --out "$round" --budget 150 >"$work/round.out" 2>&1; then :; else
    cat "$work/round.out"; echo "e2e-selftest: FAIL gpu-round.sh exited $?" >&2; exit 1
  fi
  for s in facts rxe kill e2e harness; do
    grep -Eq "^gpu-round:    $s: (ok|cannot run on this host)" "$round/round.txt" ||
      { cat "$round/round.txt"; echo "e2e-selftest: FAIL gpu-round.sh gave step $s no verdict" >&2; exit 1; }
  done
  if ! grep -q "^gpu-round:    e2e: cannot run on this host (exit 77)" "$round/round.txt" ||
     ! grep -q "^gpu-round:    kill: cannot run on this host (exit 77)" "$round/round.txt" ||
     ! grep -q "^summary" "$round/harness.txt" || ! tar tzf "$round/round.tgz" | grep 'harness.log' >/dev/null; then
    cat "$round/round.txt"; echo "e2e-selftest: FAIL gpu-round.sh's output is incomplete" >&2; exit 1
  fi
  # --limit: 0 skips a step and says so; a step it does not know is a usage error.
  "$here/gpu-round.sh" --build "$dir" --out "$work/round0" --budget 60 --limit kill=0 --limit e2e=0 \
    --limit harness=0 --limit rxe=20 >"$work/round0.out" 2>&1
  if ! grep -q "^gpu-round: SKIPPED e2e: --limit e2e=0" "$work/round0.out" ||
     ! grep -q "^gpu-round: == rxe (at most 20s)" "$work/round0.out" ||
     grep -q "^gpu-round: == harness" "$work/round0.out"; then
    cat "$work/round0.out"; echo "e2e-selftest: FAIL gpu-round.sh --limit did not set the steps' limits" >&2; exit 1
  fi
  if "$here/gpu-round.sh" --limit nosuch=5 >/dev/null 2>&1; [ $? -ne 2 ]; then
    echo "e2e-selftest: FAIL gpu-round.sh --limit nosuch=5 was not a usage error" >&2; exit 1
  fi
}
if [ -n "$plugin" ] && [ -n "$plugin_v9v10" ] && [ -x "$(dirname "$plugin")/ncclnet-harness" ] &&
   [ "$(dirname "$plugin")" = "$(dirname "$plugin_v9v10")" ]; then
  if [ -n "$torch_py" ] && "$torch_py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    skip "gpu-round.sh check: this machine has a CUDA GPU; run e2e/gpu-round.sh itself"
  else
    echo "e2e-selftest: gpu-round.sh on this machine (no GPU): every step reports, the output is packed"
    gpu_round_check
  fi
else
  skip "gpu-round.sh check: needs --plugin and --plugin-v9v10 in one directory with ncclnet-harness beside them"
fi

if [ -z "$torch_py" ]; then
  skip "gloo dry run and run-gpu.sh exit-77 check: no python3 here imports torch (install python3-torch)"
  exit 0
fi

small=(--max-bytes 65536 --bench-min 1024 --bench-max 262144 --bench-budget 8388608 --bench-min-time 0.02)
echo "e2e-selftest: gloo dry run of the suite"
if ! PYTHONDONTWRITEBYTECODE=1 "$torch_py" "$here/nccl_e2e.py" suite --backend gloo --out "$work/dry" "${small[@]}" \
    >"$work/dry.out" 2>&1; then
  cat "$work/dry.out"; echo "e2e-selftest: FAIL the gloo dry run failed" >&2; exit 1
fi
grep -q "| check-full | - | - | - | [1-9][0-9]* | passed |" "$work/dry/results.md" ||
  { cat "$work/dry/results.md"; echo "e2e-selftest: FAIL results.md lacks the passed correctness row" >&2; exit 1; }
for op in all_reduce all_gather reduce_scatter broadcast sendrecv; do
  grep -q "^#### $op" "$work/dry/results.md" ||
    { echo "e2e-selftest: FAIL results.md has no $op bandwidth table" >&2; exit 1; }
done

echo "e2e-selftest: gloo dry run of alternating bandwidth runs on chosen collectives, with a variant arm"
if ! PYTHONDONTWRITEBYTECODE=1 "$torch_py" "$here/nccl_e2e.py" suite --backend gloo --out "$work/runs" --skip-check \
    --bench-runs 2 --bench-ops sendrecv,broadcast --bench-min 1024 --bench-max 4096 --bench-budget 1048576 --bench-min-time 0.02 \
    --bench-variant share0:NCCL_GO_SOCKET_SHARE_AFTER=0 >"$work/runs.out" 2>&1; then
  cat "$work/runs.out"; echo "e2e-selftest: FAIL the --bench-runs dry run failed" >&2; exit 1
fi
for ph in bench-go-1 bench-go-share0-1 bench-socket-1 bench-go-2 bench-go-share0-2 bench-socket-2; do
  grep -q "| $ph | .* | passed |" "$work/runs/results.md" ||
    { cat "$work/runs/results.md"; echo "e2e-selftest: FAIL results.md lacks phase $ph" >&2; exit 1; }
done
if ! grep -Eq '^\| 4 KiB( \| [0-9.]+){4} \| [0-9.]+ [0-9.]+ \|$' "$work/runs/results.md" ||
   ! grep -q '^#### broadcast' "$work/runs/results.md" || ! grep -q '^#### sendrecv' "$work/runs/results.md" ||
   grep -q '^#### all_reduce' "$work/runs/results.md"; then
  cat "$work/runs/results.md"; echo "e2e-selftest: FAIL the per-run table is not as --bench-runs 2 --bench-ops give" >&2; exit 1
fi
# The variant's two comparisons, each with a table per collective: against Socket and
# against the plugin as shipped; and its phases in the order that pairs them by round.
if ! grep -q '^### The variant: Go share0 is NCCL_NET=Go with NCCL_GO_SOCKET_SHARE_AFTER=0' "$work/runs/results.md" ||
   [ "$(grep -c '^| size | Go share0 busbw median (GB/s) | Socket busbw median' "$work/runs/results.md")" != 2 ] ||
   [ "$(grep -c '^| size | Go busbw median (GB/s) | Go share0 busbw median' "$work/runs/results.md")" != 2 ] ||
   [ "$(grep -o '^== bench-[a-z0-9-]*' "$work/runs.out" | tr '\n' ' ')" != \
     "== bench-go-1 == bench-go-share0-1 == bench-socket-1 == bench-go-2 == bench-go-share0-2 == bench-socket-2 " ]; then
  cat "$work/runs.out" "$work/runs/results.md"; echo "e2e-selftest: FAIL --bench-variant gave no variant tables or runs out of order" >&2; exit 1
fi
if PYTHONDONTWRITEBYTECODE=1 "$torch_py" "$here/nccl_e2e.py" suite --backend gloo --out "$work/badvar" --skip-check \
    --bench-variant 'x:NCCL_NET=Socket' >"$work/badvar.out" 2>&1 || [ $? -ne 2 ] ||
   ! grep -q "set by the suite itself" "$work/badvar.out"; then
  cat "$work/badvar.out"; echo "e2e-selftest: FAIL a variant that names a suite variable is not a usage error" >&2; exit 1
fi

# The kill check with gloo standing in for a transport: gloo fails a receive whose
# peer was killed (the connection closes), and, like any transport that leaves its
# sockets open in forked children, hangs when the dead rank left a child behind. So
# one run shows both verdicts: the arm without a child passes, the arm with one must
# be reported as a hang and fail the run.
echo "e2e-selftest: gloo dry run of the kill check: a dead peer noticed, and the hang a forked child causes caught"
set +e
PYTHONDONTWRITEBYTECODE=1 "$torch_py" "$here/nccl_e2e.py" kill --backend gloo --out "$work/kill" \
  --arms go:1,go-fork:1 --cap 5 >"$work/kill.out" 2>&1
rc=$?
set -e
if [ $rc -ne 1 ] || ! grep -Eq '^   kill-go-1: error after [0-9.]+ s.*; destroy_process_group returned after [0-9.]+ s' "$work/kill.out" ||
   ! grep -q '^   kill-go-fork-1: HANG: still pending 5 s after the kill; child alive at the kill: yes' "$work/kill.out" ||
   ! grep -q '^| go-fork | Go | yes | 1 | hang | - | - |$' "$work/kill/kill.md" ||
   ! grep -q 'FAIL kill-go-fork-1: HANG' "$work/kill.out"; then
  cat "$work/kill.out"; echo "e2e-selftest: FAIL the kill check did not tell a noticed death from a hang (exit $rc)" >&2; exit 1
fi

echo "e2e-selftest: a corrupted all_gather result must fail the suite"
set +e
PYTHONDONTWRITEBYTECODE=1 "$torch_py" "$here/nccl_e2e.py" suite --backend gloo --out "$work/bad" --skip-bench \
  --max-bytes 1024 --corrupt all_gather >"$work/bad.out" 2>&1
rc=$?
set -e
if [ $rc -ne 1 ] || ! grep -q "FAIL all_gather" "$work/bad.out"; then
  cat "$work/bad.out"; echo "e2e-selftest: FAIL corruption went unnoticed (exit $rc)" >&2; exit 1
fi

if "$torch_py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  skip "run-gpu.sh exit-77 check: this machine has a CUDA GPU; run make e2e-gpu instead"
elif [ -z "$plugin" ] || [ -z "$plugin_v9v10" ]; then
  skip "run-gpu.sh exit-77 check: no --plugin/--plugin-v9v10 given"
else
  echo "e2e-selftest: run-gpu.sh without a GPU must exit 77"
  set +e
  E2E_PYTHON="$torch_py" "$here/run-gpu.sh" --plugin "$plugin" --plugin-v9v10 "$plugin_v9v10" --out "$work/gpu" \
    >"$work/gpu.out" 2>&1
  rc=$?
  set -e
  if [ $rc -ne 77 ] || ! grep -q "sees no CUDA GPU" "$work/gpu.out"; then
    cat "$work/gpu.out"; echo "e2e-selftest: FAIL run-gpu.sh exited $rc, want 77 with a reason" >&2; exit 1
  fi
fi
echo "e2e-selftest: passed"
