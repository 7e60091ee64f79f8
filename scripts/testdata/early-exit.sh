#!/usr/bin/env bash
# Fixture for lint-pipes.sh: each pipeline below must be reported.
set -euo pipefail
p=$(/sbin/ldconfig -p | awk '$1 == "libc.so.6" {print $NF; exit}')
ls / | head -n1
dpkg -l |
  grep -q bash
ok=$(ls / | sed -n 1p)
[ -n "$p$ok" ] || false
