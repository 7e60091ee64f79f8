#!/usr/bin/env bash
# The fault lane (make test-faults; docs/reliability.md): two network
# namespaces stand for two hosts, each runs one rank of
# `ncclnet-harness faults SCENARIO`, and the path between them is broken on
# purpose. Two paths join the namespaces:
#   veth   faults-va (faults-a, 198.18.1.1) <-> faults-vb (faults-b, 198.18.1.2)
#          plain kernel link: `ip link set down`, tbf rate limits, a black hole
#          made with a neighbour entry that points at a MAC nobody has
#   relay  faults-ta (faults-a, 198.18.2.1) <-> tools/impair <-> faults-tb (faults-b, 198.18.2.2)
#          TAP devices joined by our user-space relay: loss, delay, jitter and a
#          cut cable (this kernel has no sch_netem)
# Rank 0 (receiver, listener) runs in faults-a, rank 1 (sender) in faults-b.
#
#   scripts/faults/run.sh [--plugin SO] [--shm-plugin SO] [--harness BIN] [--impair BIN] [--only A,B] [--list]
#
# --only runs the named scenarios (comma-separated, in the lane's order); a
# name that is not a scenario, or a list that names none, is a usage error
# (exit 2) before anything is built, checked or set up. --list prints the
# scenario names (with --only, the ones it selects).
#
# The shm-* scenarios run the same driver against the SDK example transport
# (libnccl-net-shm.so: same host, so no namespaces).
#
# Every step runs under a watchdog (a hung step fails, naming the scenario);
# namespaces, TAP devices and the relay are removed on exit and before
# starting (a crashed earlier run leaves nothing in the way). The lane skips
# only where the machine cannot create a network namespace, and says why.
# Logs: build/faults/<scenario>.{out,err}; summary: build/faults/summary.txt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2

PLUGIN=build/libnccl-net-go.so
SHM_PLUGIN=build/libnccl-net-shm.so
HARNESS=build/ncclnet-harness
IMPAIR=build/impair
ONLY=""
ONLY_ARG=""
ONLY_SET=0
LIST=0
OUT=${FAULTS_OUT:-build/faults}
KILL_TRIALS=${FAULTS_KILL_TRIALS:-100}
ABORT_ROUNDS=${FAULTS_ABORT_ROUNDS:-200}
usage() {
  echo "usage: $0 [--plugin SO] [--shm-plugin SO] [--harness BIN] [--impair BIN] [--only SCENARIO[,SCENARIO]] [--list]" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --plugin | --shm-plugin | --harness | --impair | --only)
      [ $# -ge 2 ] || { echo "$0: $1 needs a value" >&2; usage; } ;;
  esac
  case "$1" in
    --plugin) PLUGIN=$2; shift 2 ;;
    --shm-plugin) SHM_PLUGIN=$2; shift 2 ;;
    --harness) HARNESS=$2; shift 2 ;;
    --impair) IMPAIR=$2; shift 2 ;;
    --only) ONLY=$2; ONLY_ARG=$2; ONLY_SET=1; shift 2 ;;
    --list) LIST=1; shift ;;
    *) usage ;;
  esac
done

NS_A=faults-a NS_B=faults-b
VA=faults-va VB=faults-vb TA=faults-ta TB=faults-tb
V_A=198.18.1.1 V_B=198.18.1.2 T_A=198.18.2.1 T_B=198.18.2.2
RUN=/run/ncclgo-faults
CTL=$RUN/impair.sock
NOWHERE_MAC=02:00:5e:00:53:01 # locally administered; no interface has it
NETNS=(--netns "$NS_A,$NS_B")

SCENARIOS=(path-veth path-relay slow-recv-0 slow-recv-4 slow-link kill kill-4 kill-forked connect-refused connect-blackhole
  impaired impaired-4 link-down link-down-timeout cable-cut cable-cut-timeout cable-cut-short freeze-recv freeze-send stray
  abort-v12 abort-v10 shm-slow-recv shm-kill shm-kill-forked shm-freeze-recv shm-abort)

# --only: every name must be a scenario, and at least one must be given; a
# misspelt name would otherwise run nothing and report "all scenarios passed".
# Checked before anything that needs root, the builds or the namespaces.
if [ $ONLY_SET = 1 ]; then
  declare -a only_names=() unknown=()
  IFS=, read -r -a only_names <<<"$ONLY"
  ONLY=""
  for n in "${only_names[@]}"; do
    n=${n#"${n%%[![:space:]]*}"} # blanks around a name are not part of it
    n=${n%"${n##*[![:space:]]}"}
    [ -n "$n" ] || continue
    known=0
    for s in "${SCENARIOS[@]}"; do [ "$s" = "$n" ] && { known=1; break; }; done
    if [ $known = 1 ]; then ONLY+="${ONLY:+,}$n"; else unknown+=("$n"); fi
  done
  if [ ${#unknown[@]} -gt 0 ]; then
    echo "$0: --only: unknown scenario${unknown[1]:+s}: ${unknown[*]} (see $0 --list)" >&2
    exit 2
  fi
  if [ -z "$ONLY" ]; then
    echo "$0: --only \"$ONLY_ARG\" names no scenario (see $0 --list)" >&2
    exit 2
  fi
fi

selected() {
  [ -z "$ONLY" ] && return 0
  [[ ",$ONLY," == *",$1,"* ]]
}

if [ $LIST = 1 ]; then
  for s in "${SCENARIOS[@]}"; do selected "$s" && echo "$s"; done
  exit 0
fi

log() { echo "test-faults: $*"; }
die() { log "FAIL: $*"; exit 1; }

for f in "$PLUGIN" "$SHM_PLUGIN" "$HARNESS" "$IMPAIR"; do
  [ -f "$f" ] || die "$f does not exist (make test-faults builds it)"
done
PLUGIN=$(realpath "$PLUGIN") SHM_PLUGIN=$(realpath "$SHM_PLUGIN") HARNESS=$(realpath "$HARNESS") IMPAIR=$(realpath "$IMPAIR")
command -v ip >/dev/null || die "ip (iproute2) not found: run make deps"
command -v tc >/dev/null || die "tc (iproute2) not found: run make deps"
command -v timeout >/dev/null || die "timeout (coreutils) not found"

# The one reason to skip: no network namespaces at all.
ip netns del faults-probe 2>/dev/null # left by a run killed right here
if ! why=$(ip netns add faults-probe 2>&1); then
  log "SKIP: this machine cannot create a network namespace (ip netns add: $why); the fault lane needs two"
  exit 0
fi
ip netns del faults-probe

# One lane at a time on a machine: the names below are fixed so a crashed run
# can be cleaned up by the next one.
mkdir -p "$OUT" "$RUN"
exec 9>/tmp/ncclgo-faults.lock
flock -w 1200 9 || die "another fault lane held /tmp/ncclgo-faults.lock for 20 minutes"

RELAY_PID=""
STEP_PID=""
cleanup() {
  if [ -n "$STEP_PID" ]; then
    kill "$STEP_PID" 2>/dev/null # timeout(1) passes it on to the harness
    wait "$STEP_PID" 2>/dev/null
    STEP_PID=""
  fi
  if [ -n "$RELAY_PID" ]; then
    kill "$RELAY_PID" 2>/dev/null
    wait "$RELAY_PID" 2>/dev/null
    RELAY_PID=""
  fi
  # A relay left by a crashed run of this lane (its pid file, its command line).
  if [ -f "$RUN/impair.pid" ]; then
    local p
    p=$(cat "$RUN/impair.pid")
    if [ -n "$p" ] && tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -- "run -a $TA -b $TB" >/dev/null; then
      kill "$p" 2>/dev/null
    fi
    rm -f "$RUN/impair.pid"
  fi
  ip netns del "$NS_A" 2>/dev/null
  ip netns del "$NS_B" 2>/dev/null
  ip link del "$VA" 2>/dev/null
  rm -f "$CTL"
  return 0
}
trap 'cleanup' EXIT
trap 'cleanup; exit 130' INT TERM


setup() {
  cleanup
  ip netns add "$NS_A" && ip netns add "$NS_B" || return 1
  ip -n "$NS_A" link set lo up && ip -n "$NS_B" link set lo up || return 1
  ip link add "$VA" netns "$NS_A" type veth peer name "$VB" netns "$NS_B" || return 1
  ip -n "$NS_A" addr add "$V_A/24" dev "$VA" && ip -n "$NS_B" addr add "$V_B/24" dev "$VB" || return 1
  ip -n "$NS_A" link set "$VA" up && ip -n "$NS_B" link set "$VB" up || return 1
  if [ ! -c /dev/net/tun ]; then
    if ! { mkdir -p /dev/net && mknod /dev/net/tun c 10 200; }; then
      log "no /dev/net/tun and cannot create it"
      return 1
    fi
  fi
  # The relay creates both TAP devices here (root namespace), then they move.
  "$IMPAIR" run -a "$TA" -b "$TB" -ctl "$CTL" -seed "${FAULTS_SEED:-20240611}" >"$OUT/impair.log" 2>&1 &
  RELAY_PID=$!
  echo "$RELAY_PID" >"$RUN/impair.pid"
  local i
  for ((i = 0; i < 100; i++)); do
    grep -x ready "$OUT/impair.log" >/dev/null && break
    kill -0 "$RELAY_PID" 2>/dev/null || { cat "$OUT/impair.log"; return 1; }
    sleep 0.1
  done
  grep -x ready "$OUT/impair.log" >/dev/null || { log "the relay did not come up"; cat "$OUT/impair.log"; return 1; }
  ip link set "$TA" netns "$NS_A" && ip link set "$TB" netns "$NS_B" || return 1
  ip -n "$NS_A" addr add "$T_A/24" dev "$TA" && ip -n "$NS_B" addr add "$T_B/24" dev "$TB" || return 1
  ip -n "$NS_A" link set "$TA" up && ip -n "$NS_B" link set "$TB" up || return 1
  sed -n 1p "$OUT/impair.log"
  paths_ready
}

# The plugin uses only interfaces that are up and running (carrier): a veth
# gets its carrier a moment after both ends are up, also after a link-down
# scenario brought it back.
paths_ready() {
  local ns dev i
  for pair in "$NS_A $VA" "$NS_B $VB" "$NS_A $TA" "$NS_B $TB"; do
    read -r ns dev <<<"$pair"
    for ((i = 0; i < 100; i++)); do
      ip -n "$ns" -o link show dev "$dev" 2>/dev/null | grep -E '<([^>]*,)?LOWER_UP(,[^>]*)?>' >/dev/null && break
      sleep 0.05
    done
    ((i < 100)) || { log "$dev in $ns is not running: $(ip -n "$ns" -o link show dev "$dev" 2>&1)"; return 1; }
  done
}

impair() { "$IMPAIR" ctl -ctl "$CTL" "$@"; }

declare -a RESULTS=()
FAILED=0
# arrange_failed NAME WHAT: the scenario's own set-up (tc, neigh, relay) failed.
arrange_failed() {
  FAILED=1
  RESULTS+=("$(printf '%-20s %-44s %4ss' "$1" "FAIL (could not $2)" 0)")
  log "FAIL $1: could not $2"
}
# run_step NAME LIMIT [VAR=VALUE...] -- HARNESS_ARGS...: one scenario under a
# watchdog; its stdout is shown and kept, its stderr (the plugin's WARNs) kept.
run_step() {
  local name=$1 limit=$2
  shift 2
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  local t0=$SECONDS rc
  echo
  echo "=== test-faults: $name (${envs[*]:-default env}) ==="
  # In the background, so that an interrupted lane stops the step at once.
  : >"$OUT/$name.out" # exists before tail looks for it
  env NCCL_DEBUG="${NCCL_DEBUG:-WARN}" "${envs[@]}" timeout -k 10 "$limit" "$HARNESS" faults "$@" --plugin "${STEP_PLUGIN:-$PLUGIN}" \
    >>"$OUT/$name.out" 2>"$OUT/$name.err" &
  STEP_PID=$!
  tail -s 0.2 -n +1 -f --pid="$STEP_PID" "$OUT/$name.out" &
  local tail_pid=$!
  wait "$STEP_PID"
  rc=$?
  STEP_PID=""
  wait "$tail_pid"
  local secs=$((SECONDS - t0)) verdict
  case $rc in
    0) verdict=PASS ;;
    124 | 137) verdict="FAIL (watchdog: still running after ${limit}s)" ;;
    *) verdict="FAIL (exit $rc)" ;;
  esac
  if [ $rc -ne 0 ]; then
    FAILED=1
    echo "--- last lines of $OUT/$name.err:"
    tail -n 15 "$OUT/$name.err" | sed 's/^/    /'
  fi
  RESULTS+=("$(printf '%-20s %-44s %4ss' "$name" "$verdict" "$secs")")
  echo "=== test-faults: $name: $verdict in ${secs}s ==="
}

# Each scenario: what to arrange around the run, then the run. Environment
# per run: NCCL_SOCKET_IFNAME picks the path (faults-v: veth, faults-t: relay).
VETH=NCCL_SOCKET_IFNAME=faults-v
RELAY=NCCL_SOCKET_IFNAME=faults-t
STREAMS4=(NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=1)
STREAMS0=(NCCL_SOCKET_NTHREADS=0)
LINK_DOWN="ip -n $NS_A link set $VA down && sleep 5 && ip -n $NS_A link set $VA up"
CABLE_CUT="$IMPAIR ctl -ctl $CTL down 5s >/dev/null && sleep 5"

sc_path-veth() { run_step path-veth 120 $VETH -- transfer "${NETNS[@]}" --size 16M --iters 8; }
sc_path-relay() { run_step path-relay 120 $RELAY -- transfer "${NETNS[@]}" --size 16M --iters 8; }
# Issue 9, item 1: a receiver that is alive but does not post for 3 x timeout.
sc_slow-recv-0() { run_step slow-recv-0 120 $VETH NCCL_GO_TIMEOUT=2 "${STREAMS0[@]}" -- slow-recv "${NETNS[@]}" --hold 6; }
sc_slow-recv-4() { run_step slow-recv-4 120 $VETH NCCL_GO_TIMEOUT=2 "${STREAMS4[@]}" -- slow-recv "${NETNS[@]}" --hold 6; }
# A slow link is not a dead peer: each 16 MiB message needs about 5.4 s at
# 25 Mbit/s, more than twice NCCL_GO_TIMEOUT, and makes progress all along.
sc_slow-link() {
  tc -n "$NS_B" qdisc replace dev "$VB" root tbf rate 25mbit burst 64kb latency 100ms ||
    { arrange_failed slow-link "add a tbf qdisc to $VB"; return; }
  run_step slow-link 120 $VETH NCCL_GO_TIMEOUT=2 -- transfer "${NETNS[@]}" --size 16M --iters 2
  tc -n "$NS_B" qdisc del dev "$VB" root
}
sc_kill() { run_step kill 600 $VETH NCCL_GO_TIMEOUT=2 -- kill "${NETNS[@]}" --trials "$KILL_TRIALS"; }
sc_kill-4() { run_step kill-4 600 $VETH NCCL_GO_TIMEOUT=2 "${STREAMS4[@]}" -- kill "${NETNS[@]}" --trials $((KILL_TRIALS / 4 + 1)); }
# Each rank forks a child that outlives it by up to 30 s holding every
# descriptor it inherited (a DataLoader worker): the kill must still be seen
# within the bound, so the child must not hold the rank's sockets.
sc_kill-forked() { run_step kill-forked 600 $VETH NCCL_GO_TIMEOUT=2 -- kill "${NETNS[@]}" --trials $((KILL_TRIALS / 4 + 1)) --fork-child 30; }
sc_connect-refused() { run_step connect-refused 120 $VETH NCCL_GO_TIMEOUT=3 -- connect-refused "${NETNS[@]}" --within 6; }
# The sender (faults-b) reaches the listener's address through a neighbour
# entry for a MAC nobody has: its SYNs leave and vanish, nothing answers.
sc_connect-blackhole() {
  ip -n "$NS_B" neigh replace "$V_A" lladdr "$NOWHERE_MAC" dev "$VB" nud permanent ||
    { arrange_failed connect-blackhole "add the black-hole neighbour entry"; return; }
  run_step connect-blackhole 120 $VETH NCCL_GO_TIMEOUT=3 -- connect-blackhole "${NETNS[@]}" --within 6
  ip -n "$NS_B" neigh del "$V_A" dev "$VB"
}
# 1 % loss and 10 ms delay each way (20 ms round trip), 1 GiB, plain TCP on
# the same path in the same run with as many streams as the plugin puts data
# on (0 data streams: all of it on the control stream).
sc_impaired() {
  if ! { impair reset && impair set loss=1% delay=10ms; } >/dev/null; then arrange_failed impaired "configure the relay"; return; fi
  run_step impaired 600 $RELAY "${STREAMS0[@]}" -- transfer "${NETNS[@]}" --size 64M --iters 16 --tcp-streams 1 --tcp-secs 10
  echo "relay: $(impair stats)"
  impair reset >/dev/null
}
sc_impaired-4() {
  if ! { impair reset && impair set loss=1% delay=10ms; } >/dev/null; then arrange_failed impaired-4 "configure the relay"; return; fi
  run_step impaired-4 600 $RELAY "${STREAMS4[@]}" -- transfer "${NETNS[@]}" --size 64M --iters 16 --tcp-streams 4 --tcp-secs 10
  echo "relay: $(impair stats)"
  impair reset >/dev/null
}
# Link down 5 s (carrier lost on both ends) a quarter into 1 GiB.
sc_link-down() { run_step link-down 300 $VETH -- transfer "${NETNS[@]}" --iters 16 --fault cmd --cmd "$LINK_DOWN"; }
sc_link-down-timeout() {
  run_step link-down-timeout 300 $VETH NCCL_GO_TIMEOUT=2 -- transfer "${NETNS[@]}" --iters 16 --fault cmd --cmd "$LINK_DOWN" \
    --expect error --within 4
}
# The same outage in the middle of the path: both links stay up, frames vanish.
sc_cable-cut() { run_step cable-cut 300 $RELAY -- transfer "${NETNS[@]}" --size 16M --iters 16 --fault cmd --cmd "$CABLE_CUT"; }
sc_cable-cut-timeout() {
  run_step cable-cut-timeout 300 $RELAY NCCL_GO_TIMEOUT=2 -- transfer "${NETNS[@]}" --size 16M --iters 16 --fault cmd \
    --cmd "$CABLE_CUT" --expect error --within 4
}
# An outage of half NCCL_GO_TIMEOUT is a hiccup, not a dead peer.
sc_cable-cut-short() {
  run_step cable-cut-short 300 $RELAY NCCL_GO_TIMEOUT=4 -- transfer "${NETNS[@]}" --size 16M --iters 16 --fault cmd \
    --cmd "$IMPAIR ctl -ctl $CTL down 2s >/dev/null && sleep 2"
}
# CONVENTIONS.md 6: a frozen process is alive (its kernel answers).
sc_freeze-recv() {
  run_step freeze-recv 300 $VETH NCCL_GO_TIMEOUT=2 -- transfer "${NETNS[@]}" --iters 16 --fault stop --victim recv --hold 6
}
sc_freeze-send() {
  run_step freeze-send 300 $VETH NCCL_GO_TIMEOUT=2 -- transfer "${NETNS[@]}" --iters 16 --fault stop --victim send --hold 6
}
sc_stray() { run_step stray 300 $VETH -- stray "${NETNS[@]}"; }
sc_abort-v12() { run_step abort-v12 600 $VETH NCCL_GO_TIMEOUT=5 -- abort "${NETNS[@]}" --version 12 --rounds "$ABORT_ROUNDS"; }
sc_abort-v10() {
  run_step abort-v10 600 $VETH NCCL_GO_TIMEOUT=5 -- abort "${NETNS[@]}" --version 10 --rounds $((ABORT_ROUNDS / 2))
}
# The shm example transport (issue 9: every transport detects a dead peer,
# survives a slow or frozen one, and aborts cleanly).
sc_shm-slow-recv() {
  STEP_PLUGIN=$SHM_PLUGIN run_step shm-slow-recv 120 NCCL_GO_TIMEOUT=2 -- slow-recv --size 16M --hold 6
}
sc_shm-kill() { STEP_PLUGIN=$SHM_PLUGIN run_step shm-kill 300 NCCL_GO_TIMEOUT=2 -- kill --trials $((KILL_TRIALS / 5 + 1)); }
sc_shm-kill-forked() { STEP_PLUGIN=$SHM_PLUGIN run_step shm-kill-forked 300 NCCL_GO_TIMEOUT=2 -- kill --trials $((KILL_TRIALS / 5 + 1)) --fork-child 30; }
sc_shm-freeze-recv() {
  STEP_PLUGIN=$SHM_PLUGIN run_step shm-freeze-recv 120 NCCL_GO_TIMEOUT=2 -- transfer --size 16M --iters 16 --fault stop \
    --victim recv --hold 6
}
sc_shm-abort() { STEP_PLUGIN=$SHM_PLUGIN run_step shm-abort 300 NCCL_GO_TIMEOUT=5 -- abort --rounds $((ABORT_ROUNDS / 2)); }

log "setting up $NS_A / $NS_B (veth $VA-$VB, relay $TA-$TB)"
setup || die "could not set up the namespaces and paths (see above)"
T0=$SECONDS
for s in "${SCENARIOS[@]}"; do
  selected "$s" || continue
  if ! kill -0 "$RELAY_PID" 2>/dev/null || ! paths_ready; then
    log "the relay died or a path is down; setting the lane up again"
    setup || die "set-up failed"
  fi
  "sc_$s"
done

{
  echo
  echo "=== test-faults summary ($((SECONDS - T0)) s; plugin $PLUGIN) ==="
  printf '  %s\n' "${RESULTS[@]}"
} | tee "$OUT/summary.txt"
if [ $FAILED -ne 0 ]; then
  log "FAILED (logs in $OUT/)"
  exit 1
fi
log "all scenarios passed"
