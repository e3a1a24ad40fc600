#!/usr/bin/env bash
# `npm ci` in a sandbox against the same on the host, in one run: qs 6.13.0 with its tape
# suite's development dependencies (136 packages), its lock file written here by
# `npm install --package-lock-only` (this machine's npm omits `resolved` URLs, so npm asks for
# every package's metadata first: about a hundred TLS connections at once). The sandbox is
# node-trixie, one vCPU, 2 GiB, allowed registry.npmjs.org only; each install starts with an
# empty npm cache. Prints the wall times and their ratio, npm's retried fetches, and the
# connections the registry cut short before the guest answered them (the daemon's count).
# BENCH_CPU_QUOTA=25000 throttles the sandbox's QEMU to 25 % of a core (cgroup v1 cpu quota
# per 100 ms, or v2 cpu.max) once it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
forkbox="$(scripts/build.sh)"
scripts/build.sh agent >/dev/null
export FORKBOX_HOME="${FORKBOX_TEST_HOME:-/var/tmp/forkbox-test}"
export FORKBOX_NO_TCG_NOTICE=1 FORKBOX_POOL_SIZE=0
work=$(mktemp -d)
"$forkbox" daemon stop >/dev/null 2>&1 || true
trap '"$forkbox" daemon stop >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
"$forkbox" image build --if-changed -f images/node-trixie.toml >/dev/null
(cd "$work" && npm pack --silent qs@6.13.0 >/dev/null && tar xzf qs-6.13.0.tgz)
code="$work/package"
node -e '
const fs = require("fs"), f = process.argv[1], p = JSON.parse(fs.readFileSync(f));
const keep = ["tape", "es-value-fixtures", "for-each", "has-override-mistake",
  "has-property-descriptors", "has-symbols", "iconv-lite", "mock-property", "object-inspect",
  "safer-buffer"];
p.devDependencies = Object.fromEntries(Object.entries(p.devDependencies).filter(([k]) => keep.includes(k)));
delete p.scripts;
fs.writeFileSync(f, JSON.stringify(p, null, 2));' "$code/package.json"
(cd "$code" && npm install --package-lock-only --ignore-scripts --no-audit --no-fund >/dev/null)
echo "lock file: $(grep -c '"node_modules/' "$code/package-lock.json") packages, $(grep -c '"resolved"' "$code/package-lock.json" || true) resolved URLs"

s=$(date +%s%N)
(cd "$code" && npm ci --no-audit --no-fund --cache "$work/npm-cache" >/dev/null 2>&1)
host_ms=$(( ($(date +%s%N) - s) / 1000000 ))
rm -rf "$code/node_modules"

log="$FORKBOX_HOME/daemon.log"
before=$(grep -c "after its first answer" "$log" 2>/dev/null || true)
id=$("$forkbox" sandbox create --image node-trixie --memory 2048 --allow registry.npmjs.org --ttl 3600)
"$forkbox" sandbox upload "$id" "$code" /root/qs >/dev/null
if [ -n "${BENCH_CPU_QUOTA:-}" ]; then
  if [ -d /sys/fs/cgroup/cpu/forkbox ]; then
    echo "$BENCH_CPU_QUOTA" > "/sys/fs/cgroup/cpu/forkbox/$id/cpu.cfs_quota_us"
  else
    echo "$BENCH_CPU_QUOTA 100000" > "/sys/fs/cgroup/forkbox/$id/cpu.max"
  fi
  echo "the sandbox's QEMU throttled to $BENCH_CPU_QUOTA us per 100 ms"
fi
s=$(date +%s%N)
set +e
"$forkbox" sandbox exec "$id" --timeout 1800 -- sh -c 'cd /root/qs && npm ci --no-audit --no-fund --loglevel http 2>&1' > "$work/sandbox.log"
rc=$?
set -e
sandbox_ms=$(( ($(date +%s%N) - s) / 1000000 ))
"$forkbox" sandbox rm "$id" >/dev/null
after=$(grep -c "after its first answer" "$log" 2>/dev/null || true)
echo "npm ci on the host:     ${host_ms} ms"
echo "npm ci in the sandbox:  ${sandbox_ms} ms (exit $rc; $(grep -c ' attempt #' "$work/sandbox.log" || true) fetches retried; $((after - before)) connections cut short)"
echo "ratio sandbox/host:     $(( sandbox_ms / (host_ms > 0 ? host_ms : 1) ))x"
exit "$rc"
