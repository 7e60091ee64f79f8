#!/bin/busybox sh
# shellcheck shell=dash
# /init of the Soft-RoCE lane guest (PID 1, busybox ash). It brings up one rxe
# device over a dummy netdev, mounts the host repository over 9p at the same path,
# runs the host's command under bash and a timeout, reports its exit status on the
# console as a marker line carrying the run's nonce, and powers off. Every wait is
# bounded: PID 1 exiting would panic the guest, so all paths end in report().
# Per-run settings come from /lane/run.conf, appended by run.sh as an overlay cpio.

# busybox ash runs its own applets ahead of PATH (its ip cannot create rdma links or
# veth pairs, its timeout differs from coreutils'): real tools are called by path.
export PATH=/usr/sbin:/usr/bin HOME=/root TERM=dumb LANG=C.UTF-8
LANE_NONCE=unset LANE_REPO="" LANE_CWD=/ LANE_TIMEOUT=300 LANE_SHARE=9p
RXE_NETDEV=rxenet0 RXE_ADDR=192.0.2.1/24 RXE_DEV=rxe0

report() {
  up=$(cut -d' ' -f1 /proc/uptime 2>/dev/null)
  echo "@@RDMA-LANE-EXIT:$LANE_NONCE:$1:${up:-?}@@"
  sync
  poweroff -f
  # poweroff -f does not return; if it ever did, PID 1 must not exit.
  while :; do sleep 60; done
}
fail() {
  echo "rdma-lane(guest): SETUP FAILED: $*"
  dmesg 2>/dev/null | grep -v 'speed is unknown' | tail -n 20
  report 125
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
[ -f /lane/run.conf ] || fail "/lane/run.conf missing (boot this image through scripts/rdma/run.sh)"
# shellcheck source=/dev/null
. /lane/run.conf
hostname rdma-lane

kver=$(cat /etc/rdma-lane/kernel)
while read -r mod args; do
  [ -n "$mod" ] || continue
  # shellcheck disable=SC2086 # args is a word list of module parameters
  insmod "/lib/modules/$kver/$mod" $args || fail "insmod $mod failed"
done </etc/rdma-lane/modules.load

if [ "$LANE_SHARE" = 9p ]; then
  mkdir -p "$LANE_REPO"
  # msize 500 KiB (the virtio transport maximum): large reads of test binaries and the plugin take a few round trips.
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=none repo "$LANE_REPO" ||
    fail "mounting the repository over 9p at $LANE_REPO failed"
fi

/usr/bin/ip link set lo up || fail "lo up"
/usr/bin/ip link add "$RXE_NETDEV" type dummy || fail "creating dummy netdev $RXE_NETDEV"
/usr/bin/ip addr add "$RXE_ADDR" dev "$RXE_NETDEV" || fail "address on $RXE_NETDEV"
# MTU 9000 gives rxe an active MTU of 4096, as on a jumbo-frame RoCE fabric.
/usr/bin/ip link set "$RXE_NETDEV" mtu 9000 || fail "mtu on $RXE_NETDEV"
/usr/bin/ip link set "$RXE_NETDEV" up || fail "$RXE_NETDEV up"
/usr/bin/rdma link add "$RXE_DEV" type rxe netdev "$RXE_NETDEV" || fail "rdma link add $RXE_DEV over $RXE_NETDEV"

# The port goes ACTIVE and the IPv4 RoCE v2 GID appears asynchronously after the
# address is set; NCCL (and our ib transport) picks the first IPv4 RoCE v2 GID.
port=/sys/class/infiniband/$RXE_DEV/ports/1
gid_index=""
i=0
while [ $i -lt 200 ]; do
  if grep -q ACTIVE "$port/state" 2>/dev/null; then
    for g in "$port"/gids/*; do
      n=${g##*/}
      case $(cat "$g" 2>/dev/null) in
        0000:0000:0000:0000:0000:ffff:*)
          [ "$(cat "$port/gid_attrs/types/$n" 2>/dev/null)" = "RoCE v2" ] && { gid_index=$n; break; } ;;
      esac
    done
    [ -n "$gid_index" ] && break
  fi
  sleep 0.1
  i=$((i + 1))
done
[ -n "$gid_index" ] || fail "$RXE_DEV port 1 not ACTIVE with an IPv4 RoCE v2 GID after 20 s (state: $(cat "$port/state" 2>/dev/null))"
[ -c /dev/infiniband/uverbs0 ] || fail "/dev/infiniband/uverbs0 missing (ib_uverbs not loaded?)"

# From here on only the command's own messages should reach the console.
dmesg -n 1
echo "rdma-lane(guest): $RXE_DEV over $RXE_NETDEV ($RXE_ADDR), RoCE v2 GID index $gid_index, kernel $kver, up $(cut -d' ' -f1 /proc/uptime) s"

cat >/lane/lane-env.sh <<EOF
export RDMA_LANE=1 RDMA_LANE_DEV=$RXE_DEV RDMA_LANE_NETDEV=$RXE_NETDEV RDMA_LANE_ADDR=${RXE_ADDR%/*} RDMA_LANE_GID_INDEX=$gid_index
export NCCL_IB_HCA=\${NCCL_IB_HCA:-$RXE_DEV} NCCL_SOCKET_IFNAME=\${NCCL_SOCKET_IFNAME:-$RXE_NETDEV}
EOF

kmsgs=$(dmesg | wc -l)
cd "$LANE_CWD" 2>/dev/null || cd "${LANE_REPO:-/}" || cd /
# coreutils timeout: its own process group, so a command's stray servers die with
# it; -k escalates to SIGKILL for commands that ignore SIGTERM.
/usr/bin/timeout -k 10 "$LANE_TIMEOUT" /usr/bin/bash /lane/cmd.sh </dev/null
rc=$?
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
  echo "rdma-lane(guest): the command was stopped after ${LANE_TIMEOUT} s (exit $rc)"
fi
# Kernel messages logged while a failing command ran (rxe warnings, OOM, hung
# tasks) are often the only clue; the boot messages before it are not.
if [ $rc -ne 0 ]; then
  new=$(dmesg | tail -n +$((kmsgs + 1)) | grep -v 'speed is unknown' | tail -n 30)
  [ -n "$new" ] && printf 'rdma-lane(guest): kernel messages while the command ran:\n%s\n' "$new"
fi
report $rc
