#!/usr/bin/env bash
# forkbox's main job end to end on a fresh Debian machine: build forkbox, install what it needs,
# build the old and the new toolchain's images, then port examples/legacykit from Python 3.9 to
# 3.13 with three plans in forks, accepting only ports that lose no test.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null || { echo "demo: cargo (Rust) is needed to build forkbox" >&2; exit 1; }
echo "== building and installing forkbox (scripts/install.sh: /usr/local/bin/forkbox, its guest agent in /usr/local/lib/forkbox)" >&2
forkbox=$(scripts/install.sh)
echo "== forkbox setup" >&2
"$forkbox" setup
echo "== building the images: Python 3.9 (bullseye), 3.13 (trixie), and 3.11 (bookworm, the default of forkbox run); skipped when up to date" >&2
"$forkbox" image build --if-changed -f images/python-bullseye.toml
"$forkbox" image build --if-changed -f images/python-trixie.toml
"$forkbox" image build --if-changed -f images/python-bookworm.toml
"$forkbox" image ls
echo "== forkbox migrate: examples/legacykit, Python 3.9 -> 3.13, plans in examples/plans" >&2
set +e
"$forkbox" migrate --config examples/migration.toml
code=$?
set -e
[ "$code" = 0 ] || { echo "demo: forkbox migrate exited with $code" >&2; exit "$code"; }
echo "== the winning patch applies to the original code:" >&2
git apply --check --directory=examples/legacykit forkbox-migrate-out/winner.patch && echo "git apply --check: ok"
