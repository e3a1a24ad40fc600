#!/usr/bin/env bash
# A KVM host for forkbox's tests, made on this machine: a Debian guest (L1) booted under TCG
# with an AMD CPU model, whose kernel loads kvm_amd (nested paging on) and so gives forkbox a
# working /dev/kvm; forkbox runs there as on a KVM host, its sandboxes (L2) under KVM.
# It proves the KVM path correct, not fast (3-7x slower than TCG here) and not isolated.
#
#   scripts/kvm-host.sh [--flavour bookworm|trixie] [--memory MIB] [--seed PATH]... [--timeout S] -- COMMAND...
#
# Builds the L1 root once per flavour into $FORKBOX_TEST_HOME/kvm-host/FLAVOUR (mmdebstrap,
# ~3 min), then boots it with this repository shared read-only at the same path (so binaries
# built here run there: L1's glibc is bookworm's or newer), a forkbox home of its own on a disk
# of its own at /var/tmp/forkbox-test (each --seed PATH, relative to $FORKBOX_TEST_HOME, is
# copied there first: a guest kernel, images), and runs COMMAND from the repository's root.
# COMMAND's output streams here; the script exits with COMMAND's status. It exits 77 and says
# why when this machine cannot be such a host (no QEMU with the fix it needs, too little memory).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

flavour=bookworm memory=6144 timeout=3600 seeds=()
while [ $# -gt 0 ]; do
  case "$1" in
    --flavour) flavour=$2; shift 2 ;;
    --memory) memory=$2; shift 2 ;;
    --seed) seeds+=("$2"); shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "kvm-host: unknown argument $1 (usage: scripts/kvm-host.sh [--flavour bookworm|trixie] [--memory MIB] [--seed PATH]... -- COMMAND...)" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "kvm-host: no command given (... -- COMMAND...)" >&2; exit 2; }
case "$flavour" in bookworm|trixie) ;; *) echo "kvm-host: flavour $flavour is not bookworm or trixie" >&2; exit 2 ;; esac

home="${FORKBOX_TEST_HOME:-/var/tmp/forkbox-test}"
skip() { echo "kvm-host: cannot run a KVM host here: $*" >&2; exit 77; }

# L0's QEMU must walk nested page tables in the guest's real mode (upstream b56617bbcb47), or
# L2's firmware cannot boot: in 7.2.15+, 9.1.2+ and 9.2+.
qemu=$(command -v qemu-system-x86_64) || skip "no qemu-system-x86_64 (run forkbox setup)"
ver=$("$qemu" --version | sed -n 's/^QEMU emulator version \([0-9]*\)\.\([0-9]*\)\.\([0-9]*\).*/\1 \2 \3/p')
read -r major minor micro <<<"$ver"
if ! { [ "$major" -gt 9 ] || { [ "$major" -eq 9 ] && { [ "$minor" -ge 2 ] || { [ "$minor" -eq 1 ] && [ "$micro" -ge 2 ]; }; }; } \
  || { [ "$major" -eq 7 ] && [ "$minor" -eq 2 ] && [ "$micro" -ge 15 ]; }; }; then
  skip "QEMU $major.$minor.$micro lacks the nested-paging fix for real mode (7.2.15+, 9.1.2+ or 9.2+ has it)"
fi
avail=$(awk '/^MemAvailable:/ {print int($2 / 1024)}' /proc/meminfo)
[ "$avail" -ge $((memory + 1024)) ] || skip "$avail MiB of memory available; the KVM host takes $memory MiB and the host needs 1 GiB beside it"

# The L1 root, once per flavour (under a lock: tests may ask at once).
# Named by the version of its PID 1 below: a changed one makes a new root.
dir="$home/kvm-host/$flavour-1"
mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9
if [ ! -f "$dir/root.img" ]; then
  echo "kvm-host: building the $flavour KVM host's root (once per machine, ~3 min)" >&2
  tmp="$dir/root.tmp"
  rm -rf "$tmp"
  # qemu-system-x86 and qemu-utils from one transaction (one version); the kernel with an
  # initramfs that finds virtio disks; what forkbox's daemon runs beside QEMU.
  mmdebstrap --variant=minbase --aptopt='APT::Install-Recommends "false"' \
    --include=linux-image-amd64,initramfs-tools,kmod,qemu-system-x86,qemu-utils,e2fsprogs,procps,iproute2,ca-certificates,util-linux \
    "$flavour" "$tmp" >&2
  cp "$tmp"/boot/vmlinuz-* "$dir/vmlinuz.tmp"
  cp "$tmp"/boot/initrd.img-* "$dir/initrd.img.tmp"
  # PID 1: reaches the run's directory and runs its init (written per run, below).
  install -m 0755 /dev/stdin "$tmp/sbin/kvm-host-init" <<'INIT'
#!/bin/bash
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mount -o remount,rw /
mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sys /sys
mountpoint -q /dev || mount -t devtmpfs dev /dev
modprobe 9pnet_virtio; modprobe 9p
mkdir -p /kvm-work && mount -t 9p -o trans=virtio,version=9p2000.L,msize=1048576 work /kvm-work
exec /bin/bash /kvm-work/init
INIT
  rm -f "$dir/root.img.tmp"
  mke2fs -q -t ext4 -d "$tmp" "$dir/root.img.tmp" 4G
  mv "$dir/vmlinuz.tmp" "$dir/vmlinuz"; mv "$dir/initrd.img.tmp" "$dir/initrd.img"
  mv "$dir/root.img.tmp" "$dir/root.img"
  rm -rf "$tmp"
fi
flock -u 9

# This run: its command, its home disk (seeded), its status.
run=$(mktemp -d "$home/kvm-host/run.XXXXXX")
trap 'rm -rf "$run"' EXIT
printf '%q ' "$@" > "$run/cmd"
{
  printf 'KVM_REPO=%q\n' "$repo"
  cat <<'INIT'
# The KVM host's init, after /kvm-work is mounted: what forkbox needs, kvm_amd, the command.
mkdir -p /dev/pts /dev/shm; mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run; mount -t tmpfs tmpfs /tmp; mount -t cgroup2 cgroup2 /sys/fs/cgroup
mkdir -p "$KVM_REPO" && mount -t 9p -o trans=virtio,version=9p2000.L,msize=1048576,ro repo "$KVM_REPO"
mkdir -p /var/tmp/forkbox-test && mount /dev/vdb /var/tmp/forkbox-test
ip link set lo up
hostname kvm-host
# /dev/kvm as Debian's udev rule makes it (no udev runs here): group kvm, mode 0660.
if modprobe kvm_amd && [ -c /dev/kvm ]; then
  groupadd -r kvm 2>/dev/null; chgrp kvm /dev/kvm && chmod 0660 /dev/kvm
  echo "kvm-host: /dev/kvm ready ($(uname -r), $(qemu-system-x86_64 --version | head -1))"
  (cd "$KVM_REPO" && bash /kvm-work/cmd) </dev/null
  echo $? > /kvm-work/rc
else
  echo "kvm-host: kvm_amd did not load: no /dev/kvm"; echo 125 > /kvm-work/rc
fi
sync; umount /var/tmp/forkbox-test; sync
echo o > /proc/sysrq-trigger
sleep 60
INIT
} > "$run/init"
mkdir "$run/seed"
for s in "${seeds[@]}"; do
  [ -e "$home/$s" ] || { echo "kvm-host: nothing at $home/$s to seed the KVM host's home with" >&2; exit 2; }
  mkdir -p "$run/seed/$(dirname "$s")"
  cp -a --reflink=auto "$home/$s" "$run/seed/$s"
done
mke2fs -q -t ext4 -d "$run/seed" "$run/home.img" 40G
rm -rf "$run/seed"

# One vCPU: with two, TCG's SVM (L0 QEMU 7.2) let a reschedule IPI that arrived while the
# other vCPU ran an L2 guest fault in L1's interrupt entry (a kernel panic within a minute of
# two KVM guests running).
echo "kvm-host: booting the $flavour KVM host (TCG, -cpu EPYC, $memory MiB)" >&2
timeout --kill-after=10 "$timeout" "$qemu" -M q35 -accel tcg,thread=multi -cpu EPYC -smp 1 -m "$memory" \
  -nodefaults -no-user-config -display none -no-reboot -serial stdio \
  -kernel "$dir/vmlinuz" -initrd "$dir/initrd.img" \
  -append "root=/dev/vda ro console=ttyS0 quiet loglevel=3 init=/sbin/kvm-host-init panic=-1 nowatchdog" \
  -drive "file=$dir/root.img,format=raw,if=virtio,snapshot=on" \
  -drive "file=$run/home.img,format=raw,if=virtio,cache=unsafe" \
  -virtfs "local,path=$repo,mount_tag=repo,security_model=none,readonly=on" \
  -virtfs "local,path=$run,mount_tag=work,security_model=none" </dev/null \
  2> >(grep -v "TCG doesn't support requested feature" >&2) &
vm=$!
# The KVM host goes with this script, however it ends.
trap 'kill "$vm" 2>/dev/null || true; wait "$vm" 2>/dev/null || true; rm -rf "$run"' EXIT
trap 'exit 143' TERM INT HUP
st=0
wait "$vm" || st=$?
[ -f "$run/rc" ] || { echo "kvm-host: the KVM host ended without the command's status (QEMU exit $st)" >&2; exit 125; }
exit "$(cat "$run/rc")"
