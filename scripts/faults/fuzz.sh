#!/usr/bin/env bash
# make fuzz: runs every Go fuzz target in the module (func FuzzXxx(f *testing.F)
# in a *_test.go file; CONVENTIONS.md 9) for FUZZTIME each, one after another,
# and fails on any crash, printing the input and the command that replays it.
# Targets are found anew on every run, so a package that adds one is fuzzed
# without touching this script.
#
#   FUZZTIME=15s scripts/faults/fuzz.sh [PACKAGE_DIR...]
#   FUZZ_PARALLEL  fuzzing workers per target (default 2, the CI machine's cores)
#
# A crash leaves its input in <package>/testdata/fuzz/<Target>/<hash>; commit it
# (it becomes a seed that every `go test` replays) together with the fix.
# A run that fails only with Go 1.26's fuzz-deadline race (no input, see
# deadline_race) is run once more, and is not a failure if that happens again.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-15s}
PARALLEL=${FUZZ_PARALLEL:-2}
export GOFLAGS=${GOFLAGS:--mod=mod}

# The watchdog for one target: its fuzz time plus room to compile.
case $FUZZTIME in
  *ms) limit=300 ;;
  *s) limit=$((${FUZZTIME%s} + 300)) ;;
  *m) limit=$((${FUZZTIME%m} * 60 + 300)) ;;
  *) limit=1800 ;; # Nx (iterations): no time to go by
esac

# Candidate directories by grep (fast), then the go tool's own list for each
# (it knows build tags and file names the grep does not).
if [ $# -gt 0 ]; then
  dirs=("$@")
else
  mapfile -t dirs < <(git ls-files --cached --others --exclude-standard -- '*_test.go' | xargs grep -l '^func Fuzz[A-Za-z0-9_]*(' 2>/dev/null |
    xargs -r -n1 dirname | sort -u)
fi
targets=()
for d in "${dirs[@]}"; do
  list=$("$GO" test -list '^Fuzz' "./$d" 2>&1) || { echo "fuzz: cannot list the fuzz targets of ./$d:"; echo "$list"; exit 1; }
  while read -r name; do
    [[ $name == Fuzz* ]] && targets+=("$d $name")
  done <<<"$list"
done
if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz: FAIL: no fuzz targets found in the module (tools/impair has some: is the checkout complete?)"
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, $FUZZTIME each, $PARALLEL workers"

failed=0
summary=()
# deadline_race FILE: the run failed only because Go's fuzz coordinator raced
# its own -fuzztime deadline (go.dev/issue/75804, fixed in Go 1.27): a bare
# "context deadline exceeded" with no input written, no panic, no hang. Such a
# run fuzzed its whole time and found nothing.
deadline_race() {
  grep -F 'context deadline exceeded' "$1" >/dev/null || return 1
  # What a real finding prints: the input it wrote, a panic, a hang, a t.Error line.
  ! grep -E 'Failing input written to|panic:|hung or terminated|^ +[A-Za-z0-9_]+\.go:[0-9]+: ' "$1" >/dev/null
}

failed=0
summary=()
for t in "${targets[@]}"; do
  read -r dir name <<<"$t"
  echo
  echo "=== fuzz: ./$dir $name ==="
  out=$(mktemp)
  t0=$SECONDS
  note=""
  for attempt in 1 2; do
    timeout -k 10 "$limit" "$GO" test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" -parallel "$PARALLEL" "./$dir" >"$out" 2>&1
    rc=$?
    grep -E '^(fuzz:|ok|FAIL|---|panic:|\s+[a-z_]+\.go:[0-9]+)' "$out" | tail -n 40
    if [ "$rc" -eq 0 ] || ! deadline_race "$out"; then break; fi
    note=" (run $attempt of 2 ended in Go's fuzz deadline race, go.dev/issue/75804, with no input found)"
    echo "fuzz: $name:$note"
    [ $attempt -eq 2 ] && rc=0 # fuzzed its time twice and found nothing: not a finding
  done
  execs=$(grep -oE 'execs: [0-9]+' "$out" | tail -n 1)
  if [ "$rc" -eq 0 ]; then
    summary+=("$(printf 'PASS  %-28s %-24s %4ss  %s%s' "./$dir" "$name" $((SECONDS - t0)) "${execs:-}" "$note")")
  else
    failed=1
    why="exit $rc"
    { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; } && why="watchdog: still running after ${limit}s"
    summary+=("$(printf 'FAIL  %-28s %-24s %4ss  %s' "./$dir" "$name" $((SECONDS - t0)) "$why")")
    echo "--- fuzz: $name failed ($why); full output:"
    sed 's/^/    /' "$out"
    # go test names the input it wrote; show it, and how to replay it.
    input=$(grep -oE 'testdata/fuzz/[A-Za-z0-9_]+/[0-9a-f]+' "$out" | tail -n 1)
    if [ -n "$input" ] && [ -f "$dir/$input" ]; then
      echo "--- the failing input ($dir/$input):"
      sed 's/^/    /' "$dir/$input"
      echo "--- replay: $GO test -run '^$name/$(basename "$input")\$' ./$dir"
      echo "    (commit $dir/$input with the fix: it becomes a seed every go test runs)"
    fi
  fi
  rm -f "$out"
done
echo
echo "=== fuzz summary ($FUZZTIME per target) ==="
printf '  %s\n' "${summary[@]}"
exit $failed
