#!/usr/bin/env bash
# The CLI's own start-up figures, with ratios measured in the same run:
#   - `forkbox sandbox create`, BENCH_CREATES (default 20) back to back through the daemon,
#     with its warm pool at FORKBOX_POOL_SIZE (default 2) and at 10: median and p99 wall time;
#   - `forkbox run -- true` through the daemon (a ready copy from the pool), made in the CLI's
#     own process (FORKBOX_RUN_LOCAL=1), and `podman run --rm IMAGE true` (runc; IMAGE a
#     Debian bookworm minbase root imported once), interleaved, BENCH_RUNS (default 10) each.
# Installs podman and runc when missing (one apt transaction, as scripts/test.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
forkbox="$(scripts/build.sh)"
scripts/build.sh agent >/dev/null
# The test home, as the other benches (its kernel and images); its daemon is restarted with the
# pool sizes measured and stopped at the end: do not run the tests meanwhile.
export FORKBOX_HOME="${FORKBOX_TEST_HOME:-/var/tmp/forkbox-test}"
export FORKBOX_NO_TCG_NOTICE=1
creates="${BENCH_CREATES:-20}"
runs="${BENCH_RUNS:-10}"
need=()
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >&2
fi
podman --version >/dev/null && runc --version >/dev/null
if ! podman image exists localhost/forkbox-bench-debian; then
  root=$(mktemp -d)
  mmdebstrap --quiet --variant=minbase bookworm "$root/rootfs.tar" >&2
  podman import --quiet "$root/rootfs.tar" localhost/forkbox-bench-debian >/dev/null
  rm -rf "$root"
fi
ms() { local s e; s=$(date +%s%N); "$@" >/dev/null 2>&1; e=$(date +%s%N); echo $(( (e - s) / 1000000 )); }
# Back-to-back creates with a daemon whose pool keeps $1 ready copies (one sandbox of the image
# and size teaches the pool it first); prints the wall times.
creates_with_pool() {
  # (Called in a subshell: the daemon the first create starts inherits these.)
  export FORKBOX_POOL_SIZE="$1" FORKBOX_POOL_MEMORY_MIB=$(( $1 * 1024 + 1024 ))
  "$forkbox" daemon stop >/dev/null 2>&1 || true
  "$forkbox" sandbox rm "$("$forkbox" sandbox create)" >/dev/null
  sleep $(( 5 + 2 * $1 ))
  local times=() ids=() s e id
  for _ in $(seq "$creates"); do
    s=$(date +%s%N); id=$("$forkbox" sandbox create); e=$(date +%s%N)
    times+=($(( (e - s) / 1000000 ))); ids+=("$id")
  done
  "$forkbox" sandbox rm "${ids[@]}" >/dev/null
  echo "${times[*]}"
}
create_times=$(creates_with_pool "${FORKBOX_POOL_SIZE:-2}")
create_times_10=$(creates_with_pool 10)
# `run` against the default pool.
(creates_with_pool "${FORKBOX_POOL_SIZE:-2}" >/dev/null)
sleep 5
daemon_run=(); local_run=(); podman_run=()
for _ in $(seq "$runs"); do
  daemon_run+=($(ms "$forkbox" run -q -- true))
  local_run+=($(FORKBOX_RUN_LOCAL=1 ms "$forkbox" run -q -- true))
  podman_run+=($(ms podman run --rm --runtime runc --network none localhost/forkbox-bench-debian true))
  sleep 1
done
"$forkbox" daemon stop >/dev/null
python3 - "$create_times" "${daemon_run[*]}" "${local_run[*]}" "${podman_run[*]}" "$(nproc)" "$create_times_10" "${FORKBOX_POOL_SIZE:-2}" <<'PY'
import statistics, sys
def parse(s): return [int(x) for x in s.split()]
create, daemon, local, podman = (parse(a) for a in sys.argv[1:5])
create10 = parse(sys.argv[6])
def p99(v): v = sorted(v); return v[min(len(v) - 1, round(0.99 * (len(v) - 1)))]
def line(name, v): print(f"{name:<52} n={len(v):<3} median {statistics.median(v):6.0f} ms   p99 {p99(v):6.0f} ms   min {min(v):5d} ms")
print(f"forkbox CLI bench ({sys.argv[5]} cores)")
line(f"`forkbox sandbox create`, back to back (pool of {sys.argv[7]})", create)
line("`forkbox sandbox create`, back to back (pool of 10)", create10)
line("`forkbox run -- true` through the daemon (pool)", daemon)
line("`forkbox run -- true` in its own process", local)
line("`podman run --rm debian true` (runc)", podman)
m = statistics.median
print(f"ratios (same run): run through the daemon / podman {m(daemon) / m(podman):.2f}x; "
      f"in its own process / podman {m(local) / m(podman):.2f}x; create median / 100 ms goal "
      f"{m(create) / 100:.2f}x (pool of {sys.argv[7]}), {m(create10) / 100:.2f}x (pool of 10)")
PY
