#!/usr/bin/env bash
# Installs the Debian packages named on the command line that are not installed yet.
# Used by `make deps` (and so by `make test` and CI) on a fresh Debian 12 machine.
set -euo pipefail
# Not Debian (no dpkg/apt): say what the build expects and let it go on; a
# missing tool then fails the step that needs it. Without this, `make` and
# `make install` of an already built tree would fail on RHEL and the like.
if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
  echo "deps: no dpkg/apt-get here; not installing anything (Debian names: $*)" >&2
  exit 0
fi
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" >/dev/null || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps: installing ${missing[*]}"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
