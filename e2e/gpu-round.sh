#!/usr/bin/env bash
# Everything a device session checks on the GPU host, in one bounded run: a device
# session has minutes, one command and no second chance, so each step has its own
# time limit, the round as a whole stays inside --budget, and what a step printed is
# kept even when a later step is cut short (docs/e2e-gpu.md, "One round on the GPU host").
#
#   e2e/gpu-round.sh [--build DIR] [--out DIR] [--budget SEC] [--debs DIR] [--limit STEP=SEC]...
#
# 1. facts: kernel, CPUs, GPU, torch and its NCCL, what the kernel offers for rdma_rxe;
# 2. rxe: e2e/rxe-probe.sh (ib transport next to ib_write_bw over Soft-RoCE, natively);
#    with --debs, rdma-core / perftest / iproute2 packages are installed first where the
#    kernel has rdma_rxe but user space lacks them (never over files already there);
# 3. kill: real NCCL, a rank SIGKILLed while its peer's receive is pending, with and
#    without a forked child of the dying rank outliving it (nccl_e2e.py kill): our
#    plugin must fail the receive; NCCL's Socket transport is run beside it as the
#    baseline;
# 4. e2e: real NCCL through the plugin (e2e/run-gpu.sh): the correctness suite on both
#    libraries up to E2E_MAX_BYTES (default here 4 MiB), then E2E_BENCH_RUNS (5)
#    alternating runs of Go and NCCL Socket bandwidth for E2E_BENCH_OPS (broadcast,sendrecv)
#    from 64 KiB to 64 MiB; E2E_BENCH_VARIANT=NAME:VAR=VALUE,... adds a third arm
#    between them, the plugin with those settings (an A/B of a default inside the
#    round; none by default since 2026-11-27, when the last open one was settled);
# 5. harness: ncclnet-harness bench all (the plugin next to plain TCP, NCCL-style loop)
#    on this host's cores.
# DIR (--build, default build/) holds libnccl-net-go.so, libnccl-net-go-v9v10.so,
# ncclnet-harness, ncclnet-go and ncclnet-go-selftest. The output, --out (default
# build/gpu-round): round.txt (the summary), results.md (the e2e report), kill.md,
# harness.txt, rxe-probe.txt, and round.tgz with every log.
# --limit STEP=SEC replaces a step's own limit (facts 20, rxe 90, kill 180, e2e 300,
# harness 90); 0 skips the step. The e2e step with E2E_BENCH_VARIANT runs 15 bandwidth
# phases of at least 0.25 s per size each (192 s on 2026-11-28), close enough to 300 s
# that a round with a variant raises it.
# Exit status: 0 every step that ran passed, 1 a step failed or was cut short.
set -uo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="$root/build" out="" budget=450 debs=""
declare -A limits=([facts]=20 [rxe]=90 [kill]=180 [e2e]=300 [harness]=90)
self="$here/$(basename "$0")"
while [ $# -gt 0 ]; do
  case "$1" in
    # One step, run by the round itself under timeout(1), which cannot run a shell
    # function: the settings come through the environment.
    --step) build="$GPU_ROUND_BUILD" work="$GPU_ROUND_WORK" debs="$GPU_ROUND_DEBS" step_name="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    --debs) debs="$2"; shift 2 ;;
    --limit)
      [[ ${2:-} =~ ^([a-z0-9]+)=([0-9]+)$ && -n ${limits[${BASH_REMATCH[1]}]:-} ]] ||
        { echo "gpu-round: --limit takes STEP=SEC, STEP one of ${!limits[*]}" >&2; exit 2; }
      limits[${BASH_REMATCH[1]}]=$((10#${BASH_REMATCH[2]})); shift 2 ;;
    -h|--help) sed -n '2,/^# Exit status/p' "$0"; exit 0 ;;
    *) echo "gpu-round: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ $budget =~ ^[0-9]+$ ]] || { echo "gpu-round: --budget takes seconds" >&2; exit 2; }
build="$(cd "$build" && pwd)" || exit 2

facts() {
  echo "date: $(date -u +%FT%TZ)"
  echo "kernel: $(uname -r) ($(uname -v))"
  echo "cpus: $(nproc), $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
  echo "memory: $(awk '/^MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
  echo "os: $(sed -n 's/^PRETTY_NAME=//p' /etc/os-release 2>/dev/null | tr -d '"'), $(getconf GNU_LIBC_VERSION 2>/dev/null)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
  python3 -c 'import torch; print("torch:", torch.__version__, "cuda", torch.version.cuda, "nccl", ".".join(map(str, torch.cuda.nccl.version())))' 2>&1
  echo "modules: /lib/modules/$(uname -r) $([ -d "/lib/modules/$(uname -r)" ] && echo present || echo absent)"
  echo "rdma_rxe: loaded=$([ -d /sys/module/rdma_rxe ] && echo yes || echo no) modinfo=$(modinfo -F filename rdma_rxe 2>&1 | sed -n 1p)"
  if [ -r /proc/config.gz ]; then
    echo "config: $(zcat /proc/config.gz | grep -E '^(# )?CONFIG_(RDMA_RXE|INFINIBAND|MODULES)[ =]' | tr '\n' ' ')"
  else
    echo "config: no /proc/config.gz"
  fi
  echo "infiniband class: $(find /sys/class/infiniband -mindepth 1 -maxdepth 1 -printf '%f ' 2>/dev/null)"
  echo "tools: ip=$(command -v ip || echo none) rdma=$(command -v rdma || echo none) ib_write_bw=$(command -v ib_write_bw || echo none)"
  echo "libibverbs: $(ldconfig -p 2>/dev/null | grep -c 'libibverbs\.so\.1 ') in ldconfig"
}

# rxe_userspace: where the kernel has rdma_rxe and --debs is given, install what
# user space lacks. Libraries and the provider go into the system's paths only where
# absent (rxe-probe and libibverbs look there); the tools go to /usr/local/bin.
rxe_userspace() {
  if [ ! -d /sys/module/rdma_rxe ] && ! modinfo rdma_rxe >/dev/null 2>&1; then
    echo "no rdma_rxe for this kernel: nothing to install"
    return 0
  fi
  [ -n "$debs" ] || { echo "no --debs: user space as found"; return 0; }
  local root=/opt/gpu-round-rdma lib=/usr/lib/x86_64-linux-gnu f
  mkdir -p "$root"
  for f in "$debs"/*.deb; do dpkg -x "$f" "$root"; done
  if ! ldconfig -p | grep 'libibverbs\.so\.1 ' >/dev/null; then
    mkdir -p "$lib" /etc/libibverbs.d
    cp -an "$root$lib"/. "$lib"/
    cp -an "$root/etc/libibverbs.d"/. /etc/libibverbs.d/
    echo "installed libibverbs, its providers and libraries from $debs"
  fi
  for f in "$root"/usr/bin/ib_* "$root"/bin/ip "$root"/sbin/ip "$root"/usr/bin/ip "$root"/usr/bin/rdma "$root"/sbin/rdma; do
    [ -e "$f" ] || continue
    command -v "${f##*/}" >/dev/null && continue
    # iproute2's tools need libraries (libmnl, libbpf, ...) the host may lack: run them
    # through a wrapper that finds them under $root only.
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$root$lib:$root/lib/x86_64-linux-gnu" "$f" >"/usr/local/bin/${f##*/}"
    chmod +x "/usr/local/bin/${f##*/}"
    echo "installed ${f##*/} (wrapper for $f)"
  done
  ldconfig
}

rxe() {
  rxe_userspace
  "$here/rxe-probe.sh" --build "$build" --out "$work/rxe" --rounds 3
}

e2e() {
  E2E_MAX_BYTES="${E2E_MAX_BYTES:-4194304}" E2E_BENCH_MIN="${E2E_BENCH_MIN:-65536}" \
  E2E_BENCH_MAX="${E2E_BENCH_MAX:-67108864}" E2E_BENCH_BUDGET="${E2E_BENCH_BUDGET:-1073741824}" \
  E2E_BENCH_OPS="${E2E_BENCH_OPS:-broadcast,sendrecv}" E2E_BENCH_RUNS="${E2E_BENCH_RUNS:-5}" \
  E2E_PHASE_TIMEOUT="${E2E_PHASE_TIMEOUT:-120}" \
  E2E_BENCH_VARIANT="${E2E_BENCH_VARIANT-}" \
    "$here/run-gpu.sh" --plugin "$build/libnccl-net-go.so" --plugin-v9v10 "$build/libnccl-net-go-v9v10.so" \
    --out "$work/e2e"
}

kill_check() {
  "${E2E_PYTHON:-python3}" "$here/nccl_e2e.py" kill --plugin "$build/libnccl-net-go.so" --out "$work/kill"
}

harness() {
  NCCL_SOCKET_IFNAME=lo "$build/ncclnet-harness" bench --plugin "$build/libnccl-net-go.so" --verbose all
}

if [ -n "${step_name:-}" ]; then
  case $step_name in
    facts) facts ;;
    rxe) rxe ;;
    e2e) e2e ;;
    kill) kill_check ;;
    harness) harness ;;
    *) echo "gpu-round: no step $step_name" >&2; exit 2 ;;
  esac
  exit
fi

out="${out:-$root/build/gpu-round}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="$(mktemp -d /tmp/gpu-round.XXXXXX)"
export GPU_ROUND_BUILD="$build" GPU_ROUND_WORK="$work" GPU_ROUND_DEBS="$debs"
summary="$work/round.txt"
start=$(date +%s)
failed=0

say() { echo "gpu-round: $*" | tee -a "$summary"; }
left() { echo $((budget - ($(date +%s) - start))); }

# Packs what there is, whenever the round ends: a step cut short still leaves its logs.
# shellcheck disable=SC2317 # runs from the EXIT trap
pack() {
  say "round over after $(($(date +%s) - start))s; $([ "$failed" = 0 ] && echo 'every step that ran passed' || echo 'some steps failed (above)')"
  cp "$summary" "$out/round.txt"
  [ -f "$work/e2e/results.md" ] && cp "$work/e2e/results.md" "$out/results.md"
  [ -f "$work/kill/kill.md" ] && cp "$work/kill/kill.md" "$out/kill.md"
  [ -f "$work/harness.log" ] && cp "$work/harness.log" "$out/harness.txt"
  [ -f "$work/rxe/rxe-probe.txt" ] && cp "$work/rxe/rxe-probe.txt" "$out/rxe-probe.txt"
  tar czf "$out/round.tgz" -C "$work" . 2>/dev/null
}
trap pack EXIT

# step NAME LIMIT: the step under min(LIMIT, what the budget has left less a margin
# for packing), output in $work/NAME.log. Exit 77 (cannot run here) is a result, not a
# failure.
step() {
  local name=$1 limit=${limits[$1]} avail rc t pid dog
  if [ "$limit" = 0 ]; then
    say "SKIPPED $name: --limit $name=0"
    return 0
  fi
  avail=$(($(left) - 10))
  [ "$limit" -le "$avail" ] || limit=$avail
  if [ "$avail" -lt 15 ]; then
    say "SKIPPED $name: ${avail}s of the round's budget left"
    failed=1
    return 0
  fi
  say "== $name (at most ${limit}s)"
  t=$(date +%s)
  # Its own session, so that the limit ends everything the step started (the
  # harness's ranks, NCCL's), not only its shell: leftovers would run on beside the
  # next step's measurements.
  setsid "$self" --step "$name" >"$work/$name.log" 2>&1 &
  pid=$!
  (sleep "$limit"; touch "$work/$name.cut"; kill -TERM -- "-$pid"; sleep 5; kill -KILL -- "-$pid") 2>/dev/null &
  dog=$!
  wait "$pid"
  rc=$?
  kill "$dog" 2>/dev/null
  kill -KILL -- "-$pid" 2>/dev/null
  if [ -e "$work/$name.cut" ]; then
    say "   $name: CUT SHORT at its ${limit}s limit"
    failed=1
    return 0
  fi
  case $rc in
    0) say "   $name: ok in $(($(date +%s) - t))s" ;;
    77) say "   $name: cannot run on this host (exit 77) in $(($(date +%s) - t))s" ;;
    *) say "   $name: FAILED, exit $rc in $(($(date +%s) - t))s"; failed=1 ;;
  esac
  return 0
}

say "start: budget ${budget}s, build $build, output $out"
step facts
sed 's/^/  /' "$work/facts.log" 2>/dev/null | tee -a "$summary"
step rxe
grep -h 'rxe-probe:' "$work/rxe.log" 2>/dev/null | sed 's/^/  /' | tee -a "$summary"
step kill
grep -E '^(==|   )' "$work/kill.log" 2>/dev/null | sed 's/^/  /' | tee -a "$summary"
step e2e
grep -E '^(==|   )' "$work/e2e.log" 2>/dev/null | sed 's/^/  /' | tee -a "$summary"
step harness
sed -n '/^summary/,$p' "$work/harness.log" 2>/dev/null | sed 's/^/  /' | tee -a "$summary"
exit "$failed"
