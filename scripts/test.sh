#!/usr/bin/env bash
# Runs forkbox's tests, installing what they need first. Tests boot real VMs (TCG where KVM
# cannot run a standard guest); the guest kernel and images they share are made once per machine
# under $FORKBOX_TEST_HOME (default /var/tmp/forkbox-test).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/phases.sh
# The SDK tests (crates/cli/tests/sdk.rs) make a Python venv from PyPI and run `npm ci` from
# npm's registry; they need Node 18+ with npm and Python's venv module (Debian's packages).
# The demo test opens the migration report in headless Chromium.
# The network tests serve HTTP from a network namespace they make (iproute2, python3). All of it
# in one apt transaction, and Node with its npm only when there is no Node at all (a Node from
# elsewhere carries its own npm, and Debian's npm would replace that Node).
need=()
command -v ip >/dev/null || need+=(iproute2)
command -v python3 >/dev/null || need+=(python3)
command -v node >/dev/null || need+=(nodejs npm)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
# The migration report is checked as a person sees it, in headless Chromium.
command -v chromium >/dev/null || need+=(chromium)
# The registry tests run a real OCI registry on loopback, push the images they write with
# skopeo, and protect one with an htpasswd file.
command -v docker-registry >/dev/null || need+=(docker-registry)
command -v skopeo >/dev/null || need+=(skopeo)
command -v htpasswd >/dev/null || need+=(apache2-utils)
# The cluster tests run a real 3-member etcd (Debian's etcd-server, etcdctl from etcd-client);
# building the etcd client needs protoc.
command -v etcd >/dev/null || need+=(etcd-server)
command -v etcdctl >/dev/null || need+=(etcd-client)
command -v protoc >/dev/null || need+=(protobuf-compiler)
command -v curl >/dev/null || need+=(curl)
# E2B's domain mode is tested with a resolver of the test's own (dnsmasq, without its service).
command -v dnsmasq >/dev/null || need+=(dnsmasq-base)
# The deployment test renders deploy/kubernetes with kubectl's kustomize (a kubectl of 1.2x or
# newer; Debian's kubernetes-client is the fallback where none is installed).
command -v kubectl >/dev/null || need+=(kubernetes-client)
if [ "${#need[@]}" -gt 0 ]; then
  echo "== installing ${need[*]} for the network, cluster and SDK tests" >&2
  apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >&2
fi
for p in ip python3 node chromium docker-registry skopeo htpasswd etcd etcdctl protoc curl kubectl dnsmasq; do
  command -v "$p" >/dev/null || { echo "test: $p is still missing after the install" >&2; exit 1; }
done
# A run on a fresh machine writes ~15 GB of build output (~16 GB more of rustc's incremental
# state unless CARGO_INCREMENTAL=0) and ~30 GB under the test home (images, templates, corpora,
# each test's home, a guest disk filled on purpose): say so now rather than fail tests mid-run.
export FORKBOX_TEST_HOME="${FORKBOX_TEST_HOME:-/var/tmp/forkbox-test}"
mkdir -p "$FORKBOX_TEST_HOME" target
free_gib() { df --output=avail -BG "$1" | tail -1 | tr -dc 0-9; }
free=$(free_gib "$FORKBOX_TEST_HOME")
if [ "$free" -lt 8 ]; then
  echo "test: only ${free} GiB free under $FORKBOX_TEST_HOME; a run needs up to 45 on a fresh machine, less with images made (free some, or set FORKBOX_TEST_HOME elsewhere)" >&2
  exit 1
fi
dirs=("$FORKBOX_TEST_HOME")
[ "$(stat -c %d target)" = "$(stat -c %d "$FORKBOX_TEST_HOME")" ] || dirs+=(target)
for d in "${dirs[@]}"; do
  free=$(free_gib "$d")
  if [ "$free" -lt 45 ]; then
    echo "== note: ${free} GiB free under $d; a run on a fresh machine writes up to ~45 GB (build output and the test home), less with images made" >&2
  fi
done
# Each test's own home (homes/, fresh/) starts empty, as a user's first run does: what an
# earlier run left there (the snapshots a test took, a daemon's database) goes, unless something
# is still mounted under it. The shared images, templates, corpora and venvs stay.
for d in homes fresh; do
  p="$FORKBOX_TEST_HOME/$d"
  [ -d "$p" ] || continue
  if findmnt -rn -o TARGET | grep -q "^$p/"; then
    echo "== note: something is mounted under $p; it is left as it is" >&2
  else
    rm -rf --one-file-system "$p"
  fi
done
scripts/build.sh agent >/dev/null
phase "building the forkbox CLI (debug) and installing host packages (forkbox setup)" \
  cargo run --quiet --locked -p forkbox-cli -- setup
command -v npm >/dev/null || { echo "test: this Node ($(command -v node)) has no npm; install the npm that goes with it" >&2; exit 1; }
node -e 'process.exit(Number(process.versions.node.split(".")[0]) < 18 ? 1 : 0)' \
  || { echo "test: the TypeScript SDK needs Node 18 or newer; this is $(node --version)" >&2; exit 1; }
# The corpus test (crates/migrate/tests/corpus.rs) runs real PyPI projects natively and through
# forkbox migrate, as do the npm, Go, Rust and Java corpora (corpus_js.rs, corpus_go.rs,
# corpus_rust.rs, corpus_java.rs; one Go library, one crate and one Maven project by default,
# every one with FORKBOX_CORPUS=all);
# FORKBOX_CORPUS=0 leaves them out (they need PyPI, npm, crates.io and a Debian mirror).
export FORKBOX_CORPUS="${FORKBOX_CORPUS:-1}"
# A daemon with E2B's API builds E2B's templates it lacks as it starts; the tests' daemons share
# the images the tests make, and the one test of that start says --e2b-prebuild itself.
export FORKBOX_E2B_PREBUILD="${FORKBOX_E2B_PREBUILD:-none}"
status=0
if cargo nextest --version >/dev/null 2>&1; then
  # cargo builds the test binaries first (silent for minutes on one large crate), then nextest
  # names each test as it ends and every 30 s each one still running.
  phase "building the tests and running them (cargo nextest, two at a time)" \
    cargo nextest run --locked --workspace --no-fail-fast || status=$?
  # The slowest tests, from the run's JUnit report (where the test time goes).
  python3 scripts/slowest.py target/nextest/default/junit.xml 20 || true
else
  phase "building the tests and running them (cargo test)" \
    cargo test --locked --workspace --no-fail-fast || status=$?
fi
phases_summary
exit "$status"
