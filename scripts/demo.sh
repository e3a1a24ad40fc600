#!/usr/bin/env bash
# forkbox's main job end to end on a fresh Debian machine: build forkbox, install what it needs,
# build the old and the new toolchain's images, then port examples/legacykit from Python 3.9 to
# 3.13 with three plans in forks, accepting only ports that lose no test. Each phase says what it
# does, how long it has run every 30 s, and how long it took; the end lists them.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/phases.sh
started=$(date +%s)
command -v cargo >/dev/null || { echo "demo: cargo (Rust) is needed to build forkbox" >&2; exit 1; }
install_forkbox() { scripts/install.sh > "$1"; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
phase "building and installing forkbox (scripts/install.sh: /usr/local/bin/forkbox, its guest agent in /usr/local/lib/forkbox)" install_forkbox "$out"
forkbox=$(cat "$out")
phase "forkbox setup (QEMU, mmdebstrap, the guest kernel)" "$forkbox" setup
# Each build prints its steps with their times; skipped when up to date.
for image in python-bullseye python-trixie python-bookworm; do
  phase "building image $image (images/$image.toml)" "$forkbox" image build --if-changed -f "images/$image.toml"
done
"$forkbox" image ls
set +e
phase "forkbox migrate: examples/legacykit, Python 3.9 -> 3.13, plans in examples/plans" "$forkbox" migrate --config examples/migration.toml
code=$?
set -e
phases_summary
echo "== the demo took $(phases_took $(($(date +%s) - started)))" >&2
[ "$code" = 0 ] || { echo "demo: forkbox migrate exited with $code" >&2; exit "$code"; }
echo "== the winning patch applies to the original code:" >&2
git apply --check --directory=examples/legacykit forkbox-migrate-out/winner.patch && echo "git apply --check: ok"
