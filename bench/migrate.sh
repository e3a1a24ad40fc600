#!/usr/bin/env bash
# The demo migration's wall time split into phases, against the time spent in test-suite runs
# (the work a migration cannot avoid), so forkbox's own cost is visible. Builds the images when
# missing. Run after scripts/demo.sh or on its own.
set -euo pipefail
cd "$(dirname "$0")/.."
forkbox=$(scripts/build.sh)
scripts/build.sh agent >/dev/null
"$forkbox" image build --if-changed -f images/python-bullseye.toml >/dev/null
"$forkbox" image build --if-changed -f images/python-trixie.toml >/dev/null
out=$(mktemp -d)
start=$(date +%s%N)
"$forkbox" migrate --config examples/migration.toml --out "$out" >/dev/null 2>&1 || true
end=$(date +%s%N)
python3 - "$out/report.json" "$(( (end - start) / 1000000 ))" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); wall = int(sys.argv[2]); p = r["phases"]
print(f"forkbox migrate demo ({r['from']} -> {r['to']}, {len(r['plans'])} plans, accelerator {r['accelerator'].split()[0]})")
print("  (baseline and prepare run side by side, so their shares may add up past 100 %)")
for k in ["baseline_ms", "prepare_ms", "fork_ms", "port_ms", "verify_ms"]:
    print(f"  {k[:-3]:<10} {p[k]:>8} ms  {100 * p[k] / p['total_ms']:5.1f} %")
print(f"  total      {p['total_ms']:>8} ms (CLI wall {wall} ms)")
print(f"  test-suite runs (2 baseline + one per plan, summed): {p['test_suite_ms']} ms")
print(f"  ratio total / test-suite time: {p['total_ms'] / max(p['test_suite_ms'], 1):.2f}x  (plans run in parallel, so below the sum is possible)")
print(f"  winner: {r['winner']}")
PY
rm -rf "$out"
