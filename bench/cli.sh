#!/usr/bin/env bash
# The CLI's own start-up figures, with ratios measured in the same run:
#   - `forkbox sandbox create`, BENCH_CREATES (default 20) back to back through the daemon,
#     with its warm pool at the default settings and at 10, a first burst and the next one (the
#     pool learns bursts): median and p99 wall time;
#   - `forkbox run -- true` through the daemon (a ready copy from the pool), made in the CLI's
#     own process (FORKBOX_RUN_LOCAL=1), and `podman run --rm IMAGE true` (runc; IMAGE a
#     Debian bookworm minbase root imported once), interleaved, BENCH_RUNS (default 10) each.
#   - with BENCH_BASELINE=PATH (another build's forkbox, e.g. the commit before a change),
#     each `run` of the two above by that binary too, interleaved with this build's: an A/B in
#     one run (Firecracker's ab_test habit), with the ratios of the medians.
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
# Back-to-back creates with a daemon whose pool keeps $1 ready copies (the default settings
# when $1 is "default"; one sandbox of the image and size teaches the pool it first): the wall
# times of a first burst, then of a second one once the pool has refilled after the first (it
# keeps as many as the most creates it saw within a minute, up to FORKBOX_POOL_MAX), as
# "FIRST|SECOND".
creates_with_pool() {
  # (Called in a subshell: the daemon the first create starts inherits these.)
  if [ "$1" != default ]; then
    export FORKBOX_POOL_SIZE="$1" FORKBOX_POOL_MEMORY_MIB=$(( $1 * 1024 + 1024 ))
  fi
  "$forkbox" daemon stop >/dev/null 2>&1 || true
  "$forkbox" sandbox rm "$("$forkbox" sandbox create)" >/dev/null
  pool_full 60
  burst
  echo -n "|"
  pool_full 120
  burst
}
# Waits up to $1 s for every configuration of the pool to hold what it keeps.
pool_full() {
  for _ in $(seq "$1"); do
    "$forkbox" pool ls --json | python3 -c 'import json, sys; p = json.load(sys.stdin); sys.exit(0 if p["slots"] and all(s["ready"] >= s["target"] for s in p["slots"]) else 1)' && break
    sleep 1
  done
  sleep 2
}
burst() {
  local times=() ids=() s e id
  for _ in $(seq "$creates"); do
    s=$(date +%s%N); id=$("$forkbox" sandbox create); e=$(date +%s%N)
    times+=($(( (e - s) / 1000000 ))); ids+=("$id")
  done
  "$forkbox" sandbox rm "${ids[@]}" >/dev/null
  echo -n "${times[*]}"
}
create_times=$(creates_with_pool default)
create_times_10=$(creates_with_pool 10)
# `run` against the default pool.
(creates_with_pool default >/dev/null)
sleep 5
baseline="${BENCH_BASELINE:-}"
daemon_run=(); local_run=(); podman_run=(); base_daemon=(); base_local=()
for _ in $(seq "$runs"); do
  daemon_run+=($(ms "$forkbox" run -q -- true))
  local_run+=($(FORKBOX_RUN_LOCAL=1 ms "$forkbox" run -q -- true))
  if [ -n "$baseline" ]; then
    base_daemon+=($(ms "$baseline" run -q -- true))
    base_local+=($(FORKBOX_RUN_LOCAL=1 ms "$baseline" run -q -- true))
  fi
  podman_run+=($(ms podman run --rm --runtime runc --network none localhost/forkbox-bench-debian true))
  sleep 1
done
"$forkbox" daemon stop >/dev/null
python3 - "$create_times" "${daemon_run[*]}" "${local_run[*]}" "${podman_run[*]}" "$(nproc)" "$create_times_10" "${base_daemon[*]}" "${base_local[*]}" "$baseline" <<'PY'
import statistics, sys
def parse(s): return [int(x) for x in s.split()]
first, second = (parse(b) for b in sys.argv[1].split("|"))
daemon, local, podman = (parse(a) for a in sys.argv[2:5])
first10, second10 = (parse(b) for b in sys.argv[6].split("|"))
def p99(v): v = sorted(v); return v[min(len(v) - 1, round(0.99 * (len(v) - 1)))]
def line(name, v): print(f"{name:<52} n={len(v):<3} median {statistics.median(v):6.0f} ms   p99 {p99(v):6.0f} ms   min {min(v):5d} ms")
print(f"forkbox CLI bench ({sys.argv[5]} cores)")
line("`forkbox sandbox create` back to back, default pool, 1st burst", first)
line("  the same daemon, the next burst", second)
line("`forkbox sandbox create` back to back, pool of 10, 1st burst", first10)
line("  the same daemon, the next burst", second10)
line("`forkbox run -- true` through the daemon (pool)", daemon)
line("`forkbox run -- true` in its own process", local)
line("`podman run --rm debian true` (runc)", podman)
m = statistics.median
print(f"ratios (same run): run through the daemon / podman {m(daemon) / m(podman):.2f}x; "
      f"in its own process / podman {m(local) / m(podman):.2f}x; create median / 100 ms goal, default "
      f"pool: {m(first) / 100:.2f}x (1st burst), {m(second) / 100:.2f}x (next); pool of 10: "
      f"{m(first10) / 100:.2f}x, {m(second10) / 100:.2f}x")
if sys.argv[9]:
    base_daemon, base_local = parse(sys.argv[7]), parse(sys.argv[8])
    print(f"A/B against {sys.argv[9]}, interleaved with the runs above:")
    line("  baseline: `forkbox run -- true` through the daemon", base_daemon)
    line("  baseline: `forkbox run -- true` in its own process", base_local)
    print(f"ratios (same run): this build / baseline: through the daemon "
          f"{m(daemon) / m(base_daemon):.2f}x; in its own process {m(local) / m(base_local):.2f}x")
PY
