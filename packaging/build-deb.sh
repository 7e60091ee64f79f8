#!/usr/bin/env bash
# Builds the Debian package libnccl-net-go_<version>_amd64.deb from the built
# library, command and selftest helper (make deb):
#   /usr/lib/x86_64-linux-gnu/libnccl-net-go.so       the plugin
#   /usr/bin/ncclnet-go, /usr/libexec/ncclnet-go/ncclnet-go-selftest
#   /usr/share/libnccl-net-go/{grafana,prometheus}/    dashboard, alerting rules
#   /usr/share/doc/libnccl-net-go/                     docs, copyright, changelog
#   /usr/share/man/man1/ncclnet-go.1.gz
# The package does not provide libnccl-net.so (docs/operations.md says why).
#   packaging/build-deb.sh --version V --lib SO --cmd BIN --helper BIN --out DEB
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root_dir=$(cd "$here/.." && pwd)
version="" lib="" cmd="" helper="" out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --version) version=$2; shift 2 ;;
    --lib) lib=$2; shift 2 ;;
    --cmd) cmd=$2; shift 2 ;;
    --helper) helper=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "build-deb: unknown argument $1" >&2; exit 2 ;;
  esac
done
for v in version lib cmd helper out; do
  [ -n "${!v}" ] || { echo "usage: $0 --version V --lib SO --cmd BIN --helper BIN --out DEB" >&2; exit 2; }
done
for f in "$lib" "$cmd" "$helper"; do [ -f "$f" ] || { echo "build-deb: $f does not exist" >&2; exit 1; }; done
for t in dpkg-deb dpkg-shlibdeps strip gzip; do
  command -v "$t" >/dev/null || { echo "build-deb: $t not found (apt-get install dpkg-dev binutils)" >&2; exit 1; }
done
changelog_version=$(sed -n '1s/^libnccl-net-go (\([^)]*\)).*/\1/p' "$here/changelog")
[ "$changelog_version" = "$version" ] ||
  { echo "build-deb: packaging/changelog's newest entry is $changelog_version, the plugin is $version: add a changelog entry" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
pkg=$stage/pkg
multiarch=usr/lib/x86_64-linux-gnu
doc=$pkg/usr/share/doc/libnccl-net-go
umask 022
install -d "$pkg/DEBIAN" "$pkg/$multiarch" "$pkg/usr/bin" "$pkg/usr/libexec/ncclnet-go" "$doc" \
  "$pkg/usr/share/man/man1" "$pkg/usr/share/libnccl-net-go/grafana" "$pkg/usr/share/libnccl-net-go/prometheus" \
  "$pkg/usr/share/lintian/overrides"
install -m 0644 "$here/lintian-overrides" "$pkg/usr/share/lintian/overrides/libnccl-net-go"
install -m 0644 "$lib" "$pkg/$multiarch/libnccl-net-go.so"
install -m 0755 "$cmd" "$pkg/usr/bin/ncclnet-go"
install -m 0755 "$helper" "$pkg/usr/libexec/ncclnet-go/ncclnet-go-selftest"
# Symbols and debug information stay in the build tree; the dynamic symbol
# table NCCL needs (ncclNetPlugin_v*) is kept by --strip-unneeded.
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$pkg/$multiarch/libnccl-net-go.so" \
  "$pkg/usr/bin/ncclnet-go" "$pkg/usr/libexec/ncclnet-go/ncclnet-go-selftest"

install -m 0644 "$root_dir/deploy/grafana/ncclnet-go.json" "$pkg/usr/share/libnccl-net-go/grafana/"
install -m 0644 "$root_dir/deploy/prometheus/ncclnet-alerts.yml" "$root_dir/deploy/prometheus/ncclnet-alerts.test.yml" \
  "$pkg/usr/share/libnccl-net-go/prometheus/"
install -m 0644 "$root_dir/README.md" "$doc/README.md"
install -d "$doc/docs"
for f in "$root_dir"/docs/*.md; do install -m 0644 "$f" "$doc/docs/"; done
# Debian policy 12.3: documentation larger than 4 KiB is compressed.
find "$doc" -type f -size +4k -exec gzip -9n {} +
gzip -9n -c "$here/changelog" >"$doc/changelog.gz"
gzip -9n -c "$here/ncclnet-go.1" >"$pkg/usr/share/man/man1/ncclnet-go.1.gz"
GO=${GO:-go} "$here/gen-copyright.sh" "$lib" "$cmd" >"$doc/copyright"
chmod 0644 "$doc/copyright" "$doc/changelog.gz" "$pkg/usr/share/man/man1/ncclnet-go.1.gz"

# Dependencies from the binaries' dynamic linking (libc6 (>= ...)); libibverbs
# is dlopen'ed by the ib transport, hence Recommends.
mkdir -p "$stage/debian"
printf 'Source: libnccl-net-go\n\nPackage: libnccl-net-go\nArchitecture: amd64\n' >"$stage/debian/control"
depends=$(cd "$stage" && dpkg-shlibdeps -O -e"$pkg/$multiarch/libnccl-net-go.so" -e"$pkg/usr/bin/ncclnet-go" \
  -e"$pkg/usr/libexec/ncclnet-go/ncclnet-go-selftest" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
[ -n "$depends" ] || { echo "build-deb: dpkg-shlibdeps found no dependencies" >&2; exit 1; }
size=$(du -sk --exclude=DEBIAN "$pkg" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@SIZE@/$size/" -e "s/@DEPENDS@/$depends/" "$here/control.in" >"$pkg/DEBIAN/control"
(cd "$pkg" && find usr -type f -print0 | sort -z | xargs -0 md5sum) >"$pkg/DEBIAN/md5sums"
chmod 0644 "$pkg/DEBIAN/control" "$pkg/DEBIAN/md5sums"

mkdir -p "$(dirname "$out")"
dpkg-deb --root-owner-group -Zxz --build "$pkg" "$out" >/dev/null
echo "built $out ($(du -h "$out" | cut -f1), Depends: $depends)"
