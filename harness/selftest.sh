#!/usr/bin/env bash
# Self-test of ncclnet-harness: run it against a deliberately broken plugin
# (harness/testdata/badplugin.c) and require the failures to be reported, the
# exit status to be 1 and a hang to be caught by the watchdog. This is what
# shows the conformance checks can fail.
# Given a working plugin as well, it checks what bench prints with --verbose.
#   harness/selftest.sh build/ncclnet-harness build/libnccl-net-bad.so [build/libnccl-net-go.so]
set -uo pipefail
H="$1"; BAD="$2"; GOOD="${3:-}"
fail=0
expect() { # expect <output> <pattern> <what>
  if grep -qE -- "$2" <<<"$1"; then echo "ok   - $3"; else echo "FAIL - $3: no line matching /$2/"; fail=1; fi
}
run() { # run <exit status wanted> <what> <command...>: shows its output, leaves it in $out
  local want=$1 what=$2 rc
  shift 2
  out="$("$@" 2>&1)"; rc=$?
  echo "$out" | sed 's/^/    | /'
  [ "$rc" -eq "$want" ] && echo "ok   - $what" || { echo "FAIL - $what: exit status $rc, want $want"; fail=1; }
}
run 1 "exit status 1 with failures" "$H" conformance --plugin "$BAD" --versions 8 --timeout 10
expect "$out" '^PASS v8 load$' "a valid table loads"
expect "$out" '^PASS v8 devices$' "devices > 0 passes"
expect "$out" '^FAIL v8 getProperties: .*pciPath .* is not an absolute path' "relative pciPath caught"
expect "$out" '^FAIL v8 getProperties-invalid-dev: ' "success for a missing device caught"
expect "$out" '^FAIL v8 connect-accept-nonblocking: .*connect returned ncclSystemError' "connect error caught"
expect "$out" '^[0-9]+ passed, [1-9][0-9]* failed$' "summary line"
run 1 "exit status 1 after a hang" env BADPLUGIN_HANG=1 "$H" conformance --plugin "$BAD" --versions 8 --timeout 3 --only connect-accept-nonblocking
expect "$out" '^FAIL v8 connect-accept-nonblocking: hung: rank 1 still inside "connect loop' "hang in connect caught by the watchdog"
expect "$out" '^0 passed, 1 failed$' "hung check counted once"
run 1 "concurrent: exit status 1 with a broken plugin" "$H" concurrent --plugin "$BAD" --versions 8 --timeout 10
expect "$out" '^FAIL concurrent v8: rank [01] .*connect returned ncclSystemError' "concurrent mode reports a failing connect"
run 1 "missing library fails" "$H" conformance --plugin /nonexistent/libnccl-net-x.so --versions 9
expect "$out" '^FAIL v9 load: dlopen' "dlopen error reported"
for n in 0 10 x; do
  run 2 "bench --rounds $n refused" "$H" bench --plugin "$BAD" --rounds "$n" bw
  expect "$out" "^ncclnet-harness: --rounds $n: use a count in 1\.\.9$" "bench --rounds $n says what to use"
done
if [ -n "$GOOD" ]; then
  # One size, two rounds of 8 MiB: every round's figure under the median.
  run 0 "bench --verbose runs" env NCCL_SOCKET_IFNAME=lo "$H" bench --plugin "$GOOD" --plugin-only --rounds 2 --size 65536 --bw-bytes 8M --verbose bw
  expect "$out" '^ +64 KiB +[0-9]+ +plugin +[0-9]+\.[0-9]{3} ' "bench --verbose prints the median row"
  expect "$out" '^ +rounds +[0-9]+\.[0-9]{3} [0-9]+\.[0-9]{3}$' "bench --verbose prints each of the 2 rounds"
  # Latency: each round's figure and where its slow round trips fell.
  run 0 "bench --verbose lat runs" env NCCL_SOCKET_IFNAME=lo "$H" bench --plugin "$GOOD" --plugin-only --rounds 2 --size 8 --iters 200 --verbose lat
  expect "$out" '^ +rounds +[0-9]+\.[0-9]{2} [0-9]+\.[0-9]{2}$' "bench --verbose lat prints each of the 2 rounds"
  expect "$out" '^ +slow +( [0-9]+){10} \|( [0-9]+){10}  \(round trips over 2\.5x' "bench --verbose lat maps each round's slow round trips by tenth"
fi
if [ -n "$GOOD" ]; then
  # Under an address-space limit that leaves the Go runtime less than it
  # reserves at load, the runtime exits the host process; the library's
  # preflight constructor must first say which limit to change.
  run 1 "transfer under ulimit -v 700000 fails" bash -c 'ulimit -v 700000 && exec "$@"' _ env NCCL_SOCKET_IFNAME=lo "$H" transfer --plugin "$GOOD" --size 1M --iters 1 --timeout 30
  expect "$out" 'NCCL WARN NET/Go : the address-space limit \(ulimit -v, RLIMIT_AS\) is 683 MiB.*raise or remove ulimit -v' "a too small RLIMIT_AS is named before the Go runtime exits"
fi
[ $fail -eq 0 ] && echo "harness self-test passed" || echo "harness self-test FAILED"
exit $fail
