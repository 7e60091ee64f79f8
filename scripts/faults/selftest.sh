#!/usr/bin/env bash
# make faults-selftest: the fault lane's checks can fail. Runs
# `ncclnet-harness faults` and the conformance checks peer-killed and
# peer-closed against
# scripts/faults/testdata/faultyplugin.c, a small plugin that works unless an
# environment variable gives it a defect, and requires a PASS without defects
# and the matching FAIL with each one.
#   scripts/faults/selftest.sh build/ncclnet-harness build/libnccl-net-faulty.so
set -uo pipefail
H=$1 SO=$2
fail=0
# check NAME WANT_RC PATTERN [VAR=VALUE...] -- HARNESS_ARGS...
check() {
  local name=$1 want=$2 pat=$3
  shift 3
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  local out rc
  out=$(env "${envs[@]}" timeout -k 5 120 "$H" "$@" --plugin "$SO" 2>&1)
  rc=$?
  echo "$out" | sed 's/^/    | /'
  if [ "$rc" -eq "$want" ] && grep -E -- "$pat" <<<"$out" >/dev/null; then
    echo "ok   - $name"
  else
    echo "FAIL - $name: exit $rc (want $want), pattern /$pat/ $(grep -E -- "$pat" <<<"$out" >/dev/null && echo found || echo missing)"
    fail=1
  fi
}
# The conformance check peer-killed accepts a completed receive from a killed
# peer only when every byte the peer sent landed.
check "peer-killed: a working plugin passes" 0 '^PASS v8 peer-killed \(after .*recv ncclSystemError' \
  -- conformance --versions 8 --only peer-killed
check "peer-killed: a receive cut short and reported complete fails" 1 \
  '^FAIL v8 peer-killed: .*reported success, but the bytes at offset [0-9]+ are not the peer.s' \
  FAULTY_DEAD_DONE=1 -- conformance --versions 8 --only peer-killed
# Its dying rank leaves a forked child behind that outlives the check.
check "peer-killed: a plugin whose forked children keep its sockets hangs" 1 \
  '^FAIL v8 peer-killed: .*still pending after' \
  FAULTY_FORK_KEEPS=1 -- conformance --versions 8 --only peer-killed --timeout 10
# peer-closed: the peer closes its send comm, alive; the receive it never
# filled must fail, not stay pending.
check "peer-closed: a working plugin passes" 0 '^PASS v8 peer-closed \(the orphaned receive failed' \
  -- conformance --versions 8 --only peer-closed
check "peer-closed: a plugin that never reports a closed peer hangs" 1 '^FAIL v8 peer-closed: .*still pending after' \
  FAULTY_IGNORE_PEER=1 -- conformance --versions 8 --only peer-closed --timeout 5
check "kill: a working plugin passes" 0 '^faults kill: PASS: 4 trials.* 0 hangs' -- faults kill --trials 4
check "kill: a plugin that never reports a dead peer hangs" 1 '^faults kill: FAIL: 2 trials.* 2 hangs' \
  FAULTY_IGNORE_PEER=1 -- faults kill --trials 2 --within 1
check "slow-recv: a plugin that waits for a late receiver passes" 0 '^faults slow-recv: PASS' -- faults slow-recv --size 16M --hold 1
check "stray: a working plugin passes" 0 '^faults stray: PASS' -- faults stray
check "stray: leaked descriptors are found" 1 'receiver: fds baseline ([0-9]+), right after close ([0-9]+)' \
  FAULTY_LEAK=1 -- faults stray
check "stray: a stray taken for the peer fails the transfer" 1 '^faults stray: FAIL' FAULTY_STRAY=1 -- faults stray
check "abort: a working plugin passes" 0 '^faults abort: PASS' -- faults abort --rounds 20
check "abort: leaked descriptors are found" 1 'descriptors open after close returned, baseline [0-9]+; still [0-9]+ 2 s later \(a leak\)' \
  FAULTY_LEAK=1 -- faults abort --rounds 20
check "transfer --expect error: a transfer that survives the fault fails" 1 'receiver: 8 x 1 MiB received.*' \
  -- faults transfer --size 1M --iters 8 --fault cmd --cmd true --fault-after 2 --expect error --within 1
[ $fail -eq 0 ] && echo "faults self-test passed" || echo "faults self-test FAILED"
exit $fail
