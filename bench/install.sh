#!/usr/bin/env bash
# Package installs in a sandbox against the same on the host, in one run, with the package
# cache empty and then filled:
# - npm: `npm ci` of process-warning 5.1.1 with Jest (about 300 packages), its lock file written
#   here without `resolved` URLs (this machine's npm), in node-trixie;
# - pip: `pip install -r` of about 150 pinned packages (jupyterlab, sphinx, pytest, requests,
#   boto3, pandas, matplotlib, django, fastapi, mypy and what they need; resolved on the host
#   for the guest's Python by `pip install --dry-run --report`), into a fresh venv of
#   python-bookworm.
# Each sandbox: one vCPU, 2 GiB, allowed the registry alone; npm's and pip's own caches empty
# every time (the host's too). The cache is emptied by removing its store while the daemon
# runs (what docs/sandboxes.md tells a user). Prints wall times, ratios and the cache's answers.
# BENCH_ONLY=npm or BENCH_ONLY=pip runs one of them.
set -euo pipefail
cd "$(dirname "$0")/.."
forkbox="$(scripts/build.sh)"
scripts/build.sh agent >/dev/null
export FORKBOX_HOME="${FORKBOX_TEST_HOME:-/var/tmp/forkbox-test}"
export FORKBOX_NO_TCG_NOTICE=1 FORKBOX_POOL_SIZE=0
work=$(mktemp -d)
"$forkbox" daemon stop >/dev/null 2>&1 || true
trap '"$forkbox" daemon stop >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
answers() {
  sleep 2 # the daemon samples its figures every second
  curl -s --unix-socket "$FORKBOX_HOME/forkbox.sock" http://forkbox/metrics | grep '^forkbox_package_cache_answers' |
    sed 's/.*answer="\([a-z]*\)".* \([0-9]*\)$/\1=\2/' | tr '\n' ' '
}

# In a sandbox of `image` allowed `allow` (comma-separated), with `dir` uploaded to /root/p:
# `cmd`'s wall time in ms.
in_sandbox() {
  local image=$1 allow=$2 dir=$3 cmd=$4 id s rc args=()
  IFS=, read -ra hosts <<<"$allow"
  for h in "${hosts[@]}"; do args+=(--allow "$h"); done
  id=$("$forkbox" sandbox create --image "$image" --memory 2048 "${args[@]}" --ttl 3600)
  "$forkbox" sandbox upload "$id" "$dir" /root/p >/dev/null
  s=$(date +%s%N)
  set +e
  "$forkbox" sandbox exec "$id" --timeout 3000 -- sh -c "cd /root/p && $cmd" >"$work/sandbox.log" 2>&1
  rc=$?
  set -e
  local took; took=$(ms "$s")
  "$forkbox" sandbox rm "$id" >/dev/null
  if [ "$rc" != 0 ]; then
    echo "failed in the sandbox ($rc):" >&2; tail -20 "$work/sandbox.log" >&2; exit 1
  fi
  echo "$took"
}

if [ "${BENCH_ONLY:-npm}" = npm ] || [ -z "${BENCH_ONLY:-}" ]; then
  "$forkbox" image build --if-changed -f images/node-trixie.toml >/dev/null
  (cd "$work" && npm pack --silent process-warning@5.1.1 >/dev/null && mkdir npm && tar xzf process-warning-5.1.1.tgz -C npm)
  code="$work/npm/package"
  node -e '
const fs = require("fs"), f = process.argv[1], p = JSON.parse(fs.readFileSync(f));
p.devDependencies = { jest: p.devDependencies.jest || "^29.7.0" };
delete p.scripts;
fs.writeFileSync(f, JSON.stringify(p, null, 2));' "$code/package.json"
  (cd "$code" && npm install --package-lock-only --ignore-scripts --no-audit --no-fund >/dev/null)
  n=$(grep -c '"node_modules/' "$code/package-lock.json")
  s=$(date +%s%N)
  (cd "$code" && npm ci --no-audit --no-fund --cache "$work/npm-cache" >/dev/null 2>&1)
  host=$(ms "$s")
  rm -rf "$code/node_modules" "$work/npm-cache"
  rm -rf "$FORKBOX_HOME/cache/packages/store"
  cold=$(in_sandbox node-trixie registry.npmjs.org "$code" "npm ci --no-audit --no-fund")
  after_cold=$(answers)
  warm=$(in_sandbox node-trixie registry.npmjs.org "$code" "npm ci --no-audit --no-fund")
  echo "npm ci, $n packages ($(grep -c '"resolved"' "$code/package-lock.json" || true) resolved URLs):"
  echo "  host:                  ${host} ms"
  echo "  sandbox, cache empty:  ${cold} ms = $(( cold / (host > 0 ? host : 1) ))x the host   [cache: ${after_cold}]"
  echo "  sandbox, cache filled: ${warm} ms = $(( warm / (host > 0 ? host : 1) ))x the host   [cache: $(answers)]"
fi

if [ "${BENCH_ONLY:-pip}" = pip ] || [ -z "${BENCH_ONLY:-}" ]; then
  "$forkbox" image build --if-changed -f images/python-bookworm.toml >/dev/null
  mkdir -p "$work/pip"
  python3 -m venv "$work/resolve"
  # Resolved for the guest's Python (bookworm's 3.11.2), wheels only.
  "$work/resolve/bin/pip" install -q --dry-run --ignore-installed --python-version 3.11.2 \
    --only-binary=:all: --target "$work/target" --report "$work/report.json" \
    jupyterlab sphinx pytest requests boto3 pandas flask sqlalchemy black rich httpx \
    matplotlib django fastapi uvicorn mypy >/dev/null
  python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
print("\n".join(sorted("%s==%s" % (i["metadata"]["name"], i["metadata"]["version"]) for i in r["install"])))' \
    "$work/report.json" > "$work/pip/requirements.txt"
  n=$(wc -l < "$work/pip/requirements.txt")
  python3 -m venv "$work/venv"
  s=$(date +%s%N)
  "$work/venv/bin/pip" install -q --no-cache-dir -r "$work/pip/requirements.txt"
  host=$(ms "$s")
  rm -rf "$FORKBOX_HOME/cache/packages/store"
  cmd="python3 -m venv /root/v && /root/v/bin/pip install -q --no-cache-dir -r requirements.txt"
  cold=$(in_sandbox python-bookworm pypi.org,files.pythonhosted.org "$work/pip" "$cmd")
  after_cold=$(answers)
  warm=$(in_sandbox python-bookworm pypi.org,files.pythonhosted.org "$work/pip" "$cmd")
  echo "pip install -r, $n packages:"
  echo "  host:                  ${host} ms"
  echo "  sandbox, cache empty:  ${cold} ms = $(( cold / (host > 0 ? host : 1) ))x the host   [cache: ${after_cold}]"
  echo "  sandbox, cache filled: ${warm} ms = $(( warm / (host > 0 ? host : 1) ))x the host   [cache: $(answers)]"
fi
