#!/usr/bin/env bash
# Runs forkbox's tests, installing what they need first. Tests boot real VMs (TCG where KVM
# cannot run a standard guest); the guest kernel and images they share are made once per machine
# under $FORKBOX_TEST_HOME (default /var/tmp/forkbox-test).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== building the static guest agent" >&2
scripts/build.sh agent >/dev/null
echo "== installing host packages (forkbox setup)" >&2
cargo run --quiet --locked -p forkbox-cli -- setup
# The network tests serve HTTP from a network namespace they make (iproute2, python3).
if ! command -v ip >/dev/null || ! command -v python3 >/dev/null; then
  echo "== installing iproute2 and python3 for the network tests" >&2
  apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends iproute2 python3 >&2
fi
export FORKBOX_TEST_HOME="${FORKBOX_TEST_HOME:-/var/tmp/forkbox-test}"
# The corpus test (crates/migrate/tests/corpus.rs) runs real PyPI projects natively and through
# forkbox migrate; FORKBOX_CORPUS=0 leaves it out (it needs PyPI and a Debian mirror).
export FORKBOX_CORPUS="${FORKBOX_CORPUS:-1}"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --locked --workspace --no-fail-fast
else
  cargo test --locked --workspace --no-fail-fast
fi
