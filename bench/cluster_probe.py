"""Timings of a forkbox cluster's API from inside a node's network namespace (bench/cluster.sh).

  cluster_probe.py exec OWNER_URL OTHER_URL TOKEN SANDBOX N
      a plain exec of `true` N times through the owner and through a non-owner, interleaved,
      each on a kept-alive connection: p50 and p99 of each, and the difference of the p50s;
      then the same for a get of the sandbox's view (no guest involved).
  cluster_probe.py creates URL TOKEN N [BODY_JSON]
      N creates (each deleted after), one at a time: p50 and p99 of the create.
  cluster_probe.py fill URL TOKEN N
      N sandboxes created and kept (their ids printed, one a line).
"""
import http.client
import json
import statistics
import sys
import time
import urllib.parse


def conn(url):
    u = urllib.parse.urlparse(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=120)


def call(c, token, method, path, body=None):
    headers = {"Authorization": f"Bearer {token}"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    c.request(method, path, body=data, headers=headers)
    r = c.getresponse()
    out = r.read()
    if r.status >= 300:
        raise SystemExit(f"{method} {path}: {r.status} {out[:300]!r}")
    return json.loads(out) if out else None


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def show(name, xs):
    print(f"{name}: p50 {statistics.median(xs):.2f} ms, p99 {pct(xs, 99):.2f} ms (n={len(xs)})")


def exec_rtt(owner, other, token, sid, n):
    a, b = conn(owner), conn(other)
    body = {"argv": ["true"]}
    path = f"/v1/sandboxes/{sid}/exec"
    for c in (a, b):  # warm both connections and the forwarding node's
        for _ in range(3):
            call(c, token, "POST", path, body)
    direct, forwarded = [], []
    for _ in range(n):
        for c, xs in ((a, direct), (b, forwarded)):
            t = time.perf_counter()
            call(c, token, "POST", path, body)
            xs.append((time.perf_counter() - t) * 1000)
    show("exec through the owner", direct)
    show("exec through another node", forwarded)
    d = statistics.median(forwarded) - statistics.median(direct)
    print(f"forwarding adds {d:.2f} ms to an exec at p50 (goal: <= 2 ms)")
    # The same for a call that never reaches the guest (the sandbox's view): what forwarding
    # costs without a TCG guest's noise around it.
    direct, forwarded = [], []
    for _ in range(n):
        for c, xs in ((a, direct), (b, forwarded)):
            t = time.perf_counter()
            call(c, token, "GET", f"/v1/sandboxes/{sid}")
            xs.append((time.perf_counter() - t) * 1000)
    show("get through the owner", direct)
    show("get through another node", forwarded)
    d = statistics.median(forwarded) - statistics.median(direct)
    print(f"forwarding adds {d:.2f} ms to a get at p50 (goal: <= 2 ms)")


def creates(url, token, n, body):
    c = conn(url)
    xs = []
    for _ in range(n):
        t = time.perf_counter()
        v = call(c, token, "POST", "/v1/sandboxes", body)
        xs.append((time.perf_counter() - t) * 1000)
        call(c, token, "DELETE", f"/v1/sandboxes/{v['id']}")
    show("create", xs)
    print(f"CREATE_P50_MS {statistics.median(xs):.2f}")


def fill(url, token, n):
    c = conn(url)
    for _ in range(n):
        v = call(c, token, "POST", "/v1/sandboxes", {"memory_mib": 256, "ttl_seconds": 3600})
        print(v["id"], v.get("node", ""))


def main():
    what = sys.argv[1]
    if what == "exec":
        exec_rtt(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]))
    elif what == "creates":
        body = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
        creates(sys.argv[2], sys.argv[3], int(sys.argv[4]), body)
    elif what == "fill":
        fill(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
