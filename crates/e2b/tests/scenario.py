"""E2B's published Python SDK (`e2b` from PyPI), unchanged, against a forkbox daemon.

Run by crates/cli/tests/e2b.rs with E2B_API_KEY and E2B_API_URL + E2B_SANDBOX_URL (or
E2B_DOMAIN) set; `sync` or `async` as the first argument. Every step prints `ok: STEP (S s)`;
the first failure raises. Nothing here knows forkbox: it is what an agent written for E2B does.
"""

import asyncio
import importlib.metadata
import io
import os
import sys
import time
import urllib.error
import urllib.request
import uuid

import e2b
from e2b import (
    AsyncSandbox,
    AuthenticationException,
    CommandExitException,
    NotFoundException,
    Sandbox,
    SandboxQuery,
    TimeoutException,
)
from e2b.sandbox.commands.command_handle import PtySize

TEMPLATE = os.environ.get("E2B_TEMPLATE", "base")
# What the SDK raises for a 503 ("retry"): ServiceBusyException since it has one, else
# SandboxException.
BUSY = tuple(c for c in (getattr(e2b, "ServiceBusyException", None), e2b.SandboxException) if c)
RUN = uuid.uuid4().hex[:10]
V = tuple(int(x) for x in importlib.metadata.version("e2b").split(".")[:2])
T0 = time.time()


def ok(step, since):
    print(f"ok: {step} ({time.time() - since:.1f} s)", flush=True)


def wait_for(pred, limit=30.0, every=0.3):
    end = time.time() + limit
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(every)
    return pred()


def sync_suite():
    t = time.time()
    try:
        Sandbox.create(template=TEMPLATE, api_key="fbx_not_a_token_" + "0" * 40)
        raise AssertionError("a wrong key created a sandbox")
    except AuthenticationException:
        pass
    ok("a wrong key is refused (AuthenticationException)", t)

    t = time.time()
    # On a fresh home the `base` image is still building (minutes under TCG): the create
    # answers within the SDK's own request timeout, saying how far the build is, and an agent
    # tries again (for up to E2B_FIRST_CREATE_WAIT seconds here).
    give_up = time.time() + float(os.environ.get("E2B_FIRST_CREATE_WAIT", "0"))
    while True:
        try:
            sbx = Sandbox.create(
                template=TEMPLATE,
                timeout=600,
                metadata={"suite": "py-sync", "run": RUN},
                envs={"GREETING": "hello from envs"},
            )
            break
        except BUSY as err:
            if "is not ready yet" not in str(err) or time.time() > give_up:
                raise
            print(f"not ready: {err}", flush=True)
            # Not 10 s: the daemon closes a connection idle that long, and a request sent on
            # it as it closes fails in the SDK's transport.
            time.sleep(4)
    ok(f"create {sbx.sandbox_id} from {TEMPLATE}", t)
    try:
        run_sync_steps(sbx)
    finally:
        sbx.kill()


def run_sync_steps(sbx):
    t = time.time()
    seen = []
    r = sbx.commands.run(
        "echo $GREETING; for i in 1 2 3; do echo line $i; sleep 0.2; done; echo oops >&2",
        on_stdout=lambda s: seen.append((time.time(), s)),
    )
    assert r.exit_code == 0, r
    assert r.stdout == "hello from envs\nline 1\nline 2\nline 3\n", repr(r.stdout)
    assert r.stderr == "oops\n", repr(r.stderr)
    assert len(seen) >= 3 and seen[-1][0] - seen[0][0] > 0.3, f"not streamed: {seen}"
    ok("commands.run streams stdout as it comes, stderr apart, envs of the create", t)

    t = time.time()
    try:
        sbx.commands.run("echo out; exit 3")
        raise AssertionError("exit 3 did not raise")
    except CommandExitException as e:
        assert e.exit_code == 3 and e.stdout == "out\n", e
    ok("a nonzero exit raises CommandExitException with its code", t)

    t = time.time()
    try:
        sbx.commands.run("sleep 30", timeout=2)
        raise AssertionError("a command past its timeout returned")
    except TimeoutException:
        pass
    ok("a command past its timeout raises TimeoutException (Connect's deadline_exceeded)", t)

    t = time.time()
    assert sbx.commands.run("whoami").stdout.strip() == "user"
    assert sbx.commands.run("pwd").stdout.strip() == "/home/user"
    assert sbx.commands.run("whoami", user="root").stdout.strip() == "root"
    assert sbx.commands.run("pwd", cwd="/tmp").stdout.strip() == "/tmp"
    assert sbx.commands.run("echo $X", envs={"X": "y"}).stdout == "y\n"
    ok("commands run as `user` in its home by default, as root, in a cwd, with envs", t)

    t = time.time()
    h = sbx.commands.run("sleep 300", background=True)
    procs = sbx.commands.list()
    assert h.pid in [p.pid for p in procs], (h.pid, procs)
    mine = [p for p in procs if p.pid == h.pid][0]
    assert mine.cmd == "/bin/bash" and mine.args[-1] == "sleep 300", mine
    assert sbx.commands.kill(h.pid) is True
    try:
        h.wait()
        raise AssertionError("a killed command exited 0")
    except CommandExitException:
        pass
    assert h.pid not in [p.pid for p in sbx.commands.list()]
    assert sbx.commands.kill(h.pid) is False
    ok("background command: listed, killed, gone from the list; kill of a dead pid is False", t)

    t = time.time()
    h = sbx.commands.run("cat; echo done", background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "first\n")
    if hasattr(sbx.commands, "stream_input"):
        sbx.commands.stream_input(h.pid, ["second\n", "third\n"])
    else:
        sbx.commands.send_stdin(h.pid, "second\nthird\n")
    sbx.commands.close_stdin(h.pid)
    r = h.wait()
    assert r.stdout == "first\nsecond\nthird\ndone\n", repr(r.stdout)
    ok("stdin: send_stdin, stream_input, close_stdin", t)

    t = time.time()
    h = sbx.commands.run("for i in $(seq 1 30); do echo tick $i; sleep 0.2; done", background=True)
    pid = h.pid
    h.disconnect()
    time.sleep(1.0)
    again = sbx.commands.connect(pid)
    r = again.wait()
    assert "tick 30" in r.stdout, r.stdout
    ok("a background command outlives its client and is reconnected by pid", t)

    t = time.time()
    got = []
    p = sbx.pty.create(PtySize(rows=24, cols=80))
    sbx.pty.send_stdin(p.pid, b"stty size; echo pty-$((6*7))\n")
    resized = False
    for _out, _err, pty in p:
        if pty:
            got.append(pty)
        text = b"".join(got).decode(errors="replace")
        if not resized and "pty-42" in text:
            sbx.pty.resize(p.pid, PtySize(rows=30, cols=100))
            sbx.pty.send_stdin(p.pid, b"stty size; exit\n")
            resized = True
    text = b"".join(got).decode(errors="replace")
    assert "pty-42" in text and "24 80" in text and "30 100" in text, text
    ok("PTY: create, send_stdin, resize, exit", t)

    if os.environ.get("E2B_SANDBOX_URL"):
        # What the code interpreter's SDK does for its port: the sandbox URL with the port in
        # E2b-Sandbox-Port.
        t = time.time()
        sbx.files.write("/home/user/site2/index.html", "port 8081 in the guest")
        sbx.commands.run("cd /home/user/site2 && python3 -m http.server 8081", background=True, timeout=0)
        req = lambda: urllib.request.Request(
            os.environ["E2B_SANDBOX_URL"] + "/index.html",
            headers={"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8081"},
        )
        body = wait_for(lambda: fetch(req()), 60, 0.5)
        assert body == "port 8081 in the guest", body
        ok("E2b-Sandbox-Port reaches another port of the sandbox through the sandbox URL", t)

    if os.environ.get("E2B_DOMAIN"):
        t = time.time()
        sbx.files.write("/home/user/site/index.html", "served from the guest")
        sbx.commands.run("cd /home/user/site && python3 -m http.server 8080", background=True, timeout=0)
        host = sbx.get_host(8080)
        assert host == f"8080-{sbx.sandbox_id}.{os.environ['E2B_DOMAIN']}", host
        body = wait_for(lambda: fetch(f"https://{host}/index.html"), 60, 0.5)
        assert body == "served from the guest", body
        ok(f"get_host(8080) reaches a server in the guest over https://{host}", t)

    t = time.time()
    h = sbx.commands.run("sleep 600", background=True, timeout=10)
    pid = h.pid
    h.disconnect()
    listed = [p.pid for p in sbx.commands.list()]
    # Listed while its timeout runs (a busy host may have taken that long to get here).
    assert pid in listed or time.time() - t > 9, (pid, listed)
    gone = wait_for(lambda: pid not in [p.pid for p in sbx.commands.list()], 60, 0.5)
    assert gone, "a command outlived its timeout after its client let go"
    ok("a command whose client let go ends at its timeout, leaving no orphan", t)

    files_steps(sbx)
    network_steps()
    volume_steps()
    secret_steps()
    lifecycle_steps(sbx)


def volume_steps():
    if not hasattr(e2b, "Volume"):
        return
    t = time.time()
    name = f"vol-{RUN}"
    vol = e2b.Volume.create(name)
    try:
        assert vol.name == name, vol
        assert name in [v.name for v in e2b.Volume.list()]
        assert e2b.Volume.get_info(vol.volume_id).name == name
        content = hasattr(vol, "write_file")
        if content:
            # Without a sandbox of the user's: the daemon's helper has the volume.
            t = time.time()
            d = vol.make_dir("/seed")
            assert d.type.value == "directory" and d.path == "/seed", d
            w = vol.write_file("/seed/hello.txt", "from the content API", mode=0o600, uid=1000)
            assert (w.name, w.size, w.mode, w.uid) == ("hello.txt", 20, 0o600, 1000), w
            assert vol.read_file("/seed/hello.txt") == "from the content API"
            assert [e.name for e in vol.list("/seed")] == ["hello.txt"]
            assert vol.exists("/seed/hello.txt") and not vol.exists("/nothing")
            try:
                vol.write_file("/seed/hello.txt", "again")
                raise AssertionError("a write over a file without force succeeded")
            except e2b.VolumeException:
                pass
            try:
                vol.read_file("/../etc/passwd")
                raise AssertionError("a path out of the volume was read")
            except e2b.VolumeException:
                pass
            ok("Volume content without a sandbox: make_dir, write_file, read_file, list, exists", t)
        a = Sandbox.create(template=TEMPLATE, timeout=300, metadata={"run": RUN},
                           volume_mounts={"/mnt/shared": vol})
        try:
            if content:
                seen = a.commands.run("cat /mnt/shared/seed/hello.txt; stat -c %a:%u /mnt/shared/seed/hello.txt")
                assert seen.stdout == "from the content API600:1000\n", seen.stdout
            a.commands.run("echo written-by-a > /mnt/shared/note && sync")
            if content:
                # Through the sandbox that has it mounted: what it wrote, at once.
                assert vol.read_file("/note") == "written-by-a\n"
                vol.write_file("/from-api", b"\x00\x01binary")
                assert a.files.read("/mnt/shared/from-api", format="bytes") == b"\x00\x01binary"
            mounts = Sandbox.get_info(a.sandbox_id).volume_mounts
            assert mounts == [{"name": name, "path": "/mnt/shared"}], mounts
            try:
                Sandbox.create(template=TEMPLATE, timeout=300, volume_mounts={"/data": name})
                raise AssertionError("a second sandbox mounted the volume another writes")
            except e2b.SandboxException as e:
                assert "in use" in str(e) and a.sandbox_id in str(e), e
        finally:
            a.kill()
        b = Sandbox.create(template=TEMPLATE, timeout=300, metadata={"run": RUN},
                           volume_mounts={"/data": name})
        try:
            assert b.files.read("/data/note") == "written-by-a\n"
        finally:
            b.kill()
        if content:
            vol.remove("/seed")
            assert not vol.exists("/seed")
            assert sorted(e.name for e in vol.list("/")) == ["from-api", "lost+found", "note"], \
                [e.name for e in vol.list("/")]
    finally:
        assert e2b.Volume.destroy(vol.volume_id) is True
    assert e2b.Volume.destroy(vol.volume_id) is False
    ok("Volume.create, volume_mounts: written by one sandbox, read by the next; a second writer refused; destroy", t)


def secret_steps():
    if not hasattr(e2b, "Secret"):
        return
    t = time.time()
    name = f"key-{RUN}"
    value = f"s3cr3t-{uuid.uuid4().hex}"
    info = e2b.Secret.create(name, value, metadata={"env": "test"})
    try:
        assert info.secret_id.startswith("sec_") and info.name == name and info.version == 1, info
        assert not hasattr(info, "value")
        assert e2b.Secret.get_info(name).secret_id == info.secret_id
        assert e2b.Secret.exists(info.secret_id) and not e2b.Secret.exists(f"nope-{RUN}")
        updated = e2b.Secret.update(name, value + "-2")
        assert updated.version == 2, updated
        listed = [s.name for s in e2b.Secret.list().next_items()]
        assert name in listed, listed
        # Another key sees none of them.
        other = os.environ.get("E2B_OTHER_KEY")
        if other:
            assert not e2b.Secret.exists(name, api_key=other)
        try:
            Sandbox.create(template=TEMPLATE, timeout=60, network={
                "rules": {"api.example.com": [{"transform": {"headers": {
                    "Authorization": "Bearer " + e2b.Secret.fill(f"missing-{RUN}")}}}]}})
            raise AssertionError("a rule naming a missing secret made a sandbox")
        except e2b.SandboxException as e:
            assert "no secret named" in str(e), e
        # A rule with the secret: the guest holds neither the value nor a placeholder of it.
        s = Sandbox.create(template=TEMPLATE, timeout=120, network={
            "allow_out": ["api.example.com"], "deny_out": ["0.0.0.0/0"],
            "rules": {"api.example.com": [{"transform": {"headers": {
                "Authorization": "Bearer " + e2b.Secret.fill(name)}}}]}})
        try:
            env = s.commands.run("env; cat /proc/1/environ | tr '\\0' '\\n'", user="root").stdout
            assert value not in env and "E2B_RULE" not in env, env
        finally:
            s.kill()
    finally:
        assert e2b.Secret.destroy(info.secret_id) is True
    assert e2b.Secret.destroy(info.secret_id) is False
    ok("Secret: create, get_info, exists, update, list (no values), another key sees none; "
       "a rule puts one in at egress, never in the guest", t)


def network_steps():
    t = time.time()
    probe = "python3 -c \"import socket; socket.create_connection(('192.0.2.1', 80), 2)\""
    closed = Sandbox.create(template=TEMPLATE, timeout=300, allow_internet_access=False)
    try:
        assert closed.get_info().allow_internet_access is False
        try:
            closed.commands.run(probe)
            raise AssertionError("a sandbox without internet access connected out")
        except CommandExitException as e:
            assert "Error" in e.stderr, e.stderr
    finally:
        closed.kill()
    listed = Sandbox.create(
        template=TEMPLATE, timeout=300,
        network={"deny_out": ["0.0.0.0/0"], "allow_out": ["pypi.org"]},
    )
    try:
        info = listed.get_info()
        assert info.allow_internet_access is False, info
    finally:
        listed.kill()
    # A deny list of some addresses keeps the rest open; the guest's proxy refuses a denied
    # address naming the entry (an allowOut address in it would win).
    denied = Sandbox.create(
        template=TEMPLATE, timeout=60,
        network={"deny_out": ["10.0.0.0/8"], "allow_out": ["10.1.2.3"]},
    )
    try:
        assert denied.get_info().allow_internet_access is True
        fetch_denied = (
            "python3 -c \"import urllib.request as u\n"
            "try: u.urlopen('http://10.9.9.9/', timeout=10)\n"
            "except Exception as e: print(e, getattr(e, 'fp', None) and e.fp.read())\""
        )
        said = denied.commands.run(fetch_denied).stdout
        assert "403" in said and "10.0.0.0/8" in said, said
    finally:
        denied.kill()
    opened = Sandbox.create(template=TEMPLATE, timeout=60)
    proxy = "echo ${HTTPS_PROXY:-none}"
    try:
        assert opened.get_info().allow_internet_access is True
        assert opened.commands.run(proxy).stdout.strip() != "none"
        if hasattr(opened, "update_network"):
            opened.update_network({"deny_out": ["0.0.0.0/0"]})
            assert opened.get_info().allow_internet_access is False
            assert opened.commands.run(proxy).stdout.strip() == "none"
            opened.update_network({"allow_out": ["pypi.org"], "deny_out": ["0.0.0.0/0"]})
            info = opened.get_info()
            assert info.allow_internet_access is False and opened.commands.run(proxy).stdout.strip() != "none"
            opened.update_network({})
            assert opened.get_info().allow_internet_access is True
    finally:
        opened.kill()
    ok("network: no internet access, deny all but allowOut, a partial denyOut refused in the guest naming it, update_network", t)


def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.read().decode()
    except Exception as e:
        print(f"  ({url}: {e})", flush=True)
        return None


def files_steps(sbx):
    t = time.time()
    info = sbx.files.write("/home/user/notes/a.txt", "hello file")
    assert info.path == "/home/user/notes/a.txt", info
    assert sbx.files.read("/home/user/notes/a.txt") == "hello file"
    assert sbx.files.read("notes/a.txt") == "hello file"
    assert sbx.commands.run("stat -c %U notes notes/a.txt").stdout.split() == ["user", "user"]
    data = bytes(range(256)) * 4096
    sbx.files.write("/tmp/blob.bin", data)
    assert sbx.files.read("/tmp/blob.bin", format="bytes") == data
    # A file-like object and an iterable go as one octet-stream body, gzip on request; several
    # files as one multipart body.
    sbx.files.write("/tmp/stream.bin", io.BytesIO(data[:300_000]))
    if V >= (2, 60):
        sbx.files.write("/tmp/chunks.bin", (data[i:min(i + 65536, 200_000)] for i in range(0, 200_000, 65536)))
    else:
        sbx.files.write("/tmp/chunks.bin", io.BytesIO(data[:200_000]))
    sbx.files.write("/tmp/zipped.txt", "squeeze " * 1000, gzip=True)
    assert sbx.files.read("/tmp/stream.bin", format="bytes") == data[:300_000]
    assert sbx.files.read("/tmp/chunks.bin", format="bytes") == data[:200_000]
    assert sbx.files.read("/tmp/zipped.txt", gzip=True) == "squeeze " * 1000
    from e2b.sandbox.filesystem.filesystem import WriteEntry
    infos = sbx.files.write_files([WriteEntry(path="/tmp/m/one", data="1"), WriteEntry(path="/tmp/m/two", data=b"2")])
    assert sorted(i.path for i in infos) == ["/tmp/m/one", "/tmp/m/two"], infos
    assert sbx.files.read("/tmp/m/two") == "2"
    ok("files.write/read: text, bytes, streams, gzip, several at once; relative paths; the user owns what it wrote", t)

    t = time.time()
    names = {e.name: e for e in sbx.files.list("/home/user/notes")}
    assert names["a.txt"].size == 10 and names["a.txt"].type.value == "file", names
    assert sbx.files.exists("/home/user/notes/a.txt")
    assert not sbx.files.exists("/home/user/nope")
    assert sbx.files.make_dir("/home/user/d/e") is True
    assert sbx.files.make_dir("/home/user/d/e") is False
    deep = [e.path for e in sbx.files.list("/home/user/d", depth=2)]
    assert "/home/user/d/e" in deep, deep
    moved = sbx.files.rename("/home/user/notes/a.txt", "/home/user/d/b.txt")
    assert moved.path == "/home/user/d/b.txt", moved
    assert sbx.files.get_info("/home/user/d/b.txt").size == 10
    sbx.files.remove("/home/user/d")
    assert not sbx.files.exists("/home/user/d")
    try:
        sbx.files.read("/home/user/d/b.txt")
        raise AssertionError("a removed file was read")
    except NotFoundException:
        pass
    # As on E2B, the files API acts with envd's privileges and gives what it makes to the user.
    sbx.files.write("/opt/tool/conf/x.txt", "x")
    assert sbx.commands.run("stat -c %U /opt/tool /opt/tool/conf/x.txt").stdout.split() == ["user", "user"]
    assert sbx.files.make_dir("/srv/data/deep") is True
    assert sbx.commands.run("stat -c %U /srv/data/deep").stdout.strip() == "user"
    assert sbx.commands.run("stat -c %U /srv").stdout.strip() == "root"
    ok("files.list/exists/make_dir/rename/get_info/remove, not found; what it makes is the user's", t)

    t = time.time()
    sbx.files.make_dir("/home/user/w")
    w = sbx.files.watch_dir("/home/user/w")
    evs = []

    def seen(kind, name):
        evs.extend(w.get_new_events())
        return (kind, name) in [(e.type.value, e.name) for e in evs]

    # Each change waits for the last to be seen (the watcher compares listings every 200 ms).
    sbx.files.write("/home/user/w/new.txt", "1")
    assert wait_for(lambda: seen("create", "new.txt"), 20), evs
    sbx.commands.run("mv /home/user/w/new.txt /home/user/w/renamed.txt")
    assert wait_for(lambda: seen("rename", "new.txt"), 20), evs
    sbx.commands.run("rm /home/user/w/renamed.txt")
    assert wait_for(lambda: seen("remove", "renamed.txt"), 20), evs
    w.stop()
    kinds = [(e.type.value, e.name) for e in evs]
    assert ("create", "renamed.txt") in kinds, kinds
    ok(f"files.watch_dir sees create, rename, remove ({len(kinds)} events)", t)


def lifecycle_steps(sbx):
    t = time.time()
    sbx.set_timeout(900)
    info = sbx.get_info()
    assert info.sandbox_id == sbx.sandbox_id and info.metadata["run"] == RUN, info
    assert info.state.value == "running", info.state
    assert info.end_at.timestamp() - time.time() > 800, info.end_at
    ok("set_timeout and get_info (metadata, state, end)", t)

    t = time.time()
    m = sbx.get_metrics()
    assert m and m[-1].mem_total > 0 and m[-1].disk_total > 0 and m[-1].cpu_count >= 1, m
    ok("get_metrics", t)

    t = time.time()
    other = Sandbox.create(template=TEMPLATE, timeout=300, metadata={"suite": "py-sync", "run": RUN, "n": "2"})
    try:
        found = Sandbox.list(query=SandboxQuery(metadata={"run": RUN}))
        items = []
        pages = 0
        p = Sandbox.list(query=SandboxQuery(metadata={"run": RUN}), limit=1)
        while p.has_next:
            items += p.next_items()
            pages += 1
        ids = {s.sandbox_id for s in items}
        assert ids == {sbx.sandbox_id, other.sandbox_id} and pages == 2, (ids, pages)
        only = Sandbox.list(query=SandboxQuery(metadata={"n": "2", "run": RUN})).next_items()
        assert [s.sandbox_id for s in only] == [other.sandbox_id], only
        del found
        ok("Sandbox.list filtered by metadata, paged one at a time (x-next-token)", t)

        t = time.time()
        # A data-plane token of one sandbox does not open another.
        envd = os.environ.get("E2B_SANDBOX_URL") or f"https://49983-{other.sandbox_id}.{os.environ['E2B_DOMAIN']}"
        req = urllib.request.Request(
            envd + "/health",
            headers={"E2b-Sandbox-Id": other.sandbox_id, "X-Access-Token": sbx._envd_access_token or ""},
        )
        try:
            urllib.request.urlopen(req)
            raise AssertionError("another sandbox's token was taken")
        except urllib.error.HTTPError as e:
            assert e.code == 401, e.code
        ok("a sandbox's access token is refused on another sandbox", t)

        other_key = os.environ.get("E2B_OTHER_KEY")
        if other_key:
            t = time.time()
            try:
                Sandbox.get_info(other.sandbox_id, api_key=other_key)
                raise AssertionError("another key saw the sandbox")
            except NotFoundException:
                pass
            assert Sandbox.kill(other.sandbox_id, api_key=other_key) is False
            theirs = Sandbox.list(api_key=other_key).next_items()
            assert other.sandbox_id not in [s.sandbox_id for s in theirs], theirs
            try:
                Sandbox.connect(other.sandbox_id, api_key=other_key)
                raise AssertionError("another key connected to the sandbox")
            except NotFoundException:
                pass
            ok("another key neither sees, lists, connects to nor kills the sandbox", t)
    finally:
        other.kill()

    t = time.time()
    sbx.commands.run("echo 0 > /tmp/count", user="root")
    sbx.commands.run("nohup sh -c 'while :; do n=$(cat /tmp/count); echo $((n+1)) > /tmp/count; sleep 0.2; done' >/dev/null 2>&1 &", user="root")
    sbx.files.write("/home/user/kept.txt", "kept")
    time.sleep(1)
    # Printing as the sandbox pauses: none of its output may be lost across the pause.
    printing = sbx.commands.run("for i in $(seq 1 30000); do echo $i; done; sleep 5; echo done", background=True)
    time.sleep(0.3)
    assert sbx.pause() in (True, None)
    assert Sandbox.get_info(sbx.sandbox_id).state.value == "paused"
    paused = Sandbox.list(query=SandboxQuery(metadata={"run": RUN}, state=[e2b.SandboxState.PAUSED])).next_items()
    assert [s.sandbox_id for s in paused] == [sbx.sandbox_id], paused
    running = Sandbox.list(query=SandboxQuery(metadata={"run": RUN}, state=[e2b.SandboxState.RUNNING])).next_items()
    assert sbx.sandbox_id not in [s.sandbox_id for s in running], running
    assert not sbx.is_running()
    back = Sandbox.connect(sbx.sandbox_id)
    before = int(back.files.read("/tmp/count"))
    # Its counter goes on (within 15 s: a resumed guest on a busy TCG host may take a while).
    after = before
    deadline = time.time() + 15
    while after <= before and time.time() < deadline:
        time.sleep(0.5)
        after = int(back.files.read("/tmp/count"))
    assert after > before > 0, (before, after)
    assert back.files.read("/home/user/kept.txt") == "kept"
    lines = back.commands.connect(printing.pid).wait().stdout.split()
    want = [str(i) for i in range(1, 30001)] + ["done"]
    lost = len(set(want) - set(lines))
    assert lines == want, f"{lost} of {len(want)} lines lost across the pause ({len(lines)} came)"
    ok(f"pause, then connect resumes it with its processes (counter {before} -> {after}), "
       "a command printing through the pause losing none of its 30,000 lines", t)

    if "lifecycle" in Sandbox.create.__code__.co_varnames:
        t = time.time()
        # Paused by its timeout, and woken by the next command (E2B's autoResume): the caller
        # sees only the delay.
        auto = Sandbox.create(
            template=TEMPLATE,
            timeout=20,
            metadata={"run": RUN},
            lifecycle={"on_timeout": "pause", "auto_resume": True},
        )
        try:
            auto.commands.run("echo before-the-pause > /tmp/kept", user="root")
            assert wait_for(lambda: Sandbox.get_info(auto.sandbox_id).state.value == "paused", 90), \
                Sandbox.get_info(auto.sandbox_id)
            info = Sandbox.get_info(auto.sandbox_id)
            assert info.lifecycle and info.lifecycle.get("auto_resume") is True, info.lifecycle
            woke = time.time()
            out = auto.commands.run("cat /tmp/kept", user="root")
            assert out.stdout == "before-the-pause\n", out
            assert Sandbox.get_info(auto.sandbox_id).state.value == "running"
            ok(f"on_timeout pause + auto_resume: paused by its timeout, woken by a command ({time.time() - woke:.1f} s)", t)
        finally:
            auto.kill()

    if hasattr(sbx, "create_snapshot"):
        t = time.time()
        snap = sbx.create_snapshot()
        sid = snap.snapshot_id
        listed = [s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items()]
        assert sid in listed, (sid, listed)
        fresh = Sandbox.create(template=sid, timeout=300)
        try:
            assert fresh.files.read("/home/user/kept.txt") == "kept"
            assert int(fresh.files.read("/tmp/count")) > 0
        finally:
            fresh.kill()
        assert Sandbox.delete_snapshot(sid) is True
        assert Sandbox.delete_snapshot(sid) is False
        ok("create_snapshot, list_snapshots, a create from it, delete_snapshot", t)

    if hasattr(sbx, "fork"):
        t = time.time()
        sbx.commands.run("echo parent > /tmp/who")
        copies = sbx.fork(count=3, timeout=300)
        try:
            assert len(copies) == 3 and all(isinstance(c, Sandbox) for c in copies), copies
            for i, c in enumerate(copies):
                assert c.files.read("/tmp/who") == "parent\n"
                c.commands.run(f"echo copy{i} > /tmp/who")
                h = c.commands.run(f"sleep 200 # copy{i}", background=True)
                listed = [p.args[-1] for p in c.commands.list()]
                assert f"sleep 200 # copy{i}" in listed, listed
                for j in range(i):
                    assert f"sleep 200 # copy{j}" not in listed, listed
                del h
            assert [c.files.read("/tmp/who") for c in copies] == ["copy0\n", "copy1\n", "copy2\n"]
            assert sbx.files.read("/tmp/who") == "parent\n"
        finally:
            for c in copies:
                if isinstance(c, Sandbox):
                    c.kill()
        ok("fork(count=3): each copy has the parent's files and a process table of its own", t)

    t = time.time()
    short = Sandbox.create(template=TEMPLATE, timeout=3)
    gone = wait_for(lambda: short.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()], 30)
    assert gone, "the sandbox outlived its timeout"
    try:
        Sandbox.get_info(short.sandbox_id)
        raise AssertionError("an expired sandbox answered")
    except NotFoundException:
        pass
    assert Sandbox.kill(short.sandbox_id) is False
    ok("a sandbox past its timeout is gone (get_info NotFound, kill False)", t)

    t = time.time()
    full = Sandbox.create(template=TEMPLATE, timeout=300)
    try:
        # All the free room, root's reserve too, taken in a second (allocated, nothing written).
        full.commands.run(
            "mkdir /fill; i=0; for sz in 1G 256M 64M 16M 4M 1M 256K 64K 16K 4K; do "
            "while fallocate -l $sz /fill/$i 2>/dev/null; do i=$((i+1)); done; done", user="root"
        )
        try:
            full.files.write("/home/user/more.bin", b"x" * (4 << 20))
            raise AssertionError("a write to a full disk succeeded")
        except e2b.NotEnoughSpaceException:
            pass
        full.commands.run("rm -r /fill", user="root")
        full.files.write("/home/user/more.bin", b"x" * (4 << 20))
    finally:
        full.kill()
    ok("a full guest disk is NotEnoughSpaceException; room made, the write goes through", t)

    t = time.time()
    h = sbx.commands.run("sleep 120", background=True)
    victim_id = sbx.sandbox_id
    assert Sandbox.kill(victim_id) is True
    try:
        h.wait()
        raise AssertionError("a killed sandbox's command ended well")
    except Exception as e:
        assert not isinstance(e, AssertionError), e
    ok("a killed sandbox's command stream ends with an error", t)


async def async_suite():
    t = time.time()
    sbx = await AsyncSandbox.create(template=TEMPLATE, timeout=300, metadata={"suite": "py-async", "run": RUN})
    ok(f"AsyncSandbox.create {sbx.sandbox_id}", t)
    try:
        t = time.time()
        seen = []
        r = await sbx.commands.run("echo a; sleep 0.3; echo b", on_stdout=lambda s: seen.append(s))
        assert r.stdout == "a\nb\n" and len(seen) >= 2, (r.stdout, seen)
        results = await asyncio.gather(*[sbx.commands.run(f"echo n{i}") for i in range(8)])
        assert [x.stdout for x in results] == [f"n{i}\n" for i in range(8)]
        try:
            await sbx.commands.run("exit 5")
            raise AssertionError("exit 5 did not raise")
        except CommandExitException as e:
            assert e.exit_code == 5
        ok("async commands.run: streamed, 8 at once, exit codes", t)

        t = time.time()
        await sbx.files.write("/tmp/x.txt", "async")
        assert await sbx.files.read("/tmp/x.txt") == "async"
        assert "x.txt" in [e.name for e in await sbx.files.list("/tmp")]
        h = await sbx.commands.run("sleep 100", background=True)
        assert h.pid in [p.pid for p in await sbx.commands.list()]
        assert await sbx.commands.kill(h.pid)
        info = await sbx.get_info()
        assert info.metadata["suite"] == "py-async"
        assert await sbx.is_running()
        ok("async files, background command, get_info, is_running", t)
    finally:
        assert await sbx.kill() is True
    assert await AsyncSandbox.kill(sbx.sandbox_id) is False
    ok("async kill (then False)", t)


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "sync"
    if mode == "sync":
        sync_suite()
    else:
        asyncio.run(async_suite())
    print(f"all {mode} steps passed in {time.time() - T0:.1f} s", flush=True)
    # Everything is checked: leave without the interpreter's teardown, in which the SDK's
    # native HTTP transport aborts (SIGABRT) now and then after asyncio.run closed its loop
    # (seen in 2 of 4 async runs here, in the code interpreter's scenario too).
    os._exit(0)
