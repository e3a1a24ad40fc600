#!/usr/bin/env bash
# Prints forkbox's figures with ratios measured in the same run:
#   boot  - QEMU floor, cold boot, `forkbox run -- true`, exec round trip (BENCH_BOOTS, BENCH_EXECS)
#   fork  - create from a template (median/p99 over BENCH_CREATES, default 50) against a cold
#           boot and the floor, the daemon's warm pool, fork of a running 1 GiB sandbox into
#           1/3/10 copies, snapshot pause at 100 MB and 1 GB dirty, PSS per idle fork
#   fork_running - fork of a running sandbox that wrote ~100 MB into 1/3/10/20 copies at 1 and
#           4 GiB, three generations, PSS per idle copy, idle CPU and memory per sandbox with 10
#           and BENCH_IDLE (default 100) alive
#   net   - secrets: an HTTPS request through a secret's connection against a plain CONNECT
#           tunnel; ports: 100 MB and HTTP requests through a forward against `podman run -p`
#           (or a veth into a namespace where podman cannot start a container)
#   console - the web console with 100 sandboxes: first paint and first draw in Chromium
#           (BENCH_LOADS), the daemon's idle CPU with no page, one page and ten event streams open
#           (BENCH_IDLE_SECS)
#   qemu  - QEMU 7.2 (Debian 12's) and 10.0 (what setup installs) side by side: the fork bench
#           under each with ratios 10/7.2, and mapped-ram against the plain stream (bench/qemu.sh)
# `bench/run.sh boot` (or fork, fork_running, net, console, qemu) runs one of them; no argument
# runs the first three.
set -euo pipefail
cd "$(dirname "$0")/.."
export FORKBOX_BIN="$(scripts/build.sh)"
scripts/build.sh agent >/dev/null
export FORKBOX_TEST_HOME="${FORKBOX_TEST_HOME:-/var/tmp/forkbox-test}"
for b in ${1:-boot fork fork_running}; do
    echo "== bench $b"
    if [ "$b" = qemu ]; then
        bench/qemu.sh
        continue
    fi
    pkg=forkbox-engine
    [ "$b" = console ] && pkg=forkbox-cli
    cargo bench --quiet --locked -p "$pkg" --bench "$b"
    echo
done
