#!/usr/bin/env bash
# Runs a command inside a throw-away qemu (TCG) guest that has one Soft-RoCE device
# rxe0 over the dummy netdev rxenet0 (192.0.2.1/24), and exits with the command's
# exit status. The repository is shared read-write over 9p at the same path, and
# the command starts in the current directory (if it is inside the repository).
#
# Usage: scripts/rdma/run.sh [options] -- COMMAND [ARGS...]
#   One argument after -- is a bash command line ('a && b'); several are argv.
#   --bench        benchmark run: default timeout 600 s instead of 300 s, and
#                  RDMA_LANE_BENCH=1 in the guest
#   --timeout SEC  wall-clock limit for the whole guest (boot included)
#   --mem MIB      guest memory (default 4096: the harness peer-killed check pins
#                  1 GiB in each of its two processes)
#   --smp N        guest vCPUs (default 2: one per polling process; more is slower on 2 cores)
#   --log FILE     keep the console log here (default .rdma/last-run.log)
#   --no-setup     do not run setup.sh first (it is cheap when nothing changed)
# In the guest: NCCL_IB_HCA=rxe0 and NCCL_SOCKET_IFNAME=rxenet0 unless the host sets
# them; host NCCL_*, GODEBUG, GOTRACEBACK, GOMAXPROCS and RDMA_LANE_* are forwarded;
# RDMA_LANE_GID_INDEX holds rxe0's IPv4 RoCE v2 GID index. RDMA_LANE_KERNEL_ARGS is
# appended to the guest kernel's command line (e.g. "tsc=reliable clocksource=tsc":
# under TCG the guest otherwise keeps HPET, where every clock_gettime is a system call).
# Exit status: the command's; 124 if the guest ran out of time; 125 if the guest
# failed before or without reporting one (the console log says why).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
state=${RDMA_LANE_DIR:-$repo/.rdma}
bench=0 limit="" mem=4096 smp=2 log="" setup=1
while [ $# -gt 0 ]; do
  case $1 in
    --bench) bench=1 ;;
    --timeout) limit=$2; shift ;;
    --mem) mem=$2; shift ;;
    --smp) smp=$2; shift ;;
    --log) log=$2; shift ;;
    --no-setup) setup=0 ;;
    --) shift; break ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option '$1' (the command goes after --; see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ $# -gt 0 ] || { echo "run.sh: no command given (usage: run.sh [options] -- COMMAND...)" >&2; exit 2; }
[ -n "$limit" ] || { [ "$bench" = 1 ] && limit=600 || limit=300; }
[[ $limit =~ ^[0-9]+$ ]] && [ "$limit" -ge 30 ] || { echo "run.sh: --timeout needs whole seconds >= 30" >&2; exit 2; }
log=${log:-$state/last-run.log}

if [ "$setup" = 1 ]; then
  "$here/setup.sh" --quiet || { echo "run.sh: setup.sh failed" >&2; exit 125; }
fi
kver=$(cat "$state/kernel/current" 2>/dev/null) && [ -f "$state/base.cpio" ] && [ -f "$state/kernel/$kver/vmlinuz" ] ||
  { echo "run.sh: no guest image under $state; run scripts/rdma/setup.sh" >&2; exit 125; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/rdma-lane.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

# --- per-run overlay: settings, the command, and libraries the base lacks ---
ovl=$tmp/ovl
mkdir -p "$ovl/lane"
nonce=$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
cwd=$PWD
case $cwd/ in "$repo"/*) ;; *) cwd=$repo ;; esac
# The guest leaves 20 s of the budget for boot and poweroff, so a command that runs
# out of time is reported as such instead of the guest being killed mid-report.
{
  printf 'LANE_NONCE=%s\nLANE_REPO=%q\nLANE_CWD=%q\nLANE_TIMEOUT=%d\nLANE_SHARE=9p\n' \
    "$nonce" "$repo" "$cwd" "$((limit - 20))"
} >"$ovl/lane/run.conf"
{
  echo "# forwarded from the host by run.sh"
  [ "$bench" = 1 ] && echo "export RDMA_LANE_BENCH=1"
  while IFS= read -r name; do
    printf 'export %s=%q\n' "$name" "${!name}"
  done < <(compgen -e | grep -E '^(NCCL_|RDMA_LANE_|GODEBUG$|GOTRACEBACK$|GOMAXPROCS$)' | grep -v '^RDMA_LANE_DIR$' || true)
} >"$ovl/lane/env.sh"
{
  echo ". /lane/env.sh"
  echo ". /lane/lane-env.sh"
  if [ $# -eq 1 ]; then
    printf '%s\n' "$1"
  else
    printf '%q ' "$@"; echo
  fi
} >"$ovl/lane/cmd.sh"

# Host-built binaries the command may run (plugin, harness, Go test binaries) need
# their shared libraries in the guest: add what base.cpio lacks, at the real
# merged-/usr path so no overlay entry can shadow the /lib -> usr/lib symlink.
usrmerged() { case $1 in /bin/*|/sbin/*|/lib/*|/lib64/*) echo "/usr$1" ;; *) echo "$1" ;; esac; }
declare -A have=()
while IFS= read -r f; do have[$f]=1; done <"$state/base.files"
add_lib() {
  local src=$1 real name
  real=$(usrmerged "$(readlink -f "$src")")
  if [ -z "${have[$real]:-}" ]; then
    mkdir -p "$ovl$(dirname "$real")"
    cp -L "$src" "$ovl$real"
    have[$real]=1
  fi
  name=$(usrmerged "$src")
  if [ "$name" != "$real" ] && [ -z "${have[$name]:-}" ]; then
    mkdir -p "$ovl$(dirname "$name")"
    ln -sf "$real" "$ovl$name"
    have[$name]=1
  fi
}
cands=()
[ -d "$repo/build" ] && while IFS= read -r f; do cands+=("$f"); done < <(
  find "$repo/build" -maxdepth 2 -type f \( -name '*.so' -o -name '*.test' -o -perm -u+x \) 2>/dev/null)
[ $# -gt 1 ] && [ -f "$1" ] && cands+=("$1")
for f in "${cands[@]}"; do
  [ "$(head -c4 "$f" 2>/dev/null | od -An -c | tr -d ' ')" = '177ELF' ] || continue
  while read -r lib; do
    add_lib "$lib"
  done < <(ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
done
(cd "$ovl" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) >"$tmp/overlay.cpio"
# Concatenated newc archives are unpacked in order by the kernel.
exec 9<"$state/.lock"
flock -s -w 900 9 || { echo "run.sh: timed out waiting for setup.sh to finish" >&2; exit 125; }
cat "$state/base.cpio" "$tmp/overlay.cpio" >"$tmp/initrd.cpio"
exec 9<&-

# --- boot -------------------------------------------------------------------
mkdir -p "$(dirname "$log")"
start=$(date +%s%N)
set +e
# -nodefaults: no VGA/NIC/floppy to probe (faster boot); stdin from /dev/null so a
# terminal is never put in raw mode; quiet+loglevel keep kernel chatter off the
# console; panic=-1 with -no-reboot turns a guest panic into a qemu exit.
timeout --foreground -k 10 "$limit" qemu-system-x86_64 \
  -nodefaults -no-user-config -machine q35 -accel tcg,thread=multi -cpu max \
  -smp "$smp" -m "$mem" -display none -monitor none -serial stdio -no-reboot \
  -kernel "$state/kernel/$kver/vmlinuz" -initrd "$tmp/initrd.cpio" \
  -append "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init${RDMA_LANE_KERNEL_ARGS:+ $RDMA_LANE_KERNEL_ARGS}" \
  -virtfs "local,path=$repo,mount_tag=repo,security_model=none,id=repo" \
  </dev/null 2>&1 | tr -d '\r' | tee "$log" | grep --line-buffered -v -e "^@@RDMA-LANE-EXIT:$nonce:" -e "reboot: Power down$"
qrc=${PIPESTATUS[0]}
set -e
elapsed=$(( ($(date +%s%N) - start) / 1000000 ))

marker=$(grep -a "^@@RDMA-LANE-EXIT:$nonce:" "$log" | tail -n1 || true)
if [ -z "$marker" ]; then
  if [ "$qrc" -eq 124 ] || [ "$qrc" -eq 137 ]; then
    echo "rdma-lane: the guest was killed after ${limit} s without reporting (raise --timeout?); console log: $log" >&2
    exit 124
  fi
  echo "rdma-lane: the guest ended (qemu exit $qrc) without reporting the command's status; console log: $log" >&2
  exit 125
fi
rc=${marker#@@RDMA-LANE-EXIT:"$nonce":}
uptime=${rc#*:}; uptime=${uptime%@@}
rc=${rc%%:*}
echo "rdma-lane: exit status $rc (guest uptime ${uptime} s, wall ${elapsed} ms)" >&2
exit "$rc"
