#!/usr/bin/env bash
# The check functions are only called through wait_until, which shellcheck
# cannot follow.
# shellcheck disable=SC2317
# End-to-end check of the plugin's metrics with a real Prometheus server.
#
# 1. HTTP mode: starts Prometheus (random free port, temporary storage,
#    scrape_interval 1s) scraping NCCL_GO_METRICS_PORT + local rank for ranks 0
#    and 1, runs `ncclnet-harness transfer` (a receiver and a sender process;
#    the harness gives them LOCAL_RANK 0 and 1) and checks through Prometheus's
#    HTTP API that the sender's sent bytes and the receiver's received bytes
#    both equal size * iters, and that `promtool check metrics` accepts the
#    exposition of both processes.
# 2. Textfile mode: runs the transfer again with NCCL_GO_METRICS_TEXTFILE_DIR
#    and both processes on local rank 0 (as under a launcher that sets none),
#    and checks the same counters in the files, promtool on them, a real
#    node_exporter's textfile collector exposing both files' series without a
#    collision (a snapshot of them: the processes remove theirs at finalize),
#    and that the files are gone once the processes finalized.
# 3. Dashboard and alerting rules (deploy/): the same Prometheus loads
#    deploy/prometheus/ncclnet-alerts.yml and scrapes two more pairs of plugin
#    processes driven by the selftest helper: one moves verified data, holds
#    one receive past NCCL_GO_STALL_WARN and has the plugin refuse one bad
#    irecv; the other connects and stays silent. While they run, every alert
#    expression (as Prometheus loaded it) and every query of
#    deploy/grafana/ncclnet-go.json (variables filled in) must return data, or
#    the test fails naming the expression; the three alerts must be pending or
#    firing for the right ranks; `ncclnet-go top --once` must see all four.
#
# Every wait is bounded; everything started here is killed on exit.
set -euo pipefail

PLUGIN=build/libnccl-net-go.so
HARNESS=build/ncclnet-harness
SIZE=1048576
ITERS=64
VERSION=""
LINGER=6
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TOOL=build/ncclnet-go
HELPER=build/ncclnet-go-selftest
RULES=$ROOT/deploy/prometheus/ncclnet-alerts.yml
DASHBOARD=$ROOT/deploy/grafana/ncclnet-go.json
LOAD_SECS=45
usage() {
  echo "usage: $0 [--plugin SO] [--harness BIN] [--size BYTES] [--iters N] [--version V] [--linger SEC]" >&2
  echo "          [--ncclnet-go BIN] [--selftest-helper BIN] [--rules YML] [--dashboard JSON] [--load-secs SEC]" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --plugin) PLUGIN=$2; shift 2 ;;
    --harness) HARNESS=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --version) VERSION=$2; shift 2 ;;
    --linger) LINGER=$2; shift 2 ;;
    --ncclnet-go) TOOL=$2; shift 2 ;;
    --selftest-helper) HELPER=$2; shift 2 ;;
    --rules) RULES=$2; shift 2 ;;
    --dashboard) DASHBOARD=$2; shift 2 ;;
    --load-secs) LOAD_SECS=$2; shift 2 ;;
    *) usage ;;
  esac
done

log() { echo "prometheus-e2e: [${SECONDS}s] $*"; }
for tool in prometheus promtool curl jq setsid timeout; do
  command -v "$tool" >/dev/null || { log "FAIL: $tool not found (make deps installs prometheus, curl, jq)"; exit 1; }
done
for f in "$PLUGIN" "$HARNESS" "$TOOL" "$HELPER" "$RULES" "$DASHBOARD"; do
  [ -e "$f" ] || { log "FAIL: $f does not exist (make $f)"; exit 1; }
done
PLUGIN=$(realpath "$PLUGIN")
HARNESS=$(realpath "$HARNESS")
TOOL=$(realpath "$TOOL")
HELPER=$(realpath "$HELPER")
RULES=$(realpath "$RULES")
DASHBOARD=$(realpath "$DASHBOARD")
EXPECT=$((SIZE * ITERS))

TMP=$(mktemp -d /tmp/ncclnet-prom-e2e.XXXXXX)
# Process groups started here (setsid makes each command its own group leader,
# so killing the group also gets the harness's forked children).
GROUPS_STARTED=()
cleanup() {
  local rc=$?
  for g in "${GROUPS_STARTED[@]}"; do
    kill -TERM -- "-$g" 2>/dev/null || true
  done
  for g in "${GROUPS_STARTED[@]}"; do
    for _ in $(seq 50); do kill -0 -- "-$g" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$g" 2>/dev/null || true
  done
  if [ "$rc" -ne 0 ] && [ -d "$TMP" ]; then
    for f in "$TMP"/*.log; do
      [ -e "$f" ] || continue
      echo "---- $(basename "$f") (last 40 lines) ----"
      tail -n 40 "$f"
    done
  fi
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() { log "FAIL: $*"; exit 1; }

# start NAME CMD... runs CMD in its own session in the background, logging to
# $TMP/NAME.log, and sets STARTED_PID.
start() {
  local name=$1; shift
  setsid "$@" >"$TMP/$name.log" 2>&1 </dev/null &
  STARTED_PID=$!
  GROUPS_STARTED+=("$STARTED_PID")
}

# alive PID: PID runs. kill -0 is not enough: a child that exited but that this
# shell has not reaped yet is a zombie, and kill -0 still succeeds on it.
alive() {
  local st
  st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  st=${st##*) }
  [ "${st%% *}" != Z ]
}

# Ports inside the kernel's ephemeral range can be taken at any moment by an
# outgoing connection (bound, never listening, invisible to a connect probe),
# so candidates come from below that range, or above it if it starts low.
read -r EPH_LO EPH_HI </proc/sys/net/ipv4/ip_local_port_range
TCP_TABLES=()
for f in /proc/net/tcp /proc/net/tcp6; do [ -r "$f" ] && TCP_TABLES+=("$f"); done
# port_used P: some TCP socket, in any state, has local port P.
port_used() {
  awk -v p="$(printf ':%04X' "$1")" 'FNR > 1 && substr($2, length($2) - 4) == p { f = 1 } END { exit !f }' \
    "${TCP_TABLES[@]}"
}

# free_ports N: a base port such that base..base+N-1 are unused.
free_ports() {
  local n=$1 lo hi base i ok
  if [ "$EPH_LO" -gt 12000 ]; then lo=10000 hi=$((EPH_LO - n)); else lo=$((EPH_HI + 1)) hi=$((65535 - n)); fi
  for _ in $(seq 100); do
    base=$((lo + (RANDOM * 32768 + RANDOM) % (hi - lo)))
    ok=1
    for ((i = 0; i < n; i++)); do ! port_used $((base + i)) || { ok=0; break; }; done
    [ "$ok" = 1 ] && { echo "$base"; return 0; }
  done
  return 1
}

# wait_until SECONDS CMD...: retries CMD every 0.2 s until it succeeds.
wait_until() {
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.2
  done
}

harness_args=(transfer --plugin "$PLUGIN" --size "$SIZE" --iters "$ITERS" --linger "$LINGER")
[ -n "$VERSION" ] && harness_args+=(--version "$VERSION")
# Bounds the whole transfer, so a hang fails the test instead of stalling CI.
HARNESS_TIMEOUT=$((120 + LINGER))

# The harness must pick the local ranks itself; a value inherited from the CI
# environment would put both processes on one port.
# Nor may a batch system's job id decide the nccl_job label (part 3 sets it).
unset NCCL_GO_METRICS_LOCAL_RANK LOCAL_RANK OMPI_COMM_WORLD_LOCAL_RANK SLURM_LOCALID MPI_LOCALRANKID \
  NCCL_GO_METRICS_PORT NCCL_GO_METRICS_TEXTFILE_DIR NCCL_GO_METRICS_INTERVAL NCCL_GO_METRICS_BIND \
  NCCL_GO_METRICS_JOB SLURM_JOB_ID PBS_JOBID LSB_JOBID FLUX_JOB_ID TORCHELASTIC_RUN_ID
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

########## 1. HTTP endpoint scraped by Prometheus ##########
METRICS_BASE=$(free_ports 2) || fail "no two unused consecutive ports for the plugin"
# Part 3's four processes (two pairs) get their own job and ports.
for _ in 1 2 3 4 5; do
  RULES_BASE=$(free_ports 4) || fail "no four unused consecutive ports for part 3"
  if [ $((RULES_BASE + 3)) -lt "$METRICS_BASE" ] || [ "$RULES_BASE" -gt $((METRICS_BASE + 1)) ]; then break; fi
done
cat >"$TMP/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - $RULES
scrape_configs:
  - job_name: ncclnet
    static_configs:
      - targets: ['127.0.0.1:$METRICS_BASE', '127.0.0.1:$((METRICS_BASE + 1))']
  - job_name: ncclnet-rules
    static_configs:
      - targets: ['127.0.0.1:$RULES_BASE', '127.0.0.1:$((RULES_BASE + 1))', '127.0.0.1:$((RULES_BASE + 2))', '127.0.0.1:$((RULES_BASE + 3))']
EOF
promtool check config "$TMP/prometheus.yml" >/dev/null || fail "promtool rejects the generated config"
# A port found unused can still be taken before Prometheus binds it; then it exits
# at once and is started again on another port.
prom_ready() { alive "$PROM_PID" && curl -fsS --max-time 2 "$PROM/-/ready" >/dev/null 2>&1; }
prom_ready_or_gone() { prom_ready || ! alive "$PROM_PID"; }
for attempt in 1 2 3; do
  PROM_PORT=$(free_ports 1) || fail "no unused port for Prometheus"
  if [ "$PROM_PORT" -ge "$METRICS_BASE" ] && [ "$PROM_PORT" -le $((METRICS_BASE + 1)) ]; then continue; fi
  if [ "$PROM_PORT" -ge "$RULES_BASE" ] && [ "$PROM_PORT" -le $((RULES_BASE + 3)) ]; then continue; fi
  start prometheus prometheus --config.file="$TMP/prometheus.yml" --storage.tsdb.path="$TMP/data" \
    --web.listen-address="127.0.0.1:$PROM_PORT" --log.level=warn
  PROM_PID=$STARTED_PID
  PROM="http://127.0.0.1:$PROM_PORT"
  wait_until 60 prom_ready_or_gone || fail "Prometheus did not become ready on port $PROM_PORT within 60 s"
  prom_ready && break
  grep 'address already in use' "$TMP/prometheus.log" >/dev/null ||
    fail "Prometheus exited during start-up on port $PROM_PORT"
  log "port $PROM_PORT was taken before Prometheus bound it (attempt $attempt of 3)"
  mv "$TMP/prometheus.log" "$TMP/prometheus-attempt$attempt.log"
  PROM_PID=
done
[ -n "${PROM_PID:-}" ] && prom_ready || fail "Prometheus could not bind an unused port in 3 attempts"
# query PROMQL: prints "instance direction value" per result.
query() {
  curl -fsS --max-time 5 --get --data-urlencode "query=$1" "$PROM/api/v1/query" |
    jq -r '.data.result[] | "\(.metric.instance // "-") \(.metric.direction // "-") \(.value[1])"'
}

# Prometheus applies static targets a few seconds after start (its discovery
# updates are throttled); the transfer must not begin before both targets are
# being scraped (up == 0 while nothing listens yet), or its lingering window
# could pass unseen.
targets_scraped() { [ "$(query 'count(up{job="ncclnet"})' 2>/dev/null | awk '{ print $3 }')" = 2 ]; }
wait_until 60 targets_scraped || fail "Prometheus did not start scraping the two targets within 60 s"
log "Prometheus ready on $PROM_PORT; plugin endpoints on $METRICS_BASE (local rank 0) and $((METRICS_BASE + 1)) (local rank 1)"

NCCL_GO_METRICS_PORT=$METRICS_BASE start harness-http timeout "$HARNESS_TIMEOUT" "$HARNESS" "${harness_args[@]}"
H_PID=$STARTED_PID
log "harness: ${harness_args[*]} (expecting $EXPECT bytes each way)"

harness_running() { alive "$H_PID"; }
endpoints_up() {
  curl -fsS --max-time 2 -o "$TMP/rank0.prom" "http://127.0.0.1:$METRICS_BASE/metrics" 2>/dev/null &&
    curl -fsS --max-time 2 -o "$TMP/rank1.prom" "http://127.0.0.1:$((METRICS_BASE + 1))/metrics" 2>/dev/null
}
up_or_gone() { endpoints_up || ! harness_running; }
wait_until 60 up_or_gone || fail "the plugin's endpoints did not come up within 60 s"
if ! endpoints_up; then
  if grep 'cannot listen.*address already in use' "$TMP/harness-http.log" >/dev/null; then
    if port_used "$METRICS_BASE" || port_used $((METRICS_BASE + 1)); then
      fail "another program took port $METRICS_BASE or $((METRICS_BASE + 1)) before the plugin bound it; rerun"
    fi
    fail "both harness processes used the same metrics port: the harness must set LOCAL_RANK=0 in the receiver child and LOCAL_RANK=1 in the sender child"
  fi
  fail "the harness exited before both metrics endpoints were served"
fi

# Sender's sent bytes == receiver's received bytes == size * iters, as seen by
# Prometheus (sum over devices, per process and direction).
by_instance='sum by (instance, direction) (ncclnet_bytes_total)'
counters_match() {
  query "$by_instance" >"$TMP/bytes.txt" 2>/dev/null || return 1
  local send_inst recv_inst
  send_inst=$(awk -v e="$EXPECT" '$2 == "send" && $3 + 0 == e { print $1 }' "$TMP/bytes.txt")
  recv_inst=$(awk -v e="$EXPECT" '$2 == "recv" && $3 + 0 == e { print $1 }' "$TMP/bytes.txt")
  [ -n "$send_inst" ] && [ -n "$recv_inst" ] && [ "$send_inst" != "$recv_inst" ]
}
match_or_gone() { counters_match || ! harness_running; }
wait_until "$HARNESS_TIMEOUT" match_or_gone || fail "timed out waiting for the byte counters"
if ! counters_match; then
  log "Prometheus saw (instance direction bytes):"
  cat "$TMP/bytes.txt"
  fail "Prometheus never saw $EXPECT bytes sent by one process and received by the other"
fi
log "Prometheus: $(tr '\n' ';' <"$TMP/bytes.txt")"

# Messages balance too: every send matched one receive.
query 'sum by (direction) (ncclnet_messages_total)' >"$TMP/msgs.txt"
sent_msgs=$(awk '$2 == "send" { print $3 }' "$TMP/msgs.txt")
recv_msgs=$(awk '$2 == "recv" { print $3 }' "$TMP/msgs.txt")
if [ -z "$sent_msgs" ] || [ "$sent_msgs" != "$recv_msgs" ]; then
  fail "messages sent ($sent_msgs) != received ($recv_msgs)"
fi
[ "${sent_msgs%.*}" -ge "$ITERS" ] || fail "only $sent_msgs messages counted for $ITERS iterations"
# scalar PROMQL: the value of a query with one result ("none" when empty).
scalar() {
  local v
  v=$(query "$1" | awk '{ print $3 }')
  echo "${v:-none}"
}
# expect PROMQL WANT WHAT: fails naming WHAT unless the query gives WANT.
expect() {
  local got
  got=$(scalar "$1")
  [ "$got" = "$2" ] || fail "$3: $1 = $got, want $2"
}
# Both processes were scraped successfully and report what they run.
expect 'count(up{job="ncclnet"} == 1)' 2 "Prometheus does not see both targets up"
expect 'count(ncclnet_info{nccl_net_api=~"v[0-9]+", go_version=~"go.+"})' 2 "ncclnet_info missing or incomplete"
# Nothing failed and nothing is left in flight.
expect 'sum(ncclnet_errors_total)' 0 "errors counted during a clean transfer"
expect 'sum(ncclnet_requests_in_flight)' 0 "requests still in flight after the transfer"
expect 'sum(ncclnet_request_duration_seconds_count)' "$((${sent_msgs%.*} + ${recv_msgs%.*}))" "latency histogram count != messages"

for r in 0 1; do
  curl -fsS --max-time 5 -o "$TMP/rank$r.prom" "http://127.0.0.1:$((METRICS_BASE + r))/metrics" ||
    fail "endpoint of local rank $r went away before the end of --linger"
  promtool check metrics <"$TMP/rank$r.prom" || fail "promtool check metrics rejects local rank $r's exposition"
done
log "promtool check metrics: both expositions clean"

wait "$H_PID" || fail "harness transfer failed (rc $?)"
grep -qi "GB/s" "$TMP/harness-http.log" || fail "harness printed no throughput"
log "HTTP mode passed"

########## 2. textfile for node_exporter ##########
TEXTDIR="$TMP/textfile"
mkdir "$TEXTDIR"
NCCL_GO_METRICS_TEXTFILE_DIR=$TEXTDIR NCCL_GO_METRICS_INTERVAL=0.5 NCCL_GO_METRICS_LOCAL_RANK=0 \
  start harness-textfile timeout "$HARNESS_TIMEOUT" "$HARNESS" "${harness_args[@]}"
H_PID=$STARTED_PID

# file_bytes FILE DIR: sum of ncclnet_bytes_total for direction DIR in FILE.
file_bytes() {
  awk -v d="direction=\"$2\"" '/^ncclnet_bytes_total\{/ && index($0, d) { s += $NF } END { printf "%.0f\n", s }' "$1"
}
files_match() {
  local f send_file="" recv_file=""
  for f in "$TEXTDIR"/ncclnet_go_rank*_pid*.prom; do
    [ -e "$f" ] || return 1
    [ "$(file_bytes "$f" send)" = "$EXPECT" ] && send_file=$f
    [ "$(file_bytes "$f" recv)" = "$EXPECT" ] && recv_file=$f
  done
  [ -n "$send_file" ] && [ -n "$recv_file" ] && [ "$send_file" != "$recv_file" ] || return 1
  SEND_FILE=$send_file RECV_FILE=$recv_file
}
match_or_gone() { files_match || ! harness_running; }
wait_until "$HARNESS_TIMEOUT" match_or_gone || fail "timed out waiting for the textfiles"
if ! files_match; then
  ls -l "$TEXTDIR"
  fail "no pair of textfiles showed $EXPECT bytes sent by one process and received by the other"
fi
# Copy first: the writer replaces the files while promtool reads.
cp "$SEND_FILE" "$TMP/send.prom"
cp "$RECV_FILE" "$TMP/recv.prom"
promtool check metrics <"$TMP/send.prom" || fail "promtool rejects $(basename "$SEND_FILE")"
promtool check metrics <"$TMP/recv.prom" || fail "promtool rejects $(basename "$RECV_FILE")"
log "textfiles $(basename "$SEND_FILE") (sender) and $(basename "$RECV_FILE") (receiver) carry $EXPECT bytes; promtool clean"

# node_exporter reads both files (same local rank) and must expose every series
# of both: it refuses, and drops, a series another file already exposed.
SNAPDIR="$TMP/textfile-snapshot"
mkdir "$SNAPDIR"
cp "$TMP/send.prom" "$SNAPDIR/$(basename "$SEND_FILE")"
cp "$TMP/recv.prom" "$SNAPDIR/$(basename "$RECV_FILE")"
NODE_EXPORTER=$(command -v prometheus-node-exporter || command -v node_exporter) ||
  fail "node_exporter is not installed (Debian: prometheus-node-exporter; make deps installs it)"
ne_ready() { alive "$NE_PID" && curl -fsS --max-time 2 "http://127.0.0.1:$NE_PORT/metrics" >"$TMP/ne.prom" 2>/dev/null; }
ne_ready_or_gone() { ne_ready || ! alive "$NE_PID"; }
for attempt in 1 2 3; do
  NE_PORT=$(free_ports 1) || fail "no unused port for node_exporter"
  start node-exporter "$NODE_EXPORTER" --web.listen-address="127.0.0.1:$NE_PORT" \
    --collector.disable-defaults --collector.textfile --collector.textfile.directory="$SNAPDIR"
  NE_PID=$STARTED_PID
  wait_until 20 ne_ready_or_gone && ne_ready && break
  kill -TERM -- "-$NE_PID" 2>/dev/null || true
  [ "$attempt" -lt 3 ] || fail "node_exporter did not serve on port $NE_PORT (see node-exporter.log)"
done
grep -q '^node_textfile_scrape_error 0' "$TMP/ne.prom" || fail "node_exporter's textfile collector reports an error: $(grep '^node_textfile_scrape_error' "$TMP/ne.prom")"
if grep -q 'collected before with the same name and label values' "$TMP/node-exporter.log"; then
  fail "node_exporter dropped series two files share: $(grep -m1 -o 'collected metric .\{0,300\}' "$TMP/node-exporter.log")"
fi
[ "$(grep -c '^ncclnet_info{' "$TMP/ne.prom")" = 2 ] || fail "node_exporter exposes $(grep -c '^ncclnet_info{' "$TMP/ne.prom") ncclnet_info series for two processes"
[ "$(file_bytes "$TMP/ne.prom" send)" = "$EXPECT" ] && [ "$(file_bytes "$TMP/ne.prom" recv)" = "$EXPECT" ] ||
  fail "through node_exporter: sent $(file_bytes "$TMP/ne.prom" send), received $(file_bytes "$TMP/ne.prom" recv) bytes; want $EXPECT each"
kill -TERM -- "-$NE_PID" 2>/dev/null || true
log "node_exporter exposes both rank-0 processes' files without a collision, $EXPECT bytes each way"

wait "$H_PID" || fail "harness transfer (textfile mode) failed (rc $?)"
leftover=$(find "$TEXTDIR" -mindepth 1 -printf '%f ')
if [ -n "$VERSION" ] && [ "$VERSION" -lt 11 ]; then
  # Net API v8..v10 has no finalize: the plugin never learns that NCCL is done,
  # and the next process to start cleans the files up (docs/metrics.md).
  log "net API v$VERSION has no finalize; files left as documented: $leftover"
else
  [ -z "$leftover" ] || fail "files left in the textfile directory after the processes finalized: $leftover"
fi
log "textfile mode passed"

########## 3. dashboard and alerting rules ##########
# rules_json: the rules Prometheus loaded (one JSON object per line).
rules_json() {
  curl -fsS --max-time 5 "$PROM/api/v1/rules" | jq -c '.data.groups[].rules[]'
}
[ "$(rules_json | jq -r 'select(.type == "alerting") | .name' | sort | tr '\n' ' ')" = \
  "NcclNetErrors NcclNetRankNotMovingData NcclNetStalledRequests " ] ||
  fail "Prometheus did not load the three alerts of $RULES: $(rules_json | jq -r .name | tr '\n' ' ')"
# returns PROMQL: the query gives at least one series or sample.
returns() {
  curl -fsS --max-time 5 --get --data-urlencode "query=$1" "$PROM/api/v1/query" >"$TMP/q.json" 2>/dev/null &&
    jq -e '.status == "success" and (.data.result | length > 0)' "$TMP/q.json" >/dev/null
}

LOAD=("$HELPER" load --plugin "$PLUGIN" --duration "$LOAD_SECS")
# Both pairs belong to one NCCL job, so the silent pair's ranks are the busy
# pair's peers; the dashboard queries below select that job by its nccl_job.
NCCL_JOB=e2e-train
export NCCL_GO_METRICS_JOB=$NCCL_JOB
NCCL_GO_METRICS_PORT=$RULES_BASE NCCL_GO_STALL_WARN=1 \
  start load-busy timeout $((LOAD_SECS + 60)) "${LOAD[@]}" --size 256K --pause 0.05 --stall 3 --inject-error
BUSY_PID=$STARTED_PID
NCCL_GO_METRICS_PORT=$((RULES_BASE + 2)) start load-idle timeout $((LOAD_SECS + 60)) "${LOAD[@]}" --idle
IDLE_PID=$STARTED_PID
log "part 3: a busy pair (ports $RULES_BASE, $((RULES_BASE + 1))) and a silent one ($((RULES_BASE + 2)), $((RULES_BASE + 3))) for $LOAD_SECS s"
pairs_running() { alive "$BUSY_PID" && alive "$IDLE_PID"; }

# Wait until the busy pair's stall and error are scraped and every alert's
# expression returns data; each is then checked once more, with its name.
alerts_ready() {
  local q
  while IFS= read -r q; do returns "$q" || return 1; done < <(rules_json | jq -r 'select(.type == "alerting") | .query')
}
ready_or_gone() { alerts_ready || ! pairs_running; }
wait_until $((LOAD_SECS - 5)) ready_or_gone || true
while IFS=$'\t' read -r name health query; do
  [ "$health" = ok ] || fail "alert $name: Prometheus reports rule health $health"
  returns "$query" || fail "alert $name returned no data from the live plugin: $query"
  log "alert $name: expression returns data"
done < <(rules_json | jq -r 'select(.type == "alerting") | [.name, .health, .query] | @tsv')
pairs_running || fail "a load pair ended before the checks (see load-busy.log / load-idle.log)"

# alert_active NAME MATCHER: ALERTS has NAME pending or firing for MATCHER.
alert_active() { returns "ALERTS{alertname=\"$1\", alertstate=~\"pending|firing\"$2}"; }
# ALERTS appears only at the rule group's next evaluation (every 1 s) after the
# expression first returns data, so each expected alert gets a few evaluations.
alert_soon() { wait_until 10 alert_active "$@"; }
alert_soon NcclNetStalledRequests ",instance=\"127.0.0.1:$RULES_BASE\",direction=\"recv\"" ||
  fail "NcclNetStalledRequests is not active for the receiver that was held past NCCL_GO_STALL_WARN"
alert_soon NcclNetErrors ",instance=\"127.0.0.1:$RULES_BASE\"" ||
  fail "NcclNetErrors is not active for the rank whose irecv the plugin refused"
for p in $((RULES_BASE + 2)) $((RULES_BASE + 3)); do
  alert_soon NcclNetRankNotMovingData ",instance=\"127.0.0.1:$p\",nccl_job=\"$NCCL_JOB\"" ||
    fail "NcclNetRankNotMovingData is not active for the silent rank on port $p (with nccl_job=\"$NCCL_JOB\")"
done
for p in "$RULES_BASE" $((RULES_BASE + 1)); do
  ! alert_active NcclNetRankNotMovingData ",instance=\"127.0.0.1:$p\"" ||
    fail "NcclNetRankNotMovingData is active for the busy rank on port $p"
done
log "alerts active as expected (stall and error on the busy receiver, not-moving on both silent ranks)"

# Every dashboard query, with the variables as Grafana would fill them for
# this job; template variable queries (label_values) as the series they read.
n=0
while IFS= read -r expr; do
  q=${expr//\$__rate_interval/1m}
  q=${q//\$__interval/15s}
  q=${q//\$nccl_job/$NCCL_JOB}
  q=${q//\$job/ncclnet-rules}
  q=${q//\$instance/.*}
  q=${q//\$device/.*}
  if [[ "$q" =~ ^label_values\((.*),[[:space:]]*([a-z_]+)\)$ ]]; then
    q="count by (${BASH_REMATCH[2]}) (${BASH_REMATCH[1]})"
  fi
  returns "$q" || fail "dashboard query returned no data from the live plugin: $expr (evaluated as: $q)"
  n=$((n + 1))
done < <(jq -r '.. | objects | select(has("expr")) | .expr' "$DASHBOARD"
  jq -r '.templating.list[] | select(.type == "query") | (.query.query // .query)' "$DASHBOARD")
[ "$n" -gt 10 ] || fail "found only $n queries in $DASHBOARD"
log "dashboard: all $n queries return data"

"$TOOL" top --once --interval 1s "127.0.0.1:$RULES_BASE-$((RULES_BASE + 3))" >"$TMP/top.txt" 2>&1 ||
  { cat "$TMP/top.txt"; fail "ncclnet-go top --once failed"; }
grep "4 of 4 endpoint(s) up" "$TMP/top.txt" >/dev/null || { cat "$TMP/top.txt"; fail "ncclnet-go top does not see the four ranks"; }
# The sender is local rank 1 (port base + 1); column 5 is SEND GB/s.
awk -v p="127.0.0.1:$((RULES_BASE + 1)) " 'index($0, p) == 1 && $5 + 0 > 0 { ok = 1 } END { exit !ok }' "$TMP/top.txt" ||
  { cat "$TMP/top.txt"; fail "ncclnet-go top shows no send throughput for the busy sender"; }
log "ncclnet-go top sees all four ranks and the busy pair's throughput"

wait "$BUSY_PID" || fail "the busy load pair failed (rc $?)"
wait "$IDLE_PID" || fail "the silent load pair failed (rc $?)"
grep '^result=pass' "$TMP/load-busy.log" >/dev/null || fail "the busy pair did not report result=pass"
log "dashboard and alerting rules passed"
log "PASS"
