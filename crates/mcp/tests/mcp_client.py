"""Drives forkbox's MCP server with the official Python MCP client (PyPI `mcp`), over stdio
(`forkbox mcp`) or Streamable HTTP (the daemon's /mcp). Run by crates/cli/tests/sdk.rs.

    python mcp_client.py stdio FORKBOX_BIN ROOT
    python mcp_client.py http URL TOKEN ROOT
    python mcp_client.py code URL TOKEN       (run_code, the image code-interpreter built)
"""

import asyncio
import json
import os
import sys

import httpx2
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

TOOLS = {
    "sandbox_create", "exec", "read_file", "write_file", "edit_file", "list_dir", "upload",
    "download", "git_diff", "snapshot", "fork", "hibernate", "resume", "destroy",
    "list_sandboxes", "run_tests", "port_forward", "run_code", "code_context",
    "volume_create", "list_volumes", "volume_remove",
}


async def call(s, name, **args):
    r = await s.call_tool(name, args)
    text = "".join(getattr(c, "text", "") for c in r.content)
    return bool(r.is_error), text


async def ok(s, name, **args):
    err, text = await call(s, name, **args)
    assert not err, f"{name} failed: {text}"
    return text


async def scenario(s, root):
    tools = (await s.list_tools()).tools
    names = {t.name for t in tools}
    assert TOOLS <= names, TOOLS - names
    for t in tools:
        assert t.description and t.input_schema.get("type") == "object", t.name
    sid = json.loads(await ok(s, "sandbox_create", ttl_seconds=900))["sandbox"]
    r = json.loads(await ok(s, "exec", sandbox=sid, command="echo out; echo err >&2; exit 3"))
    assert (r["exit_code"], r["stdout"], r["stderr"]) == (3, "out\n", "err\n"), r
    r = json.loads(await ok(s, "exec", sandbox=sid, command="head -c 100000 /dev/zero | tr '\\0' x"))
    assert r["stdout"].startswith("[forkbox: the first") and r["stdout"].endswith("x" * 100), r["stdout"][:120]

    seen = []

    async def on_progress(progress, total, message):
        seen.append(message)

    r = await s.call_tool("exec", {"sandbox": sid, "command": "echo step-one; sleep 5; echo done"},
                          progress_callback=on_progress)
    assert not r.is_error and seen and "last output: step-one" in seen[-1], seen

    await ok(s, "upload", sandbox=sid, host_dir=os.path.join(root, "legacykit"), guest_dir="/work")
    await ok(s, "exec", sandbox=sid, cwd="/work",
             command="git init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm base")
    await ok(s, "write_file", sandbox=sid, path="/work/tests/test_probe.py",
             content="def test_probe():\n    assert 1 + 1 == 2\n")
    assert "assert 1 + 1" in await ok(s, "read_file", sandbox=sid, path="/work/tests/test_probe.py")
    entries = json.loads(await ok(s, "list_dir", sandbox=sid, path="/work/tests"))["entries"]
    assert "test_probe.py" in [e["name"] for e in entries]
    await ok(s, "exec", sandbox=sid, cwd="/work",
             command="git add -A && git -c user.name=t -c user.email=t@t commit -qm probe")
    before = json.loads(await ok(s, "run_tests", sandbox=sid, save_as="before"))
    assert before["counts"].get("passed", 0) > 10, before
    await ok(s, "edit_file", sandbox=sid, path="/work/tests/test_probe.py", old="1 + 1 == 2", new="1 + 1 == 3")
    err, text = await call(s, "edit_file", sandbox=sid, path="/work/tests/test_probe.py", old="1", new="2")
    assert err and "occurs" in text, text
    await ok(s, "write_file", sandbox=sid, path="/work/NOTES", content="new\n")
    diff = await ok(s, "git_diff", sandbox=sid)
    assert "+    assert 1 + 1 == 3" in diff and "untracked: NOTES" in diff, diff
    after = json.loads(await ok(s, "run_tests", sandbox=sid, baseline="before"))
    assert after["lost"] == ["tests/test_probe.py::test_probe"], after
    assert "tests/test_probe.py::test_probe" in after["failed"], after

    snap = json.loads(await ok(s, "snapshot", sandbox=sid))["snapshot"]
    copies = json.loads(await ok(s, "fork", source=snap, count=3))["sandboxes"]
    assert len(copies) == 3, copies
    r = json.loads(await ok(s, "exec", sandbox=copies[0], command="cat /work/tests/test_probe.py"))
    assert "1 + 1 == 3" in r["stdout"], r
    listed = {x["sandbox"] for x in json.loads(await ok(s, "list_sandboxes"))}
    assert listed == {sid, *copies}, listed
    await ok(s, "destroy", sandbox=copies[2])

    err, text = await call(s, "upload", sandbox=sid, host_dir="/etc", guest_dir="/x")
    assert err and "outside the allowed host directories" in text, text
    err, text = await call(s, "exec", sandbox="sb-0000000000", command="true")
    assert err and "not created in this session" in text, text
    err, text = await call(s, "sandbox_create", image="no-such-image")
    assert err and "no image no-such-image" in text, text
    down = os.path.join(root, f"down-{os.getpid()}-{sid}")
    await ok(s, "download", sandbox=sid, guest_path="/work/tests", host_dir=down)
    assert os.path.exists(os.path.join(down, "tests", "test_probe.py")) or os.path.exists(
        os.path.join(down, "test_probe.py")), os.listdir(down)
    return {sid, *copies[:2]}


async def secrets(s):
    """stdio: a secret's value comes from the server's environment, never the conversation."""
    value = os.environ["MCP_TEST_SECRET"]
    made = json.loads(await ok(s, "sandbox_create", ttl_seconds=900, secrets=[
        {"name": "T", "hosts": ["api.example.com"], "env": "MCP_TEST_SECRET"}]))
    assert made["secrets"] == [{"name": "T", "hosts": ["api.example.com"]}], made
    r = json.loads(await ok(s, "exec", sandbox=made["sandbox"], command="echo $T"))
    assert r["stdout"].startswith("fbxs_") and value not in r["stdout"], r
    fwd = json.loads(await ok(s, "port_forward", sandbox=made["sandbox"], guest_port=8000))
    assert fwd["url"].startswith("http://127.0.0.1:") and fwd["guest_port"] == 8000, fwd
    await ok(s, "destroy", sandbox=made["sandbox"])
    err, text = await call(s, "sandbox_create", secrets=[{"name": "T", "hosts": ["a.example.com"], "env": "NOT_SET_ANYWHERE"}])
    assert err and "$NOT_SET_ANYWHERE is not set" in text, text


async def resources_and_prompt(s, made):
    listed = {r.uri for r in (await s.list_resources()).resources}
    assert "forkbox://sandboxes" in listed and all(f"forkbox://sandboxes/{m}" in listed for m in made), listed
    one = sorted(made)[0]
    body = (await s.read_resource(f"forkbox://sandboxes/{one}")).contents[0].text
    assert json.loads(body)["id"] == one, body
    prompts = {p.name for p in (await s.list_prompts()).prompts}
    assert "port" in prompts, prompts
    text = (await s.get_prompt("port", {"from": "python-bullseye", "to": "python-trixie", "code": "/src"})).messages[0].content.text
    assert "baseline" in text and "python-trixie" in text, text


async def port(s, root):
    """examples/legacykit from Python 3.9 to 3.13 through MCP alone, accepting by comparison."""
    test = "python3 -m pytest -q -rA -p no:cacheprovider"
    old = json.loads(await ok(s, "sandbox_create", image="python-bullseye"))["sandbox"]
    await ok(s, "upload", sandbox=old, host_dir=os.path.join(root, "legacykit"), guest_dir="/work")
    before = json.loads(await ok(s, "run_tests", sandbox=old, command=test, save_as="legacy"))
    assert before["counts"]["passed"] == 47, before
    new = json.loads(await ok(s, "sandbox_create", image="python-trixie"))["sandbox"]
    await ok(s, "upload", sandbox=new, host_dir=os.path.join(root, "legacykit"), guest_dir="/work")
    await ok(s, "upload", sandbox=new, host_dir=os.path.join(root, "plans"), guest_dir="/plan")
    await ok(s, "exec", sandbox=new, cwd="/work",
             command="git init -q && git add -A && git -c user.name=a -c user.email=a@a commit -qm before")
    snap = json.loads(await ok(s, "snapshot", sandbox=new))["snapshot"]
    copies = json.loads(await ok(s, "fork", source=snap, count=3))["sandboxes"]
    verdicts = {}
    for plan, copy in zip(["minimal", "modernize", "wrong"], copies):
        await ok(s, "exec", sandbox=copy, cwd="/work", command=f"python3 /plan/port.py {plan}")
        r = json.loads(await ok(s, "run_tests", sandbox=copy, command=test, baseline="legacy"))
        diff = await ok(s, "git_diff", sandbox=copy)
        verdicts[plan] = (len(r["lost"]), len(diff.splitlines()))
    accepted = sorted((lines, plan) for plan, (lost, lines) in verdicts.items() if lost == 0)
    print("port verdicts:", verdicts, "accepted:", [p for _, p in accepted])
    assert [p for _, p in accepted] == ["minimal", "modernize"], verdicts


async def own_only(url, token, n):
    """One of several concurrent sessions: it sees only the sandbox it made."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=600) as http:
        async with streamable_http_client(url, http_client=http) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                sid = json.loads(await ok(s, "sandbox_create", ttl_seconds=900))["sandbox"]
                listed = [x["sandbox"] for x in json.loads(await ok(s, "list_sandboxes"))]
                assert listed == [sid], (n, listed)
                return sid


async def code(s):
    """run_code: state kept across calls, a plot as an image block, an error, a context."""
    sid = json.loads(await ok(s, "sandbox_create", image="code-interpreter", ttl_seconds=900))["sandbox"]
    r = json.loads(await ok(s, "run_code", sandbox=sid, code="x = 41\nprint('hi')\nx + 1"))
    assert (r["stdout"], r["results"][0]["text"], r["error"]) == ("hi\n", "42", None), r
    r = await s.call_tool("run_code", {"sandbox": sid, "code": "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()"})
    images = [c for c in r.content if getattr(c, "type", "") == "image"]
    assert not r.is_error and len(images) == 1 and images[0].mime_type == "image/png", r.content
    r = json.loads(await ok(s, "run_code", sandbox=sid, code="x / 0"))
    assert r["error"]["name"] == "ZeroDivisionError" and "ZeroDivisionError: division by zero" in r["error"]["traceback"], r
    assert "\x1b[" not in r["error"]["traceback"], "colours are stripped"
    ctx = json.loads(await ok(s, "code_context", sandbox=sid, language="bash", cwd="/tmp"))["context"]
    r = json.loads(await ok(s, "run_code", sandbox=sid, code="pwd", context=ctx))
    assert r["stdout"] == "/tmp\n", r
    err, text = await call(s, "run_code", sandbox=sid, code="1", language="cobol")
    assert err and "python, javascript, bash" in text, text
    await ok(s, "destroy", sandbox=sid)
    print("mcp run_code passed")


async def idle(s):
    """A sandbox made to sleep when idle sleeps, and the next exec wakes it with its files."""
    made = json.loads(await ok(s, "sandbox_create", ttl_seconds=900, idle_seconds=2))
    assert made["idle"] == {"after_secs": 2, "action": "hibernate"}, made
    sid = made["sandbox"]
    await ok(s, "exec", sandbox=sid, command="echo kept > /root/f")
    state = None
    for _ in range(180):
        state = next(x["state"] for x in json.loads(await ok(s, "list_sandboxes")) if x["sandbox"] == sid)
        if state == "sleeping":
            break
        await asyncio.sleep(0.5)
    assert state == "sleeping", state
    r = json.loads(await ok(s, "exec", sandbox=sid, command="cat /root/f"))
    assert r["stdout"] == "kept\n", r
    await ok(s, "destroy", sandbox=sid)
    print("mcp idle: slept, woken by exec")


async def volumes(s):
    """A volume written in one sandbox is read in the next; a second writer is refused."""
    name = f"mcp-{os.getpid()}"
    # The tools' own argument `name` meets `ok`'s: called with a dict.
    async def ok_with(tool, args):
        r = await s.call_tool(tool, args)
        text = "".join(getattr(c, "text", "") for c in r.content)
        assert not r.is_error, f"{tool} failed: {text}"
        return text

    made = json.loads(await ok_with("volume_create", {"name": name, "size": "32m"}))
    assert made["name"] == name and made["size_bytes"] == 32 << 20, made
    w = json.loads(await ok(s, "sandbox_create", ttl_seconds=900, volumes=[f"{name}:/data"]))
    assert w["volumes"] == [{"name": name, "path": "/data", "read_only": False, "slot": 0}], w
    await ok(s, "exec", sandbox=w["sandbox"], command="echo kept > /data/f && sync")
    err, text = await call(s, "sandbox_create", volumes=[f"{name}:/data:ro"])
    assert err and "in use" in text and w["sandbox"] in text, text
    err, text = await call(s, "sandbox_create", volumes=["nope"])
    assert err and "NAME:/path" in text, text
    await ok(s, "destroy", sandbox=w["sandbox"])
    r = json.loads(await ok(s, "sandbox_create", ttl_seconds=900, volumes=[f"{name}:/v:ro"]))
    out = json.loads(await ok(s, "exec", sandbox=r["sandbox"], command="cat /v/f"))
    assert out["stdout"] == "kept\n", out
    listed = json.loads(await ok(s, "list_volumes"))
    assert [v["holders"] for v in listed if v["name"] == name] == [[{"sandbox": r["sandbox"], "read_only": True}]], listed
    await ok(s, "destroy", sandbox=r["sandbox"])
    await ok_with("volume_remove", {"name": name})
    print("mcp volumes: written by one sandbox, read by the next, a second writer refused")


async def main():
    mode = sys.argv[1]
    if mode == "code":
        url, token = sys.argv[2], sys.argv[3]
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=600) as http:
            async with streamable_http_client(url, http_client=http) as (r, w):
                async with ClientSession(r, w) as s:
                    await s.initialize()
                    await code(s)
        return
    if mode == "stdio":
        exe, root = sys.argv[2], sys.argv[3]
        env = dict(os.environ, MCP_TEST_SECRET="mcp-secret-" + os.urandom(8).hex())
        os.environ["MCP_TEST_SECRET"] = env["MCP_TEST_SECRET"]
        params = StdioServerParameters(command=exe, args=["mcp", "--root", root], env=env)
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                await secrets(s)
                made = await scenario(s, root)
                await resources_and_prompt(s, made)
                await port(s, root)
                kept = json.loads(await ok(s, "sandbox_create", ttl_seconds=900, persistent=True))
                assert kept["persistent"] is True, kept
                await idle(s)
                await volumes(s)
        print("stdio session made", " ".join(sorted(made)))
        print("persistent:", kept["sandbox"])
    else:
        url, token, root = sys.argv[2], sys.argv[3], sys.argv[4]
        try:
            async with httpx2.AsyncClient(headers={"Authorization": "Bearer fbx_wrong"}) as http:
                async with streamable_http_client(url, http_client=http) as (r, w):
                    async with ClientSession(r, w) as s:
                        await asyncio.wait_for(s.initialize(), 30)
            raise SystemExit("a bad token was accepted")
        except SystemExit:
            raise
        except BaseException as e:  # the transport refuses: 401
            print("bad token refused:", type(e).__name__)
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=600) as http:
            async with streamable_http_client(url, http_client=http) as (r, w):
                async with ClientSession(r, w) as s:
                    await s.initialize()
                    made = await scenario(s, root)
        print("http session made", " ".join(sorted(made)))
        ids = await asyncio.gather(*(own_only(url, token, n) for n in range(5)))
        assert len(set(ids)) == 5, ids
        print("5 concurrent sessions each saw only their own sandbox")


asyncio.run(main())
