#!/usr/bin/env bash
# Writes the machine-readable debian/copyright of the package to stdout: the
# project's own files, the Go standard library, and every Go module linked
# into the given binaries (from `go version -m`), each with the copyright
# lines and the license found in the module's own files.
#   packaging/gen-copyright.sh BINARY...
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 BINARY..." >&2; exit 2; }
GO=${GO:-go}
modcache=$("$GO" env GOMODCACHE)
goroot=$("$GO" env GOROOT)

# indent FILE: a license text as a DEP-5 field continuation.
indent() { sed -e 's/[[:space:]]*$//' -e 's/^$/./' -e 's/^/ /' "$1"; }

# license_id FILE: the SPDX-style name Debian uses for the text in FILE.
license_id() {
  if grep 'Apache License' "$1" >/dev/null && grep 'Version 2.0' "$1" >/dev/null; then echo Apache-2.0
  elif grep 'Permission is hereby granted, free of charge' "$1" >/dev/null; then echo Expat
  elif grep 'Redistribution and use in source and binary forms' "$1" >/dev/null; then
    if grep -i 'Neither the name' "$1" >/dev/null; then echo BSD-3-clause; else echo BSD-2-clause; fi
  else return 1
  fi
}

# copyright_lines DIR: the copyright notices of a module (NOTICE first).
copyright_lines() {
  local f lines=""
  for f in "$1"/NOTICE* "$1"/LICENSE* "$1"/COPYING*; do
    [ -f "$f" ] || continue
    lines+=$(grep -E '^[[:space:]]*Copyright (\([cC]\) )?[0-9]' "$f" | sed -e 's/^[[:space:]]*Copyright[[:space:]]*//' -e 's/^([cC])[[:space:]]*//' -e 's/[[:space:]]*All rights reserved\.\{0,1\}//' || true)
    lines+=$'\n'
  done
  lines=$(sed '/^$/d' <<<"$lines" | sort -u)
  [ -n "$lines" ] || return 1
  sed '2,$s/^/ /' <<<"$lines"
}

cat <<'HEAD'
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: libnccl-net-go
Comment: The library and the command are statically linked Go programs: the
 Go standard library and the Go modules listed below are part of both.

Files: *
Copyright: 2026 The libnccl-net-go authors
License: libnccl-net-go
 The libnccl-net-go authors have not published license terms for this
 software yet. Until they do, no license is granted beyond what applicable
 law allows.
HEAD

apache=0
printf '\nFiles: golang/*\nCopyright: %s\nComment: The Go standard library and runtime (%s), linked into both binaries.\nLicense: BSD-3-clause\n' \
  "$(copyright_lines "$goroot")" "$("$GO" env GOVERSION)"
indent "$goroot/LICENSE"

declare -A seen=()
while read -r kind path ver _; do
  [ "$kind" = dep ] || continue
  [ -z "${seen[$path@$ver]:-}" ] || continue
  seen[$path@$ver]=1
  # Module paths are case-encoded in the cache (!x for X).
  # shellcheck disable=SC2001
  enc=$(sed -e 's/[A-Z]/!\L&/g' <<<"$path")
  dir="$modcache/$enc@$ver"
  lic=""
  for f in "$dir"/LICENSE* "$dir"/COPYING* "$dir"/LICENCE*; do [ -f "$f" ] && { lic=$f; break; }; done
  [ -n "$lic" ] || { echo "gen-copyright: no license file in $dir for $path $ver" >&2; exit 1; }
  id=$(license_id "$lic") || { echo "gen-copyright: unrecognised license in $lic" >&2; exit 1; }
  copy=$(copyright_lines "$dir") || copy="$path authors"
  printf '\nFiles: go-modules/%s/*\nCopyright: %s\nComment: Go module %s %s, statically linked.\nLicense: %s\n' "$path" "$copy" "$path" "$ver" "$id"
  if [ "$id" = Apache-2.0 ]; then apache=1; else indent "$lic"; fi
done < <(for b in "$@"; do "$GO" version -m "$b" | sed 's/^[[:space:]]*//'; done | sort -k2,2 -k3,3 -u)

if [ "$apache" = 1 ]; then
  printf '\nLicense: Apache-2.0\n On Debian systems, the complete text of the Apache License, Version 2.0\n can be found in "/usr/share/common-licenses/Apache-2.0".\n'
fi
