#!/usr/bin/env bash
# Prints forkbox's boot and exec figures: medians (and p99) over repeated runs, with ratios
# measured in the same run. BENCH_BOOTS (default 5) and BENCH_EXECS (default 100) set the counts.
set -euo pipefail
cd "$(dirname "$0")/.."
export FORKBOX_BIN="$(scripts/build.sh)"
export FORKBOX_TEST_HOME="${FORKBOX_TEST_HOME:-/var/tmp/forkbox-test}"
cargo bench --quiet --locked -p forkbox-engine --bench boot
