#!/usr/bin/env bash
# What the SDKs cost over the CLI: create + exec `true` + stop, BENCH_SDK_ROUNDS times each
# (default 15), from the CLI (three processes a round), the Python SDK and the TypeScript SDK
# (one process each, its client reused), against one daemon of this build in a home of its own
# that shares the test home's images; medians and ratios from the same run. The daemon keeps
# no warm pool, so every create restores the template (the pool would hide the create).
set -euo pipefail
cd "$(dirname "$0")/.."
forkbox="$(scripts/build.sh)"
scripts/build.sh agent >/dev/null
test_home="${FORKBOX_TEST_HOME:-/var/tmp/forkbox-test}"
rounds="${BENCH_SDK_ROUNDS:-15}"
home="$test_home/homes/bench-sdk"
mkdir -p "$home"
for d in kernels images cache templates; do
  mkdir -p "$test_home/$d"
  [ -e "$home/$d" ] || ln -s "$test_home/$d" "$home/$d"
done
venv="$test_home/sdk-venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check ./sdk/python >&2
(cd sdk/typescript && npm ci --no-audit --no-fund --loglevel=error) >&2
export FORKBOX_HOME="$home" FORKBOX_POOL_SIZE=0
"$forkbox" serve --detach >/dev/null
trap 'kill "$(cat "$home/daemon.pid")" 2>/dev/null || true' EXIT
export FORKBOX_API="unix:$home/forkbox.sock"
"$forkbox" sandbox rm "$("$forkbox" sandbox create)" >/dev/null  # the template, made once

"$venv/bin/python" - "$forkbox" "$rounds" <<'PY'
import json, statistics, subprocess, sys, time
import forkbox

exe, rounds = sys.argv[1], int(sys.argv[2])

def cli_round():
    t = time.perf_counter()
    sid = subprocess.run([exe, "sandbox", "create"], check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run([exe, "sandbox", "exec", sid, "--", "true"], check=True)
    subprocess.run([exe, "sandbox", "rm", sid], check=True, capture_output=True)
    return time.perf_counter() - t

rt = forkbox.Runtime()
def py_round():
    t = time.perf_counter()
    s = rt.sandboxes.create()
    s.exec(["true"])
    s.stop()
    return time.perf_counter() - t

ts = subprocess.run(["node", "--input-type=module", "-e", f"""
import {{ Runtime }} from './sdk/typescript/dist/index.js';
const rt = new Runtime(); const out = [];
for (let i = 0; i < {rounds}; i++) {{
  const t = performance.now();
  const s = await rt.sandboxes.create(); await s.exec(['true']); await s.stop();
  out.push((performance.now() - t) / 1000);
}}
rt.close(); console.log(JSON.stringify(out));
"""], check=True, capture_output=True, text=True)
ts_times = json.loads(ts.stdout)
cli_times, py_times = [], []
for _ in range(rounds):  # interleaved, so load drifts hit both alike
    cli_times.append(cli_round())
    py_times.append(py_round())
med = {k: statistics.median(v) for k, v in (("cli", cli_times), ("python", py_times), ("typescript", ts_times))}
print(f"create + exec true + stop, median of {rounds} rounds each, one daemon, no warm pool:")
for k in ("cli", "python", "typescript"):
    print(f"  {k:<11} {med[k]*1000:7.0f} ms   ({med[k]/med['cli']:.2f}x the CLI)")
print(f"  SDK cost over the CLI: python {1000*(med['python']-med['cli']):+.0f} ms, typescript {1000*(med['typescript']-med['cli']):+.0f} ms")
PY
