#!/usr/bin/env bash
# Prepares what the Soft-RoCE lane boots, from Debian packages only:
#   .rdma/kernel/<kver>/vmlinuz + a module tree pruned to what the lane loads
#   .rdma/base.cpio      busybox, bash, iproute2, rdma-core tools, perftest, the rxe
#                        provider, every library they need, the modules, and /init
#   .rdma/base.files     the guest paths in base.cpio (run.sh adds only what is missing)
# It is idempotent and cheap when nothing changed, so run.sh calls it before every
# boot: a kernel update in Debian or an edit to the guest scripts rebuilds exactly
# the affected part. See docs/softroce-lane.md.
#
# Usage: scripts/rdma/setup.sh [--force] [--no-apt] [--quiet]
#   --force   rebuild the kernel tree and the initramfs even if they look current
#   --no-apt  do not install host packages (they must already be there)
# Environment: RDMA_LANE_DIR (default <repo>/.rdma), RDMA_LANE_KERNEL_PKG (use this
# concrete linux-image-* package instead of the one linux-image-amd64 depends on).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
state=${RDMA_LANE_DIR:-$repo/.rdma}
force=0 apt=1 quiet=0
for a in "$@"; do
  case $a in
    --force) force=1 ;;
    --no-apt) apt=0 ;;
    --quiet) quiet=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$a' (see --help)" >&2; exit 2 ;;
  esac
done

say() { [ "$quiet" = 1 ] || echo "rdma-setup: $*" >&2; }
die() { echo "rdma-setup: ERROR: $*" >&2; exit 1; }
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
t0=$(date +%s%N)

# The modules the guest loads, in this order (dependencies are resolved below).
# crc32_generic must come before rdma_rxe: rxe's ICRC needs the crc32 shash, and
# without it "rdma link add" fails with "failed to init crc32 algorithm".
MODULES="crc32_generic rdma_rxe ib_uverbs rdma_ucm dummy veth virtio_pci 9pnet_virtio 9p"

mkdir -p "$state"
# One setup at a time, and never while a run reads base.cpio (run.sh takes the lock
# shared), so concurrent `make test-rdma` invocations cannot see a half-built image.
exec 9>"$state/.lock"
flock -x -w 900 9 || die "timed out waiting for $state/.lock (another setup stuck?)"

# --- 1. host packages -------------------------------------------------------
mapfile -t packages < <(grep -v '^\s*#' "$here/packages.txt" | awk 'NF{print $1}')
if [ "$apt" = 1 ]; then
  "$repo/scripts/deps.sh" "${packages[@]}" || die "installing host packages failed: ${packages[*]}"
fi
for tool in qemu-system-x86_64 busybox ibv_devinfo ib_write_bw depmod modprobe cpio dpkg-deb apt-get ldd flock timeout; do
  command -v "$tool" >/dev/null || die "'$tool' is missing; install: ${packages[*]}"
done

# --- 2. the guest kernel ----------------------------------------------------
# The concrete image package that the linux-image-amd64 metapackage currently
# depends on: whatever Debian ships today, never a hard-coded ABI number.
kernel_pkg_from_apt() {
  apt-cache show --no-all-versions linux-image-amd64 2>/dev/null |
    sed -n 's/^Depends:.*\(linux-image-[0-9][^ ,|]*-amd64\).*/\1/p' | sed -n 1p
}
pkg=${RDMA_LANE_KERNEL_PKG:-}
if [ -z "$pkg" ]; then
  pkg=$(kernel_pkg_from_apt)
  if [ -z "$pkg" ]; then
    say "apt knows no linux-image-amd64 yet; running apt-get update"
    $SUDO apt-get update -qq || say "apt-get update failed"
    pkg=$(kernel_pkg_from_apt)
  fi
fi
if [ -z "$pkg" ]; then
  cached=$(cat "$state/kernel/current" 2>/dev/null || true)
  [ -n "$cached" ] && [ -f "$state/kernel/$cached/.done" ] ||
    die "cannot find which linux-image-*-amd64 package linux-image-amd64 depends on (apt-cache show linux-image-amd64), and no kernel is cached"
  say "apt cannot name the kernel package; using the cached kernel $cached"
  pkg=linux-image-$cached
fi
kver=${pkg#linux-image-}
kdir=$state/kernel/$kver
mods=$kdir/modules/lib/modules/$kver

if [ "$force" = 1 ] || [ ! -f "$kdir/.done" ]; then
  say "fetching $pkg (Debian's current linux-image-amd64 kernel)"
  rm -rf "$kdir"
  work=$(mktemp -d "$state/dl.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  # apt-get download drops privileges to _apt, which must be able to write here.
  chmod 0777 "$work"
  if ! (cd "$work" && apt-get download -q "$pkg" >/dev/null); then
    say "download failed; refreshing the package lists and retrying once"
    $SUDO apt-get update -qq || true
    (cd "$work" && apt-get download -q "$pkg" >/dev/null) || die "apt-get download $pkg failed"
  fi
  deb=$(ls "$work"/*.deb)
  dpkg-deb -x "$deb" "$work/x"
  rm -f "$deb"
  [ -f "$work/x/boot/vmlinuz-$kver" ] || die "$pkg has no boot/vmlinuz-$kver"
  full=$work/x/lib/modules/$kver
  [ -d "$full" ] || full=$work/x/usr/lib/modules/$kver
  [ -d "$full" ] || die "$pkg has no module tree for $kver"
  mbase=${full%/lib/modules/"$kver"}
  depmod -b "$mbase" "$kver"

  # Resolve load order with the host's modprobe against the unpacked tree; -C
  # /dev/null keeps the host's modprobe.d options out of the guest's list.
  mkdir -p "$mods"
  : >"$kdir/modules.load"
  declare -A seen=()
  for m in $MODULES; do
    out=$(modprobe -C /dev/null -d "$mbase" -S "$kver" --show-depends "$m" 2>&1) ||
      die "module $m is not in $pkg: $out"
    while read -r verb path _; do
      [ "$verb" = insmod ] || continue
      rel=${path#"$full"/}
      [ -n "${seen[$rel]:-}" ] && continue
      seen[$rel]=1
      mkdir -p "$mods/$(dirname "$rel")"
      cp "$path" "$mods/$rel"
      args=""
      # dummy creates dummy0 on load unless told not to; the lane names its own.
      [ "$(basename "$rel")" = dummy.ko ] && args=numdummies=0
      echo "$rel${args:+ $args}" >>"$kdir/modules.load"
    done <<<"$out"
  done
  for f in modules.order modules.builtin modules.builtin.modinfo; do
    [ -f "$full/$f" ] && cp "$full/$f" "$mods/"
  done
  depmod -b "$kdir/modules" "$kver"
  cp "$work/x/boot/vmlinuz-$kver" "$kdir/vmlinuz"
  cp "$work/x/boot/config-$kver" "$kdir/config" 2>/dev/null || true
  rm -rf "$work"
  trap - EXIT
  touch "$kdir/.done"
  say "kernel $kver: $(grep -c . "$kdir/modules.load") modules, $(du -sh "$kdir" | cut -f1) cached in $kdir"
fi
echo "$kver" >"$state/kernel/current"
# Older kernels are dead weight once Debian moved on.
for d in "$state"/kernel/*/; do
  [ "$(basename "$d")" = "$kver" ] || rm -rf "$d"
done

# --- 3. the base initramfs --------------------------------------------------
# Rebuilt whenever anything that goes into it changed: these scripts, the kernel,
# or the versions of the host packages whose files are copied in.
inputs=$( {
  echo "$kver"
  cat "$kdir/modules.load" "$here/setup.sh" "$here/guest-init.sh"
  dpkg-query -W -f='${Package} ${Version}\n' "${packages[@]}" bash libc6 libibverbs1 librdmacm1 libnl-3-200 2>/dev/null
} | sha256sum | cut -d' ' -f1)
if [ "$force" = 0 ] && [ -f "$state/base.cpio" ] && [ "$(cat "$state/base.stamp" 2>/dev/null)" = "$inputs" ]; then
  say "base initramfs is current ($(du -h "$state/base.cpio" | cut -f1))"
  exit 0
fi

say "building the base initramfs"
stage=$state/root.tmp
rm -rf "$stage"
mkdir -p "$stage"/{usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,usr/lib64,etc/libibverbs.d,proc,sys,dev,tmp,root,run,mnt,lane,var/tmp}
# Debian 12 is merged-/usr. The guest must be too, and an overlay cpio must never
# carry a real ./lib directory: it would replace this symlink and hide every library.
ln -s usr/bin "$stage/bin"; ln -s usr/sbin "$stage/sbin"
ln -s usr/lib "$stage/lib"; ln -s usr/lib64 "$stage/lib64"
chmod 1777 "$stage/tmp" "$stage/var/tmp"

# usrmerged PATH: the guest location of a host path (/lib/x -> /usr/lib/x, ...).
usrmerged() {
  case $1 in
    /bin/*|/sbin/*|/lib/*|/lib64/*) echo "/usr$1" ;;
    *) echo "$1" ;;
  esac
}
# put_file HOSTPATH: copies the file's content to its real (usrmerged) location in
# the guest, and recreates HOSTPATH as a symlink to it if HOSTPATH was a link.
put_file() {
  local src=$1 real dst name
  real=$(usrmerged "$(readlink -f "$src")")
  dst=$stage$real
  if [ ! -e "$dst" ]; then
    mkdir -p "$(dirname "$dst")"
    cp -L "$src" "$dst"
  fi
  name=$(usrmerged "$src")
  if [ "$name" != "$real" ] && [ ! -e "$stage$name" ] && [ ! -L "$stage$name" ]; then
    mkdir -p "$(dirname "$stage$name")"
    ln -s "$real" "$stage$name"
  fi
}
# put_elf FILE: the file plus every shared library ldd resolves for it.
put_elf() {
  local f=$1 lib
  put_file "$f"
  while read -r lib; do
    put_file "$lib"
  done < <(ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
  if ldd "$f" 2>/dev/null | grep 'not found' >/dev/null; then
    die "$f needs libraries that are not installed: $(ldd "$f" | grep 'not found' | tr -s ' \t' ' ')"
  fi
}
is_elf() { [ "$(head -c4 "$1" 2>/dev/null | od -An -c | tr -d ' ')" = '177ELF' ]; }

# Real tools: bash for user commands, iproute2's ip/rdma (busybox ip cannot make
# veth pairs or rdma links), coreutils timeout (exit 124, process-group kill), and
# every ELF tool of rdma-core and perftest; mawk because busybox awk lacks math.
tools=(bash ip rdma timeout mawk)
for t in "${tools[@]}"; do
  p=$(command -v "$t") || die "host tool $t missing"
  put_elf "$p"
done
for pkgname in ibverbs-utils rdmacm-utils perftest; do
  while read -r p; do
    [ -f "$p" ] && is_elf "$p" && put_elf "$p"
  done < <(dpkg -L "$pkgname" | grep -E '^/(usr/)?s?bin/')
done
# The plugin dlopens libibverbs.so.1, so ldd of the test binaries will not list it.
for lib in libibverbs.so.1 librdmacm.so.1 libnl-3.so.200 libnl-route-3.so.200; do
  p=$(/sbin/ldconfig -p | awk -v l="$lib" '$1==l && /x86-64/ && p == "" {p = $NF} END {print p}')
  [ -n "$p" ] || die "host library $lib not found (package list: ${packages[*]})"
  put_elf "$p"
done
# Only the rxe provider: libibverbs warns for every listed driver it cannot load.
prov=$(compgen -G '/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so' | sed -n 1p || true)
[ -n "$prov" ] || die "rxe provider library missing (package ibverbs-providers)"
put_elf "$prov"
# Without this file libibverbs silently reports zero devices.
echo "driver rxe" >"$stage/etc/libibverbs.d/rxe.driver"

ln -s mawk "$stage/usr/bin/awk"
# busybox provides everything else (sh for /init, mount, insmod, ...); real tools
# copied above win over its applets.
put_file "$(command -v busybox)"
bb=$(usrmerged "$(readlink -f "$(command -v busybox)")")
while read -r applet; do
  dst=$stage$(usrmerged "/$applet")
  [ -e "$dst" ] || [ -L "$dst" ] || { mkdir -p "$(dirname "$dst")"; ln -s "$bb" "$dst"; }
done < <(busybox --list-full)

cat >"$stage/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/bash
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
cat >"$stage/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
EOF
cat >"$stage/etc/hosts" <<'EOF'
127.0.0.1 localhost
192.0.2.1 rdma-lane
EOF
printf 'passwd: files\ngroup: files\nhosts: files\n' >"$stage/etc/nsswitch.conf"
echo rdma-lane >"$stage/etc/hostname"

mkdir -p "$stage/usr/lib/modules"
cp -a "$kdir/modules/lib/modules/$kver" "$stage/usr/lib/modules/"
mkdir -p "$stage/etc/rdma-lane"
cp "$kdir/modules.load" "$stage/etc/rdma-lane/modules.load"
echo "$kver" >"$stage/etc/rdma-lane/kernel"
install -m 0755 "$here/guest-init.sh" "$stage/init"

(cd "$stage" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) >"$state/base.cpio.tmp"
(cd "$stage" && find . -mindepth 1 | sed 's|^\.||' | LC_ALL=C sort) >"$state/base.files"
mv "$state/base.cpio.tmp" "$state/base.cpio"
echo "$inputs" >"$state/base.stamp"
rm -rf "$stage"
say "base initramfs $(du -h "$state/base.cpio" | cut -f1) for kernel $kver ready ($(( ($(date +%s%N) - t0) / 1000000 )) ms)"
