#!/usr/bin/env bash
# Builds forkbox: the guest agent as a static binary (it runs as PID 1 in the guest, where there
# is no C library to link against), then the host CLI. Prints the path of the CLI.
#   scripts/build.sh          agent + release CLI
#   scripts/build.sh agent    the agent only (the tests build the rest themselves)
set -euo pipefail
cd "$(dirname "$0")/.."
triple="x86_64-unknown-linux-gnu"
# The cluster's etcd client is generated from etcd's .proto files when it is built: protoc.
if ! command -v protoc >/dev/null; then
  echo "== installing protobuf-compiler (protoc), which building the etcd client needs" >&2
  apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends protobuf-compiler >&2
fi
# --target keeps the static flag off build scripts and proc macros, and puts the agent in its own
# directory, where the engine looks for it (target/$triple/agent/forkbox-agent).
RUSTFLAGS="-C target-feature=+crt-static" cargo build --quiet --locked -p forkbox-agent --profile agent --target "$triple"
if [ "${1:-}" = agent ]; then
  echo "$PWD/target/$triple/agent/forkbox-agent"
  exit 0
fi
cargo build --quiet --locked --release -p forkbox-cli
echo "$PWD/target/release/forkbox"
