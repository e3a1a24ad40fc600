#!/usr/bin/env bash
# Prints the path of Debian 12's own QEMU 7.2, unpacked (not installed) under
# $FORKBOX_TEST_HOME/qemu/7.2, to run forkbox on beside the QEMU `forkbox setup` installs:
#   FORKBOX_QEMU="$(scripts/qemu-7.2.sh)" forkbox ...
# The first call downloads qemu-system-x86, qemu-system-common (TCG is one of its modules) and
# qemu-system-data (microvm's qboot) with apt-get download and unpacks them (~15 s). Exits 77,
# saying why, where apt offers no QEMU 7.2 (not Debian 12).
set -euo pipefail
home="${FORKBOX_TEST_HOME:-/var/tmp/forkbox-test}"
dir="$home/qemu/7.2"
bin="$dir/usr/bin/qemu-system-x86_64"
if [ -x "$bin" ] && "$bin" --version | grep -q 'version 7\.2\.'; then
  echo "$bin"
  exit 0
fi
# bookworm's newest 7.2 (madison lists newest first); the data package is architecture-free and
# carries no binNMU suffix (+bN).
version_of() { apt-cache madison "$1" | awk -F'|' '{gsub(/ /, "", $2)} $2 ~ /^1:7\.2/ {print $2; exit}'; }
v=$(version_of qemu-system-x86)
data=$(version_of qemu-system-data)
if [ -z "$v" ] || [ -z "$data" ]; then
  echo "qemu-7.2: apt offers no QEMU 7.2 here (Debian 12's); nothing to compare with" >&2
  exit 77
fi
mkdir -p "$home/qemu"
tmp=$(mktemp -d "$home/qemu/.unpack.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"  # apt-get download drops to _apt where it can write
(cd "$tmp" && apt-get download -q "qemu-system-x86=$v" "qemu-system-common=$v" "qemu-system-data=$data" >&2)
for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$tmp/root"; done
"$tmp/root/usr/bin/qemu-system-x86_64" --version | grep -q 'version 7\.2\.' \
  || { echo "qemu-7.2: the unpacked QEMU does not run: $("$tmp/root/usr/bin/qemu-system-x86_64" --version 2>&1 | head -1)" >&2; exit 1; }
rm -rf "$dir"
mv "$tmp/root" "$dir"
echo "$bin"
