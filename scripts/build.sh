#!/usr/bin/env bash
# Builds forkbox: the guest agent as a static binary (it runs as PID 1 in the guest, where there
# is no C library to link against), then the host CLI. Prints the path of the CLI.
#   scripts/build.sh          agent + release CLI
#   scripts/build.sh agent    the agent only (the tests build the rest themselves)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/phases.sh
triple="x86_64-unknown-linux-gnu"
# On a terminal cargo draws its own progress bar; elsewhere (a log, CI) it would print a line per
# crate, and the phase's own line every 30 s says it is still building instead.
quiet=()
[ -t 2 ] || quiet=(--quiet)
# The cluster's etcd client is generated from etcd's .proto files when it is built: protoc.
if ! command -v protoc >/dev/null; then
  echo "== installing protobuf-compiler (protoc), which building the etcd client needs" >&2
  apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends protobuf-compiler >&2
fi
# --target keeps the static flag off build scripts and proc macros, and puts the agent in its own
# directory, where the engine looks for it (target/$triple/agent/forkbox-agent).
build_agent() {
  RUSTFLAGS="-C target-feature=+crt-static" cargo build "${quiet[@]}" --locked -p forkbox-agent --profile agent --target "$triple"
}
phase "building the guest agent (static, for x86_64 guests)" build_agent
if [ "${1:-}" = agent ]; then
  echo "$PWD/target/$triple/agent/forkbox-agent"
  exit 0
fi
phase "building the forkbox CLI (release)" cargo build "${quiet[@]}" --locked --release -p forkbox-cli
echo "$PWD/target/release/forkbox"
