#!/usr/bin/env bash
# make install and make uninstall into a staging directory (make test-install):
#   - DESTDIR and PREFIX are both honoured: exactly the library, the
#     libnccl-net.so link (relative, to libnccl-net-go.so), the command and its
#     helper land under DESTDIR/PREFIX, with the modes install gives them;
#   - the staged command runs and reports the plugin's version;
#   - a staged install does not run ldconfig (it is not the live system);
#   - make uninstall with the same variables removes every file again, and
#     keeps a libnccl-net.so that is not our link.
# Needs no root and leaves nothing behind.
#   packaging/test-install.sh VERSION
set -euo pipefail
version=${1:?usage: $0 VERSION}
MAKE=${MAKE:-make}
log() { echo "test-install: $*"; }
fail() { log "FAIL: $*"; exit 1; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
prefix=/opt/ncclnet-test
vars=(DESTDIR="$stage" PREFIX="$prefix")

out=$("$MAKE" --no-print-directory install "${vars[@]}" 2>&1) || { echo "$out"; fail "make install failed"; }
! grep -i 'ldconfig' <<<"$out" >/dev/null || { echo "$out"; fail "a DESTDIR install ran or asked for ldconfig"; }
root=$stage$prefix
want=$(printf '%s\n' bin/ncclnet-go lib/libnccl-net-go.so lib/libnccl-net.so libexec/ncclnet-go/ncclnet-go-selftest)
got=$(cd "$root" && find . \( -type f -o -type l \) | sed 's|^\./||' | sort)
[ "$got" = "$want" ] || fail "installed files under DESTDIR/PREFIX are:
$got
want:
$want"
[ -z "$(find "$stage" -mindepth 1 -maxdepth 1 ! -name opt)" ] || fail "files outside \$DESTDIR\$PREFIX: $(find "$stage" -mindepth 1 -maxdepth 2)"
[ "$(readlink "$root/lib/libnccl-net.so")" = libnccl-net-go.so ] || fail "libnccl-net.so links to $(readlink "$root/lib/libnccl-net.so")"
for f in bin/ncclnet-go lib/libnccl-net-go.so libexec/ncclnet-go/ncclnet-go-selftest; do
  [ "$(stat -c %a "$root/$f")" = 755 ] || fail "$f has mode $(stat -c %a "$root/$f"), want 755"
done
[ "$("$root/bin/ncclnet-go" --version)" = "ncclnet-go $version" ] || fail "the installed ncclnet-go --version says '$("$root/bin/ncclnet-go" --version)'"
log "make install DESTDIR=... PREFIX=$prefix: $(wc -l <<<"$got") files where they belong"

# Someone else's libnccl-net.so survives make uninstall.
out=$("$MAKE" --no-print-directory uninstall "${vars[@]}" 2>&1) || { echo "$out"; fail "make uninstall failed"; }
left=$(cd "$stage" && find . \( -type f -o -type l \))
[ -z "$left" ] || fail "left after make uninstall: $left"
"$MAKE" --no-print-directory install "${vars[@]}" >/dev/null 2>&1 || fail "make install (again) failed"
ln -sf libnccl-net-other.so "$root/lib/libnccl-net.so"
"$MAKE" --no-print-directory uninstall "${vars[@]}" >/dev/null 2>&1 || fail "make uninstall (again) failed"
[ "$(readlink "$root/lib/libnccl-net.so")" = libnccl-net-other.so ] || fail "make uninstall removed a libnccl-net.so that was not ours"
log "PASS: make uninstall removes every file make install put there, and no one else's"
