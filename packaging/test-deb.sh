#!/usr/bin/env bash
# The Debian package end to end (make test-deb), as CI runs it:
#   1. lintian: no error or warning (info tags are printed);
#   2. dpkg -i on this machine, then the installed command checks the
#      installed library: --version, devices, env, and a selftest that loads
#      libnccl-net-go.so by name from the system library path, as
#      NCCL_NET_PLUGIN=go makes NCCL do;
#   3. dpkg --purge, and every file the package brought is gone.
# It leaves the machine as it found it: it refuses to run when the package or
# any of its files is already there (an install over them, and the removal
# after it, would change the machine), and it purges on any failure.
#   packaging/test-deb.sh build/libnccl-net-go_<version>_amd64.deb
set -euo pipefail
deb=${1:?usage: $0 PACKAGE.deb}
pkg=libnccl-net-go
log() { echo "test-deb: $*"; }
fail() { log "FAIL: $*"; exit 1; }
[ -f "$deb" ] || fail "$deb does not exist (make deb)"
deb=$(realpath "$deb")
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || fail "installing a package needs root (or sudo)"
  SUDO=sudo
fi
for t in lintian dpkg dpkg-deb flock; do command -v "$t" >/dev/null || fail "$t not found (make deps installs lintian)"; done

# One test-deb at a time on a machine (dpkg has one database).
exec 9>/tmp/ncclnet-go-test-deb.lock
flock -x 9

log "lintian $(lintian --version | sed 's/^Lintian v//')"
lintian --display-info --fail-on error,warning "$deb" 2>&1 | grep -v 'running with root privileges' || true
lintian --fail-on error,warning "$deb" >/dev/null 2>&1 || fail "lintian reports errors or warnings (above)"
log "lintian: no error, no warning"

version=$(dpkg-deb -f "$deb" Version)
mapfile -t files < <(dpkg-deb -c "$deb" | awk '{ sub(/^\./, "", $6); print $6 }' | grep -v '/$')
[ "${#files[@]}" -gt 10 ] || fail "the package holds only ${#files[@]} files"
status=$(dpkg-query -W -f='${Status} ${Version}' "$pkg" 2>/dev/null || true)
case "$status" in *" installed "*) fail "$pkg is already installed ($status); remove it first (dpkg --purge $pkg) or run on a fresh machine" ;; esac
for f in "${files[@]}"; do
  [ ! -e "$f" ] || fail "$f already exists on this machine (another package, or make install PREFIX=/usr); the test would replace and then delete it"
done
if printf '%s\n' "${files[@]}" | grep -x /usr/lib/x86_64-linux-gnu/libnccl-net.so >/dev/null; then
  fail "the package ships libnccl-net.so, which would take over every NCCL job (docs/operations.md)"
fi

installed=0
cleanup() {
  local rc=$?
  if [ "$installed" = 1 ]; then
    log "purging $pkg after a failure"
    $SUDO dpkg --purge "$pkg" >/dev/null 2>&1 || log "dpkg --purge $pkg failed; remove it by hand"
  fi
  exit "$rc"
}
trap cleanup EXIT

log "dpkg -i $(basename "$deb")"
installed=1
$SUDO env DEBIAN_FRONTEND=noninteractive dpkg -i "$deb" || fail "dpkg -i failed"
[ "$(dpkg-query -W -f='${Status} ${Version}' "$pkg")" = "install ok installed $version" ] || fail "dpkg does not report $pkg $version installed"
for f in "${files[@]}"; do [ -e "$f" ] || fail "$f is in the package but not on disk"; done

bin=/usr/bin/ncclnet-go
[ "$("$bin" --version)" = "ncclnet-go $version" ] || fail "$bin --version says '$("$bin" --version)', want 'ncclnet-go $version'"
out=$("$bin" devices) || { echo "$out"; fail "ncclnet-go devices: the plugin's init would fail on this machine"; }
grep '^transport: ' <<<"$out" >/dev/null || { echo "$out"; fail "ncclnet-go devices names no transport"; }
log "installed ncclnet-go devices: $(grep '^transport: ' <<<"$out")"
out=$(env -i PATH="$PATH" HOME="${HOME:-/root}" "$bin" env) || { echo "$out"; fail "ncclnet-go env failed in a clean environment"; }
grep '^NCCL_GO_TIMEOUT ' <<<"$out" >/dev/null || { echo "$out"; fail "ncclnet-go env does not list NCCL_GO_TIMEOUT"; }

# The self-test loads the plugin by name, as NCCL_NET_PLUGIN=go makes NCCL
# do: found on the system library path, from the multiarch directory.
out=$("$bin" selftest --plugin go --size 4M --iters 4 --lat-iters 200) || { echo "$out"; fail "ncclnet-go selftest against the installed library failed"; }
while IFS= read -r l; do echo "  | $l"; done <<<"$out"
grep '^  library    /usr/lib/x86_64-linux-gnu/libnccl-net-go.so ' <<<"$out" >/dev/null ||
  fail "the selftest did not load /usr/lib/x86_64-linux-gnu/libnccl-net-go.so"

log "dpkg --purge $pkg"
$SUDO dpkg --purge "$pkg" || fail "dpkg --purge failed"
installed=0
case "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)" in *" installed") fail "$pkg is still installed" ;; esac
for f in "${files[@]}"; do [ ! -e "$f" ] || fail "$f is left after dpkg --purge"; done
for d in /usr/libexec/ncclnet-go /usr/share/libnccl-net-go /usr/share/doc/$pkg; do
  [ ! -e "$d" ] || fail "$d is left after dpkg --purge"
done
log "PASS: $(basename "$deb") installs, self-tests against the installed library and purges cleanly"
