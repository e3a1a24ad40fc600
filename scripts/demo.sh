#!/usr/bin/env bash
# forkbox end to end on a fresh Debian machine: build forkbox, install what it needs, build the
# default image, then run commands in microVM sandboxes.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null || { echo "demo: cargo (Rust) is needed to build forkbox" >&2; exit 1; }
echo "== building forkbox" >&2
forkbox=$(scripts/build.sh)
echo "== forkbox setup" >&2
"$forkbox" setup
echo "== building the default image (skipped when it is up to date)" >&2
"$forkbox" image build --if-changed -f images/python-bookworm.toml
"$forkbox" image ls
echo "== the guest's Python and the guest's kernel (the host runs $(uname -r))" >&2
"$forkbox" run -- python3 -c 'import platform, sys; print(sys.version.split()[0], platform.release())'
echo "== a command's exit code is forkbox's exit code" >&2
set +e
"$forkbox" run -- sh -c 'exit 7'
code=$?
set -e
echo "forkbox run -- sh -c 'exit 7' exited with $code"
[ "$code" = 7 ]
