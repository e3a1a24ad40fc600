#!/usr/bin/env bash
# What E2B's API costs over forkbox's own, on one daemon of this build (a home of its own that
# shares the test home's images, no warm pool), the `base` template, figures and ratios from
# the same run, rounds interleaved so that load drifts hit both alike:
#   create -> first command: E2B's Python SDK (`Sandbox.create("base")`, `commands.run("true")`)
#       against forkbox's Python SDK doing the same work: `sandboxes.create(image="base")` with
#       E2B's default network (internet access on) and an exec of what E2B's command is in the
#       guest (`bash -l -c true` as user `user`); goal <= 1.1x
#   command round trip on a running sandbox: `commands.run("true")` (envd's process service)
#       against /v1 exec of the same guest work; goal <= 1.2x
#   and, for what E2B's login shell itself costs, both against forkbox's `exec(["true"])
#   50 MB: `files.write` + `files.read` against `forkbox sandbox upload` + `download`
#   the code interpreter (`e2b-code-interpreter`): create -> first cell against create -> first
#       command, and a trivial cell's round trip against `commands.run("true")`
#   E2B's own test suites (crates/cli/tests/e2b_suites/: Python and JavaScript SDKs): each suite's wall time per mode, with
#       its counts (BENCH_E2B_SUITES=0 leaves them out)
# BENCH_E2B_ROUNDS (default 15) creates, 3x as many commands.
set -euo pipefail
cd "$(dirname "$0")/.."
forkbox="$(scripts/build.sh)"
scripts/build.sh agent >/dev/null
test_home="${FORKBOX_TEST_HOME:-/var/tmp/forkbox-test}"
rounds="${BENCH_E2B_ROUNDS:-15}"
home="$test_home/homes/bench-e2b"
mkdir -p "$home"
for d in kernels images cache templates; do
  mkdir -p "$test_home/$d"
  [ -e "$home/$d" ] || ln -s "$test_home/$d" "$home/$d"
done
venv="$test_home/bench-e2b-venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check e2b e2b-code-interpreter ./sdk/python >&2
# The images are built below (timed apart): nothing built ahead at the daemon's start.
export FORKBOX_HOME="$home" FORKBOX_POOL_SIZE=0 FORKBOX_E2B_PREBUILD=none
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$forkbox" serve --listen "127.0.0.1:$port" >"$home/daemon.log" 2>&1 &
trap 'kill "$(cat "$home/daemon.pid")" 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$home/forkbox.sock" ] && curl -s "http://127.0.0.1:$port/" >/dev/null 2>&1 && break; sleep 0.1; done
export FORKBOX_API="unix:$home/forkbox.sock"
export E2B_API_KEY="$("$forkbox" token create --name bench)"
export E2B_API_URL="http://127.0.0.1:$port" E2B_SANDBOX_URL="http://127.0.0.1:$port"
# The template of `base` (the image built first if this machine has none), made once.
"$forkbox" image build --if-changed -f images/base.toml >/dev/null
"$forkbox" image build --if-changed -f images/code-interpreter.toml >/dev/null
"$forkbox" sandbox rm "$("$forkbox" sandbox create --image base)" >/dev/null

"$venv/bin/python" - "$forkbox" "$rounds" "$home" <<'PY'
import os, statistics, subprocess, sys, time
import e2b
import forkbox

exe, rounds, home = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rt = forkbox.Runtime()
med = statistics.median

# What E2B's SDK runs for `commands.run(cmd)`: a login shell as the sandbox's user.
SAME = ["setpriv", "--reuid=user", "--regid=user", "--init-groups", "--",
        "env", "HOME=/home/user", "USER=user", "LOGNAME=user", "/bin/bash", "-l", "-c", "true"]

def e2b_create():
    t = time.perf_counter()
    s = e2b.Sandbox.create("base", timeout=600)
    s.commands.run("true")
    dt = time.perf_counter() - t
    s.kill()
    return dt

def fbx_create(argv, network=None):
    t = time.perf_counter()
    s = rt.sandboxes.create(image="base", network=network)
    s.exec(argv)
    dt = time.perf_counter() - t
    s.stop()
    return dt

a, b, c = [], [], []
for _ in range(rounds):
    a.append(e2b_create())
    b.append(fbx_create(SAME, {"internet": True}))
    c.append(fbx_create(["true"]))
print(f"create -> first command, median of {rounds} each (base template, no warm pool):")
print(f"  e2b: create, commands.run('true')             {med(a)*1000:7.0f} ms")
print(f"  forkbox: create (internet on), exec of bash -l -c as user  {med(b)*1000:7.0f} ms")
print(f"  forkbox: create (no network), exec(['true'])              {med(c)*1000:7.0f} ms")
print(f"  ratio, same guest work {med(a)/med(b):.2f}x (goal <= 1.1x); against exec(['true']) {med(a)/med(c):.2f}x")

sbx = e2b.Sandbox.create("base", timeout=600)
fs = rt.sandboxes.create(image="base")
fid = fs.id
sbx.commands.run("true"); fs.exec(SAME); fs.exec(["true"])  # first runs out of the figures
a, b, c = [], [], []
for _ in range(rounds * 3):
    t = time.perf_counter(); sbx.commands.run("true"); a.append(time.perf_counter() - t)
    t = time.perf_counter(); fs.exec(SAME); b.append(time.perf_counter() - t)
    t = time.perf_counter(); fs.exec(["true"]); c.append(time.perf_counter() - t)
print(f"command round trip on a running sandbox, median of {rounds*3} each:")
print(f"  e2b commands.run('true')              {med(a)*1000:7.1f} ms")
print(f"  forkbox exec of bash -l -c as user    {med(b)*1000:7.1f} ms")
print(f"  forkbox exec(['true'])                {med(c)*1000:7.1f} ms")
print(f"  ratio, same guest work {med(a)/med(b):.2f}x (goal <= 1.2x); against exec(['true']) {med(a)/med(c):.2f}x")

data = os.urandom(50 << 20)
src = os.path.join(home, "bench-50mb.bin")
with open(src, "wb") as f:
    f.write(data)
a, b = [], []
for i in range(3):
    t = time.perf_counter()
    sbx.files.write(f"/tmp/big{i}.bin", data)
    back = sbx.files.read(f"/tmp/big{i}.bin", format="bytes")
    a.append(time.perf_counter() - t)
    assert back == data
    dst = os.path.join(home, f"bench-back{i}.bin")
    if os.path.exists(dst):
        os.remove(dst)
    t = time.perf_counter()
    subprocess.run([exe, "sandbox", "upload", fid, src, f"/tmp/cli{i}.bin"], check=True, capture_output=True)
    subprocess.run([exe, "sandbox", "download", fid, f"/tmp/cli{i}.bin", dst], check=True, capture_output=True)
    b.append(time.perf_counter() - t)
    os.remove(dst)
os.remove(src)
print("50 MB written and read back, median of 3:")
print(f"  e2b files.write + files.read           {med(a)*1000:7.0f} ms")
print(f"  forkbox sandbox upload + download      {med(b)*1000:7.0f} ms")
print(f"  ratio {med(a)/med(b):.2f}x")

import e2b_code_interpreter as ci
warm = ci.Sandbox.create(timeout=600)  # the first makes the warm sandbox: out of the figures
warm.run_code("1")
warm.kill()
a, b = [], []
for _ in range(rounds):
    t = time.perf_counter(); s = ci.Sandbox.create(timeout=600); s.run_code("1 + 1"); a.append(time.perf_counter() - t); s.kill()
    t = time.perf_counter(); s = e2b.Sandbox.create("base", timeout=600); s.commands.run("true"); b.append(time.perf_counter() - t); s.kill()
print(f"code interpreter: create -> first cell against create -> first command, median of {rounds}:")
print(f"  create, run_code('1 + 1')        {med(a)*1000:7.0f} ms")
print(f"  create, commands.run('true')     {med(b)*1000:7.0f} ms")
print(f"  ratio {med(a)/med(b):.2f}x")
cs = ci.Sandbox.create(timeout=600)
cs.run_code("1")
a, b = [], []
for _ in range(rounds * 3):
    t = time.perf_counter(); cs.run_code("1 + 1"); a.append(time.perf_counter() - t)
    t = time.perf_counter(); sbx.commands.run("true"); b.append(time.perf_counter() - t)
print(f"code interpreter: a trivial cell's round trip against a command's, median of {rounds*3}:")
print(f"  run_code('1 + 1')         {med(a)*1000:7.1f} ms")
print(f"  commands.run('true')      {med(b)*1000:7.1f} ms")
print(f"  ratio {med(a)/med(b):.2f}x")
cs.kill()
sbx.kill()
fs.stop()
PY

# E2B's own suites, in every mode, with the counts and wall time each prints.
if [ "${BENCH_E2B_SUITES:-1}" = 1 ]; then
  echo "E2B's own test suites (two tests at a time, TCG):"
  FORKBOX_E2B_SUITES_ALL=1 cargo nextest run -p forkbox-cli --test e2b_suites --test-threads 1 --no-capture 2>&1 \
    | grep -E '^(E2B SUITE|skipped)' | sed 's/^/  /'
fi
