#!/usr/bin/env bash
# What a tool call costs through MCP: `exec true` in one sandbox, BENCH_MCP_CALLS times
# (default 30), through `forkbox mcp` (stdio, the official Python MCP client) and through the
# daemon's HTTP API (one POST on its socket), interleaved; medians and the ratio from one run.
set -euo pipefail
cd "$(dirname "$0")/.."
forkbox="$(scripts/build.sh)"
scripts/build.sh agent >/dev/null
test_home="${FORKBOX_TEST_HOME:-/var/tmp/forkbox-test}"
calls="${BENCH_MCP_CALLS:-30}"
home="$test_home/homes/bench-mcp"
mkdir -p "$home"
for d in kernels images cache templates; do
  mkdir -p "$test_home/$d"
  [ -e "$home/$d" ] || ln -s "$test_home/$d" "$home/$d"
done
venv="$test_home/mcp-venv"
"$venv/bin/python" -c 'import mcp' 2>/dev/null || {
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check mcp >&2
}
export FORKBOX_HOME="$home" FORKBOX_POOL_SIZE=0
"$forkbox" serve --detach >/dev/null
trap 'kill "$(cat "$home/daemon.pid")" 2>/dev/null || true' EXIT
export FORKBOX_API="unix:$home/forkbox.sock"

"$venv/bin/python" - "$forkbox" "$home/forkbox.sock" "$calls" <<'PY'
import asyncio, http.client, json, os, socket, statistics, sys, time
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

exe, sock, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])

class UnixHTTP(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(sock)

async def main():
    params = StdioServerParameters(command=exe, args=["mcp"], env=dict(os.environ))
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            made = await s.call_tool("sandbox_create", {"ttl_seconds": 900})
            sid = json.loads(made.content[0].text)["sandbox"]
            conn = UnixHTTP("forkbox")
            body = json.dumps({"argv": ["true"]})
            mcp_t, http_t = [], []
            for _ in range(calls):
                t = time.perf_counter()
                res = await s.call_tool("exec", {"sandbox": sid, "command": "true"})
                assert not res.is_error
                mcp_t.append(time.perf_counter() - t)
                t = time.perf_counter()
                conn.request("POST", f"/v1/sandboxes/{sid}/exec", body, {"content-type": "application/json"})
                resp = conn.getresponse(); resp.read()
                assert resp.status == 200
                http_t.append(time.perf_counter() - t)
    m, h = statistics.median(mcp_t), statistics.median(http_t)
    print(f"exec true in one sandbox, median of {calls} calls each, interleaved, one daemon:")
    print(f"  HTTP API (POST /v1/sandboxes/ID/exec)   {h*1000:7.1f} ms")
    print(f"  MCP (forkbox mcp over stdio, tool exec) {m*1000:7.1f} ms   ({m/h:.2f}x; +{(m-h)*1000:.1f} ms)")

asyncio.run(main())
PY
