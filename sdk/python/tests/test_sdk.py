"""The Python SDK against a real daemon and real VMs (started by crates/cli/tests/sdk.rs,
which sets FORKBOX_API, FORKBOX_TEST_TCP and FORKBOX_TEST_TOKEN)."""

import asyncio
import json
import os
import tempfile
import time

import pytest

import forkbox
from forkbox import AsyncRuntime, Runtime, Sandbox

TTL = 900


@pytest.fixture(scope="module")
def rt():
    with Runtime() as r:
        yield r


@pytest.fixture(scope="module")
def sbx(rt):
    s = rt.sandboxes.create(ttl_seconds=TTL, labels={"suite": "python-sdk"})
    yield s
    s.stop()


def test_exec_returns_code_and_both_streams(sbx):
    r = sbx.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr, r.ok) == (3, "out\n", "err\n", False)
    assert sbx.exec(["python", "-c", "print(6*7)"], cwd="/tmp").stdout == "42\n"
    assert sbx.exec("echo $A", env={"A": "b c"}).stdout == "b c\n"


def test_plain_output_is_capped_and_flagged_streamed_output_is_whole(sbx):
    r = sbx.exec("head -c 100000 /dev/zero | tr '\\0' x")
    assert len(r.stdout) == 64 * 1024 and r.stdout_truncated
    seen = []
    r = sbx.exec("head -c 100000 /dev/zero | tr '\\0' x", on_stdout=seen.append)
    assert len(r.stdout) == 100000 and not r.stdout_truncated
    assert "".join(seen) == r.stdout


def test_exec_stream_yields_events_then_a_result(sbx):
    s = sbx.exec_stream("echo a; sleep 0.2; echo b >&2")
    events = [(e.stream, e.text) for e in s]
    assert events == [("stdout", "a\n"), ("stderr", "b\n")]
    assert s.result.exit_code == 0


def test_exec_timeout_raises_with_the_partial_result(sbx):
    with pytest.raises(forkbox.ExecTimeout) as e:
        sbx.exec("echo started; sleep 30", timeout_ms=1500)
    assert e.value.result.timed_out and e.value.result.stdout == "started\n"
    with pytest.raises(forkbox.BadRequest, match="timeout"):
        sbx.exec("true", timeout_seconds=25 * 3600)


def test_detached_commands_wait_and_signal(sbx):
    cmd = sbx.start("sleep 1; echo finished")
    assert cmd.poll() is None
    assert cmd.wait().stdout == "finished\n"
    long = sbx.start(["sleep", "600"])
    long.kill(9)
    r = long.wait()
    assert r.signal == 9 or r.exit_code == 137


def test_files_round_trip(sbx, tmp_path):
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "m.py").write_text("X = 1\n")
    (tmp_path / "src" / "README").write_text("hello\n")
    assert sbx.files.upload(str(tmp_path / "src"), "/work/app") > 0
    names = {e.name: e for e in sbx.files.list("/work/app")}
    assert set(names) == {"pkg", "README"} and names["pkg"].is_dir
    assert sbx.files.read_text("/work/app/pkg/m.py") == "X = 1\n"
    sbx.files.write_text("notes/é.txt", "héllo", mode=0o600)
    assert sbx.exec("stat -c %a /root/notes/é.txt; cat /root/notes/é.txt").stdout == "600\nhéllo"
    sbx.files.write_bytes("/tmp/bin", bytes(range(256)))
    assert sbx.files.read_bytes("/tmp/bin") == bytes(range(256))
    assert sbx.files.download("/work/app", str(tmp_path / "back")) == 2
    assert (tmp_path / "back" / "pkg" / "m.py").read_text() == "X = 1\n"
    with pytest.raises(forkbox.NotFound, match="No such file"):
        sbx.files.read_text("/nope")
    with pytest.raises(forkbox.NotFound):
        sbx.files.list("/nope")
    with pytest.raises(forkbox.BadRequest, match="directory"):
        sbx.files.read_bytes("/etc")
    # A device that never ends is refused; a file past 64 MiB costs the host at most that.
    with pytest.raises(forkbox.BadRequest, match="not a regular file"):
        sbx.files.read_bytes("/dev/zero")
    sbx.exec("head -c 70000000 /dev/zero > /tmp/big")
    with pytest.raises(forkbox.BadRequest, match="larger than 64 MiB"):
        sbx.files.read_bytes("/tmp/big")
    sbx.exec("rm /tmp/big")
    with pytest.raises(forkbox.ForkboxError, match="not a directory on this host"):
        sbx.files.upload(str(tmp_path / "missing"), "/x")


def test_downloads_keep_links_and_refuse_devices(sbx, tmp_path):
    sbx.exec("mkdir -p /tmp/evil && ln -sf /etc/passwd /tmp/evil/link && truncate -s 64M /tmp/evil/sparse")
    sbx.files.download("/tmp/evil", str(tmp_path / "evil"))
    assert os.readlink(tmp_path / "evil" / "link") == "/etc/passwd"
    st = os.stat(tmp_path / "evil" / "sparse")
    assert st.st_size == 64 << 20 and st.st_blocks * 512 < 1 << 20
    sbx.exec("mkdir -p /tmp/dev && mknod /tmp/dev/null c 1 3")
    with pytest.raises(forkbox.ForkboxError, match="refused archive entry"):
        sbx.files.download("/tmp/dev", str(tmp_path / "dev"))
    assert not (tmp_path / "dev").exists()


def test_a_program_that_is_not_there_exits_127(sbx):
    for stream in (None, print):
        r = sbx.exec(["no-such-program"], on_stdout=stream)
        assert r.exit_code == 127, r
        assert "no-such-program" in r.stderr


def test_errors_carry_the_daemons_message(rt):
    with pytest.raises(forkbox.NotFound, match="no image no-such-image"):
        rt.sandboxes.create("no-such-image")
    with pytest.raises(forkbox.BadRequest, match="not an image reference"):
        rt.images.get("bad@x")
    s = rt.sandboxes.create(ttl_seconds=TTL)
    s.stop()
    with pytest.raises(forkbox.NotFound, match=f"no sandbox {s.id}"):
        s.exec("true")
    s.stop()  # already gone: no error
    with pytest.raises(ValueError):
        s.fork(count=21)


def test_a_secret_stays_outside_the_guest(rt):
    value = "sdk-secret-" + os.urandom(8).hex()
    with pytest.raises(forkbox.BadRequest, match="no hosts"):
        rt.sandboxes.create(secrets=[{"name": "T", "hosts": [], "value": value}], ttl_seconds=TTL)
    with rt.sandboxes.create(
        secrets=[{"name": "T", "hosts": ["api.example.com"], "value": value}], ttl_seconds=TTL
    ) as s:
        assert s.info["secrets"] == [{"name": "T", "hosts": ["api.example.com"]}]
        assert value not in json.dumps(s.info)
        seen = s.exec(["sh", "-c", "echo $T"]).stdout.strip()
        assert seen.startswith("fbxs_") and value not in seen
        assert "api.example.com" in s.info["network"]["allow"]


def test_a_guest_port_is_reached_through_a_forward(rt):
    with rt.sandboxes.create(ttl_seconds=TTL) as s:
        s.exec(["sh", "-c", "mkdir -p /tmp/w && echo served-by-the-guest > /tmp/w/i.txt"])
        s.start(["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1", "--directory", "/tmp/w"])
        url = s.ports.forward(8000)
        assert url.startswith("http://") and [p["url"] for p in s.ports.list()] == [url]
        with pytest.raises(ValueError):
            s.ports.forward(0)
        if os.environ.get("FORKBOX_TEST_NODES"):
            return  # in a cluster the forward listens on the sandbox's node
        import httpx
        body = ""
        for _ in range(240):
            try:
                body = httpx.get(url + "i.txt", timeout=30).text
                break
            except httpx.HTTPError:
                time.sleep(0.5)
        assert body.strip() == "served-by-the-guest", body
        s.ports.close(int(url.rsplit(":", 1)[1].strip("/")))
        assert s.ports.list() == []


def test_a_pin_to_a_node_that_is_not_there_is_refused(rt):
    # One daemon: it is in no cluster; a cluster: no node has that name. Either says the name.
    with pytest.raises(forkbox.BadRequest, match="no-such-node"):
        rt.sandboxes.create(node="no-such-node", ttl_seconds=TTL)
    assert not rt.sandboxes.list(node="no-such-node")


def test_a_fork_goes_to_the_node_it_is_pinned_to(rt):
    # In a cluster (the test names its nodes): a copy pinned to another node than its source's
    # runs there, its snapshot brought by chunks. One daemon: a pin is refused, naming the node.
    nodes = [n for n in os.environ.get("FORKBOX_TEST_NODES", "").split(",") if n]
    with rt.sandboxes.create(ttl_seconds=TTL) as s:
        s.files.write_bytes("/root/moved", b"with the copy")
        if not nodes:
            with pytest.raises(forkbox.BadRequest, match="no-such-node"):
                s.fork(node="no-such-node")
            return
        other = next(n for n in nodes if n != s.info["node"])
        (copy,) = s.fork(node=other)
        try:
            assert copy.info["node"] == other
            assert copy.info["transfer"]["bytes_moved"] > 0
            assert copy.files.read_bytes("/root/moved") == b"with the copy"
        finally:
            copy.stop()


def test_a_daemon_that_is_not_running_is_named():
    with pytest.raises(forkbox.DaemonNotRunning, match="no forkbox daemon answers on /nonexistent"):
        Runtime(api="unix:/nonexistent/forkbox.sock").info()
    with pytest.raises(forkbox.ForkboxError, match="FORKBOX_API"):
        Runtime(api="localhost:1234")


def test_tcp_needs_the_right_token():
    tcp, token = os.environ["FORKBOX_TEST_TCP"], os.environ["FORKBOX_TEST_TOKEN"]
    with pytest.raises(forkbox.AuthError):
        Runtime(api=tcp, token="fbx_wrong").info()
    with Runtime(api=tcp, token=token) as r:
        assert r.info()["accel"]["accel"] in ("kvm", "tcg")


def test_with_deletes_the_sandbox_even_when_the_block_raises(rt):
    with pytest.raises(RuntimeError):
        with Sandbox.create(ttl_seconds=TTL) as s:
            sid = s.id
            assert s.exec("true").ok
            raise RuntimeError("boom")
    with pytest.raises(forkbox.NotFound):
        rt.sandboxes.get(sid)


def test_snapshot_forks_as_context_managers_and_stays(rt, sbx):
    sbx.exec("echo base > /root/state; sleep 3000 & echo $! > /root/pid")
    snap = sbx.snapshot()
    try:
        with snap.fork(ttl_seconds=TTL) as a:
            assert a.exec("cat /root/state").stdout == "base\n"
            assert a.exec("kill -0 $(cat /root/pid) && echo alive").stdout == "alive\n"
            a.exec("echo changed > /root/state")
            aid = a.id
        with pytest.raises(forkbox.NotFound):
            rt.sandboxes.get(aid)
        with snap.fork(ttl_seconds=TTL) as b:
            assert b.exec("cat /root/state").stdout == "base\n"
        copies = sbx.fork(count=2, ttl_seconds=TTL)
        try:
            assert len({c.id for c in copies}) == 2
            assert all(c.exec("cat /root/state").stdout == "base\n" for c in copies)
        finally:
            for c in copies:
                c.stop()
    finally:
        snap.delete()


def test_hibernate_and_resume_keep_processes(rt):
    with rt.sandboxes.create(ttl_seconds=TTL) as s:
        s.exec("sleep 3000 & echo $! > /root/pid")
        s.hibernate()
        assert s.info["state"] == "hibernated"
        with pytest.raises(forkbox.Conflict, match="hibernated"):
            s.exec("true")
        s.resume()
        assert s.exec("kill -0 $(cat /root/pid) && echo alive").stdout == "alive\n"


def test_an_idle_sandbox_sleeps_and_an_exec_wakes_it(rt):
    with rt.sandboxes.create(ttl_seconds=TTL, idle_seconds=2) as s:
        assert s.info["idle"] == {"after_secs": 2, "action": "hibernate"}
        assert s.info["wake_on_use"] is True
        s.exec("sleep 3000 & echo $! > /root/pid")
        deadline = time.time() + 90
        while s.state != "sleeping" and time.time() < deadline:
            time.sleep(0.5)
        assert s.state == "sleeping"
        assert s.exec("kill -0 $(cat /root/pid) && echo alive").stdout == "alive\n"
        assert s.refresh().info["state"] == "running"
        s.set_idle(None)
        assert s.info.get("idle") is None
        s.set_idle(60, wake_on_use=False)
        assert s.info["idle"]["after_secs"] == 60 and s.info["wake_on_use"] is False
        with pytest.raises(forkbox.BadRequest, match="idle.after_secs"):
            s.set_idle(8 * 24 * 3600)


def test_a_volume_outlives_its_writer_and_is_read_by_the_next(rt):
    name = f"py-sdk-{os.getpid()}"
    v = rt.volumes.create(name, size="32m")
    assert v["name"] == name and v["size_bytes"] == 32 << 20 and v["holders"] == []
    try:
        with pytest.raises(forkbox.Conflict, match="exists"):
            rt.volumes.create(name)
        with rt.sandboxes.create(ttl_seconds=TTL, volumes=[f"{name}:/data"]) as w:
            assert w.exec("echo kept > /data/f && sync").exit_code == 0
            assert w.info["volumes"] == [{"name": name, "path": "/data", "read_only": False, "slot": 0}]
            with pytest.raises(forkbox.Conflict, match=f"{w.id} has it read-write"):
                rt.sandboxes.create(ttl_seconds=TTL, volumes=[f"{name}:/data:ro"])
            with pytest.raises(forkbox.Conflict, match="in use"):
                rt.volumes.remove(name)
        with rt.sandboxes.create(ttl_seconds=TTL, volumes=[{"name": name, "path": "/v", "read_only": True}]) as r:
            assert r.exec("cat /v/f").stdout == "kept\n"
            assert rt.volumes.get(name)["holders"] == [{"sandbox": r.id, "read_only": True}]
    finally:
        rt.volumes.remove(name)
    with pytest.raises(forkbox.NotFound, match=f"no volume {name}"):
        rt.volumes.get(name)


def test_images_build_from_a_seed_and_offer_python(rt):
    progress = []
    img = rt.images.build(
        "sdk-py-test",
        {"base": "python-bookworm", "run": ["echo seeded > /etc/forkbox-sdk-test"]},
        if_changed=True,
        on_progress=progress.append,
    )
    assert img.name == "sdk-py-test" and img.base and img.base.startswith("python-bookworm@")
    assert rt.images.get(img.reference).reference == img.reference
    assert img.reference in [i.reference for i in rt.images.list()]
    again = rt.images.build(
        "sdk-py-test",
        {"base": "python-bookworm", "run": ["echo seeded > /etc/forkbox-sdk-test"]},
        if_changed=True,
    )
    assert again.reference == img.reference
    with rt.sandboxes.create(img.reference, ttl_seconds=TTL) as s:
        r = s.exec("cat /etc/forkbox-sdk-test; python -V")
        assert r.stdout.startswith("seeded\nPython 3.11"), r
    with pytest.raises(forkbox.BadRequest, match="bsae"):
        rt.images.build("x", {"bsae": "bookworm"})
    with pytest.raises(forkbox.BuildError, match="no image no-such-base"):
        rt.images.build("x", {"base": "no-such-base"})


def test_ten_concurrent_execs_from_the_async_client():
    async def main():
        async with AsyncRuntime() as rt:
            async with await rt.sandboxes.create(ttl_seconds=TTL) as s:
                results = await asyncio.gather(
                    *(s.exec(f"sleep 0.5; echo {i}") for i in range(10))
                )
                assert [r.stdout for r in results] == [f"{i}\n" for i in range(10)]
                seen = []
                r = await s.exec("echo a; echo b", on_stdout=seen.append)
                assert "".join(seen) == "a\nb\n" == r.stdout
                await s.files.write_text("f.txt", "x")
                assert await s.files.read_text("/root/f.txt") == "x"
                snap = await s.snapshot()
                try:
                    async with await snap.fork(ttl_seconds=TTL) as c:
                        assert (await c.exec("cat /root/f.txt")).stdout == "x"
                finally:
                    await snap.delete()
            with pytest.raises(forkbox.NotFound):
                await rt.sandboxes.get(s.id)

    asyncio.run(main())
