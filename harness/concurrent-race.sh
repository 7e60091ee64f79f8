#!/usr/bin/env bash
# Runs `ncclnet-harness concurrent` RUNS times per API version against a Go
# plugin built with the race detector (scripts/build-plugin.sh --race) and fails
# on any data race report, any corrupt byte and any failed or hung run.
#   harness/concurrent-race.sh HARNESS RACE_SO [VERSIONS] [RUNS]
# A Go race report in a c-shared library does not change the process's exit
# status by itself (the Go runtime's exit path never runs inside NCCL's process),
# so GORACE=halt_on_error=1 makes the first report end the rank with status 66,
# and stderr is searched for reports as well.
set -uo pipefail
H="$1"; SO="$2"; VERSIONS="${3:-12,11,10}"; RUNS="${4:-3}"
export GORACE="${GORACE:-halt_on_error=1}"
log="$(mktemp)"; trap 'rm -f "$log"' EXIT
fail=0
for v in ${VERSIONS//,/ }; do
  for run in $(seq 1 "$RUNS"); do
    "$H" concurrent --plugin "$SO" --versions "$v" "${@:5}" >"$log" 2>&1; rc=$?
    races=$(grep -c 'WARNING: DATA RACE' "$log")
    result=$(grep -E '^(PASS|FAIL) concurrent' "$log" | sed -n 1p)
    if [ "$rc" -ne 0 ] || [ "$races" -ne 0 ] || [[ "$result" != PASS* ]]; then
      echo "FAIL v$v run $run: exit $rc, $races race report(s): ${result:-no result line}"
      sed 's/^/    | /' "$log"
      fail=1
    else
      echo "ok   v$v run $run: ${result%%: rank 0*}, 0 race reports"
    fi
  done
done
[ $fail -eq 0 ] && echo "concurrent-race: no data race, no corrupt byte ($VERSIONS, $RUNS runs each)" \
               || echo "concurrent-race: FAILED"
exit $fail
