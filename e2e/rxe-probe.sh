#!/usr/bin/env bash
# Can this host run Soft-RoCE (rdma_rxe), and what does the ib transport move over it
# next to perftest, natively (no emulator)? The ib parity work asks this of the GPU
# host; a device session has minutes, so this runs every step in one go and says, for
# a host that cannot, exactly which step failed and why (docs/e2e-gpu.md, "ib over rxe").
#
#   e2e/rxe-probe.sh [--build DIR] [--out DIR] [--sizes "65536 1048576"] [--rounds N]
#                    [--bytes B] [--addr IPV4] [--e2e]
#
# 1. kernel: the rdma_rxe module (already loaded, or modinfo + modprobe);
# 2. user space: the rdma tool, libibverbs.so.1 and its rxe provider, perftest;
# 3. a dummy netdev (rxeprobe0, 198.51.100.1/24, MTU 9000) and an rxe device (rxeprobe)
#    over it, port ACTIVE with an IPv4 RoCE v2 GID;
# 4. ncclnet-go devices and ncclnet-go selftest --transport ib through the built library;
# 5. per size, ROUNDS alternating rounds of the harness's bandwidth run (ib transport,
#    NCCL-style loop) and, when perftest is installed, ib_write_bw on the same device;
# 6. with --e2e, real NCCL through the library's ib transport over rxeprobe
#    (e2e/run-gpu.sh with E2E_GO_TRANSPORT=ib).
# Everything it created (device, netdev, the module if it loaded it) is removed on exit.
# Needs root. Output: OUT/rxe-probe.txt (the summary) next to each step's log.
# Exit status: 0 every step ran, 1 a step failed after rxe came up, 77 rxe cannot run
# on this host (the summary says which step and why), 2 usage.
set -uo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="$root/build" out="" sizes="65536 1048576" rounds=3 bytes=1073741824 e2e=0
ADDR=198.51.100.1
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --sizes) sizes="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --bytes) bytes="$2"; shift 2 ;;
    --addr) ADDR="$2"; shift 2 ;;
    --e2e) e2e=1; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "rxe-probe: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ $rounds =~ ^[1-9]$ ]] || { echo "rxe-probe: --rounds takes 1..9" >&2; exit 2; }
out="${out:-$build/rxe-probe}"
mkdir -p "$out"
summary="$out/rxe-probe.txt"
: >"$summary"

NETDEV=rxeprobe0 DEV=rxeprobe
note() { echo "rxe-probe: $*" | tee -a "$summary"; }
# cannot STEP WHY: rxe does not work on this host; the reason is the result.
cannot() { note "CANNOT at $1: $2"; exit 77; }
failed=0
fail() { note "FAIL $1: $2"; failed=1; }

loaded_module=0 made_netdev=0 made_dev=0
# shellcheck disable=SC2317 # runs from the EXIT trap
cleanup() {
  if [ "$made_dev" = 1 ]; then rdma link delete "$DEV" 2>/dev/null; fi
  if [ "$made_netdev" = 1 ]; then ip link delete "$NETDEV" 2>/dev/null; fi
  if [ "$loaded_module" = 1 ]; then modprobe -r rdma_rxe 2>/dev/null; fi
}
trap cleanup EXIT

note "host $(uname -n), kernel $(uname -r), $(nproc) CPUs, $(date -u +%FT%TZ)"
[ "$(id -u)" = 0 ] || cannot root "not root (uid $(id -u)): loading rdma_rxe and adding links needs root"

# --- 1. kernel ------------------------------------------------------------------
# kconfig: what the running kernel's own configuration says of rdma_rxe, where it
# tells (/proc/config.gz): the answer that holds even without kmod or /lib/modules.
kconfig() {
  local line
  [ -r /proc/config.gz ] || { echo "no /proc/config.gz to tell"; return; }
  line=$(zcat /proc/config.gz 2>/dev/null | grep -E '^(# )?CONFIG_RDMA_RXE[ =]' | sed -n 1p)
  case $line in
    "# CONFIG_RDMA_RXE is not set") echo "the kernel's config has CONFIG_RDMA_RXE not set: it is neither built in nor a module" ;;
    CONFIG_RDMA_RXE=m) echo "the kernel's config has CONFIG_RDMA_RXE=m, so the module exists for it but is not installed under /lib/modules/$(uname -r)" ;;
    "") echo "the kernel's config does not mention CONFIG_RDMA_RXE (CONFIG_INFINIBAND off?)" ;;
    *) echo "the kernel's config has $line" ;;
  esac
}
if [ -d /sys/module/rdma_rxe ]; then
  note "rdma_rxe: already loaded"
elif ! command -v modinfo >/dev/null || ! command -v modprobe >/dev/null; then
  cannot kernel "rdma_rxe is not loaded and there is no modinfo/modprobe (kmod) to load it; $(kconfig)"
elif ! modinfo rdma_rxe >"$out/modinfo.log" 2>&1; then
  cannot kernel "no rdma_rxe module for kernel $(uname -r): $(head -1 "$out/modinfo.log"); $(kconfig)"
elif ! modprobe rdma_rxe >"$out/modprobe.log" 2>&1; then
  cannot kernel "modprobe rdma_rxe failed: $(tr '\n' ' ' <"$out/modprobe.log")(a container without CAP_SYS_MODULE, or module signing)"
else
  loaded_module=1
  note "rdma_rxe: loaded ($(modinfo -F filename rdma_rxe 2>/dev/null))"
fi

# --- 2. user space ----------------------------------------------------------------
command -v rdma >/dev/null || cannot userspace "no rdma tool (iproute2's rdma) to add an rxe link"
ibverbs=$(ldconfig -p 2>/dev/null | awk '/libibverbs\.so\.1 / && f == "" { f = $NF } END { print f }')
[ -n "$ibverbs" ] || ibverbs=$(find /usr/lib /usr/lib64 -maxdepth 2 -name libibverbs.so.1 2>/dev/null | sed -n 1p)
[ -n "$ibverbs" ] ||
  cannot userspace "libibverbs.so.1 is not installed (rdma-core's libibverbs1): the ib transport loads it at run time"
provider=$(find /usr/lib /usr/lib64 -maxdepth 3 -path '*/libibverbs/librxe-rdmav*.so' 2>/dev/null | sed -n 1p)
[ -n "$provider" ] || cannot userspace "libibverbs has no rxe provider (librxe-rdmav*.so, rdma-core's ibverbs-providers)"
note "user space: $(command -v rdma), $ibverbs, $provider"
perftest=$(command -v ib_write_bw || true)
note "perftest: ${perftest:-not installed (the bandwidth step runs the harness alone)}"

# --- 3. device ----------------------------------------------------------------------
ip link add "$NETDEV" type dummy 2>"$out/netdev.log" || cannot device "ip link add $NETDEV type dummy: $(cat "$out/netdev.log")"
made_netdev=1
# MTU 9000 gives rxe an active MTU of 4096, as on a jumbo-frame RoCE fabric.
if ! { ip addr add "$ADDR/24" dev "$NETDEV" && ip link set "$NETDEV" mtu 9000 && ip link set "$NETDEV" up; }; then
  cannot device "configuring $NETDEV failed"
fi
rdma link add "$DEV" type rxe netdev "$NETDEV" 2>"$out/link.log" ||
  cannot device "rdma link add $DEV type rxe netdev $NETDEV: $(cat "$out/link.log")"
made_dev=1
port=/sys/class/infiniband/$DEV/ports/1
gid=""
for _ in $(seq 100); do
  if grep -q ACTIVE "$port/state" 2>/dev/null; then
    for g in "$port"/gids/*; do
      case $(cat "$g" 2>/dev/null) in
        0000:0000:0000:0000:0000:ffff:*)
          [ "$(cat "$port/gid_attrs/types/${g##*/}" 2>/dev/null)" = "RoCE v2" ] && { gid=${g##*/}; break; } ;;
      esac
    done
    [ -n "$gid" ] && break
  fi
  sleep 0.1
done
[ -n "$gid" ] || cannot device "$DEV's port never became ACTIVE with an IPv4 RoCE v2 GID ($(cat "$port/state" 2>/dev/null))"
note "device: $DEV over $NETDEV, port $(cat "$port/state"), IPv4 RoCE v2 GID index $gid"

# From here on rxe works: a failure is the library's or the tools', exit 1.
export NCCL_IB_HCA="=$DEV:1" NCCL_SOCKET_IFNAME="$NETDEV" NCCL_GO_STALL_WARN=120

# --- 4. the library over it -----------------------------------------------------------
for f in libnccl-net-go.so ncclnet-go ncclnet-go-selftest ncclnet-harness; do
  [ -e "$build/$f" ] || { fail library "$build/$f is missing (make build/libnccl-net-go.so build/ncclnet-go build/ncclnet-go-selftest build/ncclnet-harness)"; exit 1; }
done
# devices runs the plugin's discovery code, built into the command itself.
if ! "$build/ncclnet-go" devices >"$out/devices.log" 2>&1; then
  fail devices "ncclnet-go devices failed (see $out/devices.log)"
elif ! grep -q " $DEV:1 " "$out/devices.log"; then
  fail devices "ncclnet-go devices does not name $DEV:1 (see $out/devices.log)"
else
  note "ncclnet-go devices: $(grep -m1 " $DEV:1 " "$out/devices.log" | tr -s ' ')"
fi
if "$build/ncclnet-go" selftest --transport ib --plugin "$build/libnccl-net-go.so" --size 16M --iters 4 >"$out/selftest.log" 2>&1; then
  note "selftest over ib: $(grep -m1 -i 'PASS' "$out/selftest.log")"
else
  fail selftest "ncclnet-go selftest --transport ib exited $? (see $out/selftest.log)"
fi

# --- 5. bandwidth next to ib_write_bw ---------------------------------------------------
# gbs_of FILE SIZE: the harness's plugin GB/s at SIZE from its bandwidth table.
gbs_of() {
  awk -v s="$2" '/^bandwidth:/ { on = 1; next } /^summary/ { on = 0 }
    on && $1 ~ /^[0-9]+$/ && $4 == "plugin" {
      m = ($2 == "KiB") ? 1024 : ($2 == "MiB") ? 1048576 : ($2 == "GiB") ? 1073741824 : 1
      if ($1 * m == s) print $5 }' "$1"
}
# wb SIZE N LOG: an ib_write_bw pair on $DEV; prints its GB/s (perftest's Gbit/s / 8).
wb() {
  local port=$((18600 + RANDOM % 400))
  timeout 300 ib_write_bw -d "$DEV" -x "$gid" -p "$port" -s "$1" -n "$2" -F --report_gbits >"$3.srv" 2>&1 &
  local s=$!
  sleep 1
  timeout 300 ib_write_bw -d "$DEV" -x "$gid" -p "$port" -s "$1" -n "$2" -F --report_gbits "$ADDR" >"$3" 2>&1
  wait "$s"
  awk -v s="$1" '$1 == s && NF >= 4 { printf "%.4f", $4 / 8 }' "$3"
}
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR ? v[int((NR + 1) / 2)] : 0) }'; }
for size in $sizes; do
  n=$((bytes / size)); [ "$n" -lt 16 ] && n=16
  hs=() ws=()
  for r in $(seq "$rounds"); do
    log="$out/harness.$size.$r.log" w=""
    NCCL_GO_TRANSPORT=ib timeout 600 "$build/ncclnet-harness" bench --plugin "$build/libnccl-net-go.so" --plugin-only \
      --rounds 1 --size "$size" --bw-bytes "$((n * size))" bw >"$log" 2>&1
    g=$(gbs_of "$log" "$size")
    [ -n "$g" ] || { fail bandwidth "harness at $size B, round $r: no figure (see $log)"; continue; }
    hs+=("$g")
    if [ -n "$perftest" ]; then
      w=$(wb "$size" "$n" "$out/write_bw.$size.$r.log")
      if [ -n "$w" ]; then
        ws+=("$w")
      else
        fail bandwidth "ib_write_bw at $size B, round $r: no figure (see $out/write_bw.$size.$r.log)"
      fi
    fi
    note "  $size B round $r: plugin $g GB/s${w:+, ib_write_bw $w GB/s}"
  done
  hm=$(median "${hs[@]}")
  if [ ${#ws[@]} -gt 0 ]; then
    wm=$(median "${ws[@]}")
    note "bandwidth $size B: plugin $hm GB/s, ib_write_bw $wm GB/s, ratio $(awk -v a="$hm" -v b="$wm" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }') (medians of $rounds alternating rounds)"
  else
    note "bandwidth $size B: plugin $hm GB/s (median of $rounds rounds; no perftest to compare with)"
  fi
done

# --- 6. real NCCL -----------------------------------------------------------------------
if [ "$e2e" = 1 ]; then
  if E2E_GO_TRANSPORT=ib E2E_IFNAME="$NETDEV" "$here/run-gpu.sh" --out "$out/e2e" >"$out/e2e.log" 2>&1; then
    note "real NCCL over $DEV with the ib transport: passed ($out/e2e)"
  else
    fail e2e "e2e/run-gpu.sh with E2E_GO_TRANSPORT=ib exited $? (see $out/e2e.log)"
  fi
fi
note "done: $([ "$failed" = 0 ] && echo 'every step ran' || echo 'some steps failed (above)')"
exit "$failed"
