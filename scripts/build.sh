#!/usr/bin/env bash
# Builds forkbox: the guest agent as a static binary (it runs as PID 1 in the guest, where there
# is no C library to link against), then the host binaries. Prints the path of the CLI.
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${FORKBOX_PROFILE:-release}"
triple="x86_64-unknown-linux-gnu"
# --target keeps the static flag off build scripts and proc macros, and puts the agent in its own
# directory, where the engine looks for it (target/$triple/agent/forkbox-agent).
RUSTFLAGS="-C target-feature=+crt-static" cargo build --quiet --locked -p forkbox-agent --profile agent --target "$triple"
cargo build --quiet --locked --profile "$profile" -p forkbox-cli
dir="$profile"; [ "$profile" = dev ] && dir=debug
echo "$PWD/target/$dir/forkbox"
