#!/usr/bin/env bash
# Waking a sleeping sandbox, against what it stands in for, measured in one run through the
# daemon of the test home (no warm pool, so a create restores the template as a wake restores
# the sandbox): BENCH_ROUNDS (default 10) rounds of
#   - `forkbox sandbox create` (a restore of the image's template, to agent-ready), and the
#     first `forkbox sandbox exec ID -- true` after it (a restored guest's first exec is slower);
#   - `forkbox sandbox exec ID -- true` on a running sandbox (the exec round trip);
#   - `forkbox sandbox exec ID -- true` on that sandbox asleep (`--idle 1s`, waited out): the
#     wake and the exec; the wake alone is that minus the median exec round trip;
# then the medians, the wake's ratio to a create (goal: <= 1.2x on this machine), the same
# with the first exec on either side, and the daemon's own wake times and phases from its log.
set -euo pipefail
cd "$(dirname "$0")/.."
forkbox="$(scripts/build.sh)"
scripts/build.sh agent >/dev/null
export FORKBOX_HOME="${FORKBOX_TEST_HOME:-/var/tmp/forkbox-test}"
export FORKBOX_NO_TCG_NOTICE=1 FORKBOX_POOL_SIZE=0
rounds="${BENCH_ROUNDS:-10}"
"$forkbox" daemon stop >/dev/null 2>&1 || true
# The daemon this bench starts goes with it (a test run after it must not find it).
trap '"$forkbox" daemon stop >/dev/null 2>&1 || true' EXIT
ms() { local s e; s=$(date +%s%N); "$@" >/dev/null; e=$(date +%s%N); echo $(( (e - s) / 1000000 )); }
state() { "$forkbox" sandbox ls --json | python3 -c "import json,sys; print(next(v['state'] for v in json.load(sys.stdin) if v['id'] == '$1'))"; }
# One sandbox first: the template is made, and the daemon started, outside the figures.
"$forkbox" sandbox rm "$("$forkbox" sandbox create)" >/dev/null
log_from=$(wc -l < "$FORKBOX_HOME/daemon.log" 2>/dev/null || echo 0)
creates=(); firsts=(); execs=(); wakes=()
for _ in $(seq "$rounds"); do
  s=$(date +%s%N); id=$("$forkbox" sandbox create --idle 1s --ttl 600); e=$(date +%s%N)
  creates+=($(( (e - s) / 1000000 )))
  firsts+=($(ms "$forkbox" sandbox exec "$id" -- true))
  "$forkbox" sandbox idle "$id" off >/dev/null
  for _ in 1 2 3; do execs+=($(ms "$forkbox" sandbox exec "$id" -- true)); done
  "$forkbox" sandbox idle "$id" 1s >/dev/null
  for _ in $(seq 120); do [ "$(state "$id")" = sleeping ] && break; sleep 0.5; done
  [ "$(state "$id")" = sleeping ] || { echo "bench/idle.sh: $id never slept" >&2; exit 1; }
  wakes+=($(ms "$forkbox" sandbox exec "$id" -- true))
  "$forkbox" sandbox rm "$id" >/dev/null
done
tail -n +"$((log_from + 1))" "$FORKBOX_HOME/daemon.log" | grep -o 'woken by a use in .*' > /tmp/forkbox-bench-wakes.$$ || true
python3 - "${creates[*]}" "${firsts[*]}" "${execs[*]}" "${wakes[*]}" /tmp/forkbox-bench-wakes.$$ <<'PY'
import re, statistics as st, sys
creates, firsts, execs, wakes = ([int(x) for x in a.split()] for a in sys.argv[1:5])
logged = open(sys.argv[5]).read().splitlines()
med = st.median
c, f, x, w = med(creates), med(firsts), med(execs), med(wakes)
wake = max(w - x, 0)
print(f"# bench/idle.sh: {len(creates)} rounds through the daemon (no warm pool), CLI wall times in ms, medians")
print(f"create from the template                 {c:.0f} ms  (min {min(creates)}, max {max(creates)})")
print(f"first exec `true` after a create         {f:.0f} ms  (min {min(firsts)}, max {max(firsts)})")
print(f"exec `true`, sandbox running             {x:.0f} ms  (min {min(execs)}, max {max(execs)})")
print(f"exec `true`, sandbox asleep (wake+exec)  {w:.0f} ms  (min {min(wakes)}, max {max(wakes)})")
print(f"wake alone (asleep - running)            {wake:.0f} ms = {wake / c:.2f}x a create (its exec is a restored guest's first)")
print(f"wake + exec against create + first exec  {w:.0f} / {c + f:.0f} ms = {w / (c + f):.2f}x (goal <= 1.20x)")
ms = [int(m.group(1)) for m in (re.search(r"in (\d+) ms", l) for l in logged) if m]
if ms:
    print(f"daemon's wake times                      median {med(ms):.0f} ms (min {min(ms)}, max {max(ms)}); last: {logged[-1]}")
PY
rm -f /tmp/forkbox-bench-wakes.$$
