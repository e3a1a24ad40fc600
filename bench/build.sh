#!/usr/bin/env bash
# How long building forkbox takes, as scripts/install.sh builds it (the static guest agent, then
# the release CLI), in one run:
# - fresh: into an empty target directory (the crates' sources already downloaded; with
#   BENCH_EMPTY_REGISTRY=1 a CARGO_HOME of its own makes cargo fetch every crate first);
# - after touching one engine file (crates/engine/src/image/store.rs): what a developer waits for;
# - the crates in the lock file, and the ten units that took longest (cargo's --timings report,
#   kept as target's cargo-timings/cargo-timing.html).
# Prints the figures beside the goal (the install within 8 minutes on a fresh 2-core machine).
# BENCH_TARGET=DIR reuses a target directory (then "fresh" is only fresh the first time).
set -euo pipefail
cd "$(dirname "$0")/.."
target="${BENCH_TARGET:-$(mktemp -d /var/tmp/forkbox-bench-build.XXXXXX)}"
export CARGO_TARGET_DIR="$target"
if [ "${BENCH_EMPTY_REGISTRY:-0}" = 1 ]; then
  export CARGO_HOME="$target/cargo-home"
  mkdir -p "$CARGO_HOME"
fi
triple="x86_64-unknown-linux-gnu"
secs() { echo $(( $(date +%s) - $1 )); }
build() {
  RUSTFLAGS="-C target-feature=+crt-static" cargo build --quiet --locked -p forkbox-agent --profile agent --target "$triple"
  cargo build --quiet --locked --release -p forkbox-cli --timings
}
crates=$(grep -c '^name = ' Cargo.lock)
s=$(date +%s)
build 2>"$target/fresh.log"
fresh=$(secs "$s")
touch crates/engine/src/image/store.rs
s=$(date +%s)
build 2>"$target/touched.log"
touched=$(secs "$s")
report=$(ls -t "$target"/cargo-timings/cargo-timing-*.html | tail -1)
echo "crates in Cargo.lock:                 $crates"
echo "fresh build (agent + release CLI):    ${fresh} s ($(( fresh / 60 )) min $(( fresh % 60 )) s); goal 480 s: $(awk "BEGIN{printf \"%.2f\", $fresh/480}") of it"
echo "after touching one engine file:       ${touched} s"
echo "the ten longest units of the fresh build (s, from $report):"
# cargo's timing report embeds its units as JSON: name, version, target and duration.
python3 - "$report" <<'EOF'
import json, re, sys
html = open(sys.argv[1]).read()
units = json.loads(re.search(r"const UNIT_DATA = (\[.*?\]);\n", html, re.S).group(1))
for u in sorted(units, key=lambda u: -u["duration"])[:10]:
    print(f"  {u['duration']:7.1f}  {u['name']} {u['version']}{u['target']}")
EOF
[ -n "${BENCH_TARGET:-}" ] || rm -rf "$target"
