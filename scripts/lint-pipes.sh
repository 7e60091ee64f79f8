#!/usr/bin/env bash
# lint-pipes.sh [FILE...]: under `set -o pipefail`, a reader that stops early
# (head, grep -q/-m, awk ... exit, sed ...q) kills its writer with SIGPIPE once
# the writer's output outgrows the 64 KiB pipe buffer, and the pipeline then fails
# with 141. Whether that happens depends on the machine (ldconfig -p crossed 64 KiB
# on CI's and not on ours), so such pipelines are refused here instead.
# With no FILE, checks every shell script in the repository that sets pipefail.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ $# -eq 0 ]; then
  mapfile -t files < <(git ls-files -- '*.sh' .ci/run | xargs grep -l 'pipefail' | grep -v '^scripts/testdata/')
  set -- "${files[@]}"
fi
# Joins continued lines, then looks for `| reader` where reader stops early.
perl -ne '
  BEGIN { $bad = 0 }
  if (defined $acc) { $acc .= $_ } else { $acc = $_; $start = $. }
  if ($acc =~ /(\||\\)\s*\n\z/) { next }
  $acc =~ s/#[^\n]*//g if $acc =~ /^\s*#/;
  if ($acc =~ /(?<![|])\|(?![|])\s*(head\b|grep\s+-[A-Za-z]*[qm]|awk\b[^|]*\bexit\b|sed\s+(-n\s+)?\x27?\d*q)/) {
    (my $l = $acc) =~ s/\s+/ /g;
    print "$ARGV:$start: early-exit reader in a pipefail pipeline: $l\n"; $bad = 1;
  }
  undef $acc;
  close ARGV if eof;
  END { exit $bad }
' "$@" || { echo "lint-pipes: read the whole input instead (sed -n 1p, grep >/dev/null, awk END)" >&2; exit 1; }
echo "lint-pipes: $# pipefail scripts checked, no early-exit readers"
