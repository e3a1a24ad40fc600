"""The synchronous client."""

from __future__ import annotations

import json
import tempfile
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence

import httpx

from . import _code
from . import _common as c
from ._common import Command, DirEntry, Endpoint, ExecResult, Image, OutputCallback, OutputEvent
from .errors import BuildError, ForkboxError, NotFound

_TIMEOUT = httpx.Timeout(None, connect=10.0)


class Runtime:
    """A connection to a forkbox daemon (this host's, or ``api`` / ``$FORKBOX_API``).

    ``runtime.images``, ``runtime.sandboxes`` and ``runtime.snapshots`` hold the operations;
    use it as a context manager, or call ``close()``."""

    def __init__(self, api: Optional[str] = None, token: Optional[str] = None) -> None:
        self.endpoint = Endpoint.resolve(api, token)
        transport = httpx.HTTPTransport(uds=self.endpoint.socket) if self.endpoint.socket else None
        self._http = httpx.Client(
            base_url=self.endpoint.base_url,
            transport=transport,
            headers=self.endpoint.headers(),
            timeout=_TIMEOUT,
        )
        self._started = False  # the daemon was started by this runtime
        self._alive = False  # a request got through
        self.images = Images(self)
        self.sandboxes = Sandboxes(self)
        self.snapshots = Snapshots(self)
        self.volumes = Volumes(self)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def info(self) -> Dict[str, Any]:
        """The daemon: version, home, the accelerator sandboxes get (kvm or tcg) and why."""
        return self._call("GET", "/info")

    # -- plumbing --------------------------------------------------------------------------

    def _connect_failed(self, e: httpx.ConnectError) -> None:
        """Starts this host's daemon once, or raises ``DaemonNotRunning``."""
        if self._started:
            raise self.endpoint.not_running(e) from None
        self._started = True
        self.endpoint.start_daemon(e)

    def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            try:
                r = self._http.request(method, path, **kw)
            except httpx.ConnectError as e:
                self._connect_failed(e)
                r = self._http.request(method, path, **kw)
        except httpx.ConnectError as e:
            raise self.endpoint.not_running(e) from None
        except httpx.RemoteProtocolError as e:
            raise ForkboxError(f"the daemon closed the connection: {e}") from None
        self._alive = True
        if r.status_code >= 400:
            raise c.error_of(r.status_code, r.content)
        return r

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        return self._send(method, path, **kw).json()

    def _lines(self, method: str, path: str, **kw: Any) -> Iterator[str]:
        if not self._alive and self.endpoint.autostart:
            self._send("GET", "/health")
        try:
            with self._http.stream(method, path, **kw) as r:
                if r.status_code >= 400:
                    raise c.error_of(r.status_code, r.read())
                yield from r.iter_lines()
        except httpx.ConnectError as e:
            raise self.endpoint.not_running(e) from None


class Images:
    def __init__(self, rt: Runtime) -> None:
        self._rt = rt

    def build(
        self,
        name: str,
        recipe: Optional[Mapping[str, Any]] = None,
        *,
        if_changed: bool = False,
        on_progress: Optional[Callable[[Dict[str, Any]], Any]] = None,
    ) -> Image:
        """Builds the next version of ``name`` from ``recipe`` (``{"base": "bookworm",
        "image@N" or a registry's "python:3.8-slim", "apt": [...], "pip": [...], "npm": [...],
        "run": [...], "env": {...}}``);
        ``on_progress`` gets each step and log line. ``if_changed`` reuses the newest version
        when it came from the same recipe."""
        body = {"name": name, "recipe": dict(recipe or {}), "if_changed": if_changed}
        for line in self._rt._lines("POST", "/images", json=body):
            if not line.strip():
                continue
            ev = json.loads(line)
            if ev["type"] in ("done", "up_to_date"):
                return Image.from_json(ev["image"])
            if ev["type"] == "error":
                raise BuildError(ev["message"], ev.get("status"), ev.get("code"))
            if on_progress is not None:
                on_progress(ev)
        raise BuildError(f"the build of {name} ended without a result")

    def list(self) -> List[Image]:
        return [Image.from_json(d) for d in self._rt._call("GET", "/images")]

    def get(self, reference: str) -> Image:
        return Image.from_json(self._rt._call("GET", f"/images/{reference}"))

    def remove(self, reference: str) -> Image:
        return Image.from_json(self._rt._call("DELETE", f"/images/{reference}"))


class Sandboxes:
    def __init__(self, rt: Runtime) -> None:
        self._rt = rt

    def create(
        self,
        image: Optional[str] = None,
        *,
        snapshot: Optional[str] = None,
        ttl_seconds: Optional[int] = None,
        persistent: bool = False,
        network: Optional[Mapping[str, Any]] = None,
        labels: Optional[Mapping[str, str]] = None,
        cpus: Optional[int] = None,
        memory_mib: Optional[int] = None,
        disk_gib: Optional[int] = None,
        node: Optional[str] = None,
        secrets: Optional[Sequence[Mapping[str, Any]]] = None,
        idle_seconds: Optional[int] = None,
        wake_on_use: Optional[bool] = None,
        volumes: Optional[Sequence[Any]] = None,
    ) -> "Sandbox":
        """A new running sandbox of ``image`` (NAME or NAME@N; the default image when None), or
        of ``snapshot``. In a cluster, ``node`` pins it to that node. No network unless ``network={"internet": True}`` or
        ``{"allow": ["pypi.org"]}``. ``persistent``: kept (hibernated) when its TTL passes and
        not deleted when a ``with`` block ends. ``secrets``: ``[{"name", "hosts", "value"}]``;
        the guest sees a placeholder in ``$NAME`` and HTTPS requests to ``hosts`` carry the value
        (which never enters the sandbox). ``idle_seconds``: the sandbox sleeps after that long
        unused (no command running, no stream or port connection open, no call) and the next
        call that needs it wakes it (``wake_on_use=False``: only ``resume()`` does)."""
        body = c.create_body(
            image, snapshot, ttl_seconds, persistent, network, labels, cpus, memory_mib, disk_gib,
            node, secrets, idle_seconds, wake_on_use, volumes,
        )
        return Sandbox(self._rt, self._rt._call("POST", "/sandboxes", json=body), persistent)

    def get(self, sandbox_id: str) -> "Sandbox":
        return Sandbox(self._rt, self._rt._call("GET", f"/sandboxes/{sandbox_id}"))

    def list(
        self,
        label: Optional[str] = None,
        state: Optional[str] = None,
        node: Optional[str] = None,
    ) -> List["Sandbox"]:
        """All sandboxes, or those with ``label`` (``"k=v"``), in ``state``, and (in a cluster)
        on ``node``."""
        params = {k: v for k, v in (("label", label), ("state", state), ("node", node)) if v}
        return [Sandbox(self._rt, d) for d in self._rt._call("GET", "/sandboxes", params=params)]


class Volumes:
    """Volumes: disks of their own that outlive the sandboxes that mount them (``volumes=
    ["NAME:/path"]`` read-write, one sandbox at a time; ``"NAME:/path:ro"`` read-only, any
    number)."""

    def __init__(self, rt: "Runtime") -> None:
        self._rt = rt

    def create(self, name: str, *, size: Optional[str] = None, node: Optional[str] = None) -> Dict[str, Any]:
        """Makes volume ``name`` of ``size`` (``"512m"``, ``"10g"``; 1 GiB by default), its
        space taken on the host at once."""
        return self._rt._call("POST", "/volumes", json=c.volume_body(name, size, node))

    def list(self) -> List[Dict[str, Any]]:
        """Every volume, with ``holders``: the sandboxes that have it mounted."""
        return self._rt._call("GET", "/volumes")

    def get(self, name: str) -> Dict[str, Any]:
        return self._rt._call("GET", f"/volumes/{name}")

    def remove(self, name: str) -> None:
        """Removes the volume and what is on it; refused (``Conflict``) while a sandbox has it
        mounted."""
        self._rt._call("DELETE", f"/volumes/{name}")


class Snapshots:
    def __init__(self, rt: Runtime) -> None:
        self._rt = rt

    def list(self) -> List["Snapshot"]:
        return [Snapshot(self._rt, d) for d in self._rt._call("GET", "/snapshots")]

    def get(self, name: str) -> "Snapshot":
        return Snapshot(self._rt, self._rt._call("GET", f"/snapshots/{name}"))


class Snapshot:
    """A saved sandbox (files, memory, processes); fork it into new sandboxes."""

    def __init__(self, rt: Runtime, meta: Dict[str, Any]) -> None:
        self._rt = rt
        self.meta = meta
        self.name: str = meta["name"]

    def __repr__(self) -> str:
        return f"Snapshot({self.name!r})"

    def fork(
        self,
        *,
        ttl_seconds: Optional[int] = None,
        network: Optional[Mapping[str, Any]] = None,
        labels: Optional[Mapping[str, str]] = None,
        node: Optional[str] = None,
        secrets: Optional[Sequence[Mapping[str, Any]]] = None,
    ) -> "Sandbox":
        """One new running sandbox from this snapshot; ``with snapshot.fork() as sbx:`` deletes
        it when the block ends and leaves the snapshot as it was. ``node``: in a cluster, the
        node it runs on (one without the snapshot brings it first; ``info["transfer"]`` says
        what moved)."""
        return self.fork_many(1, ttl_seconds=ttl_seconds, network=network, labels=labels, node=node, secrets=secrets)[0]

    def fork_many(
        self,
        count: int,
        *,
        ttl_seconds: Optional[int] = None,
        network: Optional[Mapping[str, Any]] = None,
        labels: Optional[Mapping[str, str]] = None,
        node: Optional[str] = None,
        secrets: Optional[Sequence[Mapping[str, Any]]] = None,
    ) -> List["Sandbox"]:
        body = c.fork_body(count, ttl_seconds, network, labels, node, secrets)
        return _forked(self._rt, self._rt._call("POST", f"/snapshots/{self.name}/fork", json=body))

    def delete(self) -> None:
        """Deletes the snapshot; refused while a sandbox made from it still runs."""
        self._rt._call("DELETE", f"/snapshots/{self.name}")


def _forked(rt: Runtime, reply: Dict[str, Any]) -> List["Sandbox"]:
    made = [Sandbox(rt, d) for d in reply["sandboxes"]]
    if reply.get("failed"):
        for s in made:
            s.stop()
        raise ForkboxError("fork failed: " + "; ".join(reply["failed"]))
    return made


class Sandbox:
    """A running sandbox. ``with`` deletes it when the block ends (even on an exception),
    unless it was created ``persistent``."""

    def __init__(self, rt: Runtime, view: Dict[str, Any], persistent: bool = False) -> None:
        self._rt = rt
        self._own_runtime = False
        self.info = view
        self.id: str = view["id"]
        self.persistent = persistent or view.get("ttl_action") == "hibernate"
        self.files = Files(self)
        self.ports = Ports(self)

    @classmethod
    def create(
        cls,
        template: Optional[str] = None,
        *,
        ttl_seconds: Optional[int] = None,
        persistent: bool = False,
        network: Optional[Mapping[str, Any]] = None,
        labels: Optional[Mapping[str, str]] = None,
        api: Optional[str] = None,
        token: Optional[str] = None,
        idle_seconds: Optional[int] = None,
    ) -> "Sandbox":
        """A sandbox of image ``template`` (NAME or NAME@N; the default image when None), on
        a connection of its own that closes with it."""
        rt = Runtime(api, token)
        try:
            sbx = rt.sandboxes.create(
                template,
                ttl_seconds=ttl_seconds,
                persistent=persistent,
                network=network,
                labels=labels,
                idle_seconds=idle_seconds,
            )
        except BaseException:
            rt.close()
            raise
        sbx._own_runtime = True
        return sbx

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r})"

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.persistent:
            self.stop()
        elif self._own_runtime:
            self._rt.close()

    @property
    def state(self) -> str:
        return self.refresh().info["state"]

    def refresh(self) -> "Sandbox":
        self.info = self._rt._call("GET", f"/sandboxes/{self.id}")
        return self

    def exec(
        self,
        cmd: Command,
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        timeout_seconds: Optional[float] = None,
        timeout_ms: Optional[int] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
    ) -> ExecResult:
        """Runs ``cmd`` (a shell string, or an argv list) and waits for it. With ``on_stdout``
        / ``on_stderr`` the output arrives as it is printed and the result keeps all of it;
        without, the result keeps 64 KiB per stream. Raises ``ExecTimeout`` past the timeout
        (at most 24 h)."""
        body = c.exec_body(cmd, cwd, env, timeout_seconds, timeout_ms)
        if on_stdout is None and on_stderr is None:
            reply = self._rt._call("POST", f"/sandboxes/{self.id}/exec", json=body)
            return c.checked(ExecResult.from_json(reply), body.get("timeout_ms"))
        col = c.StreamCollector(on_stdout, on_stderr)
        for line in self._rt._lines(
            "POST", f"/sandboxes/{self.id}/exec", params={"stream": "true"}, json=body
        ):
            col.feed(line)
        return c.checked(col.finish(), body.get("timeout_ms"))

    def exec_stream(
        self,
        cmd: Command,
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        timeout_seconds: Optional[float] = None,
        timeout_ms: Optional[int] = None,
    ) -> "ExecStream":
        """Runs ``cmd``; iterate the result for its output events as they happen, then read
        ``.result``."""
        body = c.exec_body(cmd, cwd, env, timeout_seconds, timeout_ms)
        lines = self._rt._lines(
            "POST", f"/sandboxes/{self.id}/exec", params={"stream": "true"}, json=body
        )
        return ExecStream(lines, body.get("timeout_ms"))

    def start(
        self,
        cmd: Command,
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        timeout_seconds: Optional[float] = None,
        timeout_ms: Optional[int] = None,
    ) -> "DetachedCommand":
        """Starts ``cmd`` in the background and returns at once; ``wait()`` for it later."""
        body = c.exec_body(cmd, cwd, env, timeout_seconds, timeout_ms)
        reply = self._rt._call("POST", f"/sandboxes/{self.id}/commands", json=body)
        return DetachedCommand(self, reply["command_id"], body.get("timeout_ms"))

    def run_code(
        self,
        code: str,
        *,
        language: Optional[str] = None,
        context: Optional[_code.ContextRef] = None,
        env: Optional[Mapping[str, str]] = None,
        timeout_seconds: Optional[float] = None,
        on_stdout: Optional[_code.TextCallback] = None,
        on_stderr: Optional[_code.TextCallback] = None,
        on_result: Optional[Callable[[_code.CodeResult], Any]] = None,
    ) -> _code.Execution:
        """Runs a code cell, keeping state between cells as a notebook does: ``language``
        ``"python"`` (the default; a Jupyter kernel), ``"javascript"`` or ``"bash"``, each with a
        default context, or a ``context`` of :meth:`create_code_context`. Output and results
        arrive through the callbacks as they come; an exception in the cell is the
        execution's ``error``, not raised. The first cell starts the sandbox's code server
        (its image needs ipykernel: ``code-interpreter`` has it, with numpy, pandas and
        matplotlib). At most 300 s a cell."""
        col = _code.CellCollector(on_stdout, on_stderr, on_result)
        body = _code.body(code, language, context, env, timeout_seconds)
        for line in self._rt._lines("POST", f"/sandboxes/{self.id}/code", json=body):
            col.feed(line)
        return col.finish()

    def create_code_context(
        self, *, language: Optional[str] = None, cwd: Optional[str] = None
    ) -> _code.CodeContext:
        """A new context for :meth:`run_code`: its own state, language and working directory."""
        body = {k: v for k, v in (("language", language), ("cwd", cwd)) if v is not None}
        return _code.CodeContext.from_json(
            self._rt._call("POST", f"/sandboxes/{self.id}/code/contexts", json=body)
        )

    def list_code_contexts(self) -> List[_code.CodeContext]:
        return [
            _code.CodeContext.from_json(d)
            for d in self._rt._call("GET", f"/sandboxes/{self.id}/code/contexts")
        ]

    def restart_code_context(self, context: _code.ContextRef) -> _code.CodeContext:
        """Starts a context again, its state gone."""
        cid = _code.context_id(context)
        return _code.CodeContext.from_json(
            self._rt._call("POST", f"/sandboxes/{self.id}/code/contexts/{cid}/restart")
        )

    def remove_code_context(self, context: _code.ContextRef) -> None:
        cid = _code.context_id(context)
        self._rt._call("DELETE", f"/sandboxes/{self.id}/code/contexts/{cid}")

    def snapshot(self, name: Optional[str] = None, *, stay_paused: bool = False) -> Snapshot:
        """Saves the sandbox (files, memory, processes); it keeps running."""
        body: Dict[str, Any] = {"stay_paused": stay_paused}
        if name:
            body["name"] = name
        return Snapshot(self._rt, self._rt._call("POST", f"/sandboxes/{self.id}/snapshot", json=body))

    def fork(
        self,
        count: int = 1,
        *,
        ttl_seconds: Optional[int] = None,
        network: Optional[Mapping[str, Any]] = None,
        labels: Optional[Mapping[str, str]] = None,
        node: Optional[str] = None,
        secrets: Optional[Sequence[Mapping[str, Any]]] = None,
        volumes: Optional[Sequence[Any]] = None,
    ) -> List["Sandbox"]:
        """``count`` (1-20) running copies of this sandbox as it is now; it keeps running.
        ``node``: in a cluster, the node the copies run on (saved here, brought there by chunks)."""
        body = c.fork_body(count, ttl_seconds, network, labels, node, secrets, volumes)
        return _forked(self._rt, self._rt._call("POST", f"/sandboxes/{self.id}/fork", json=body))

    def hibernate(self, *, memory: bool = True) -> "Sandbox":
        """Saves the sandbox to disk and stops its VM; ``resume()`` brings it back. With
        ``memory=False`` only its files are kept: the resume boots it from its disk, with its
        id and machine id but none of its processes."""
        params = None if memory else {"memory": "false"}
        self.info = self._rt._call("POST", f"/sandboxes/{self.id}/hibernate", params=params)
        return self

    def resume(self) -> "Sandbox":
        self.info = self._rt._call("POST", f"/sandboxes/{self.id}/resume")
        return self

    def set_idle(
        self, idle_seconds: Optional[int], *, wake_on_use: Optional[bool] = None
    ) -> "Sandbox":
        """Sleep after ``idle_seconds`` unused (None: never), woken by the next use unless
        ``wake_on_use`` is False."""
        body: Dict[str, Any] = {"idle": None}
        body.update(c.idle_body(idle_seconds, wake_on_use))
        self.info = self._rt._call("PUT", f"/sandboxes/{self.id}/idle", json=body)
        return self

    def set_ttl(self, ttl_seconds: int) -> "Sandbox":
        """Deletes (or, if persistent, hibernates) the sandbox ``ttl_seconds`` from now."""
        self.info = self._rt._call(
            "POST", f"/sandboxes/{self.id}/ttl", json={"ttl_seconds": ttl_seconds}
        )
        return self

    def stop(self) -> None:
        """Deletes the sandbox and its VM; a sandbox already gone is no error."""
        try:
            self._rt._call("DELETE", f"/sandboxes/{self.id}")
        except NotFound:
            pass
        finally:
            if self._own_runtime:
                self._rt.close()

    kill = stop


class ExecStream:
    """Output events of a running command; ``.result`` once iterated to the end."""

    def __init__(self, lines: Iterator[str], timeout_ms: Optional[int]) -> None:
        self._lines = lines
        self._col = c.StreamCollector(keep=True)
        self._timeout_ms = timeout_ms

    def __iter__(self) -> Iterator[OutputEvent]:
        for line in self._lines:
            ev = self._col.feed(line)
            if ev is not None:
                yield ev

    @property
    def result(self) -> ExecResult:
        for _ in self:
            pass
        return c.checked(self._col.finish(), self._timeout_ms)


class DetachedCommand:
    """A command started with ``Sandbox.start``."""

    def __init__(self, sandbox: Sandbox, command_id: str, timeout_ms: Optional[int]) -> None:
        self.sandbox = sandbox
        self.id = command_id
        self._timeout_ms = timeout_ms

    def __repr__(self) -> str:
        return f"DetachedCommand({self.sandbox.id!r}, {self.id!r})"

    def _path(self) -> str:
        return f"/sandboxes/{self.sandbox.id}/commands/{self.id}"

    def wait(
        self,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
    ) -> ExecResult:
        """Waits for the command to end; its output from the start (as much as is kept)."""
        col = c.StreamCollector(on_stdout, on_stderr)
        for line in self.sandbox._rt._lines("GET", self._path() + "/events"):
            col.feed(line)
        return c.checked(col.finish(), self._timeout_ms)

    def poll(self) -> Optional[ExecResult]:
        """The result if the command has ended, else None."""
        reply = self.sandbox._rt._call("GET", self._path())
        return None if reply.get("exit") is None else self.wait()

    def kill(self, signal: int = 15) -> None:
        self.sandbox._rt._send("POST", self._path() + "/signal", json={"signal": signal})


class Ports:
    """Ports of a sandbox reached from this host: ``sbx.ports.forward(3000)`` is a URL whose
    connections reach the guest's 127.0.0.1:3000 (HTTP, WebSocket or plain TCP), until closed
    or the sandbox goes."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sbx = sandbox

    def forward(self, guest_port: int, *, host_port: Optional[int] = None, address: Optional[str] = None) -> str:
        """Starts a forward; returns its URL (``http://127.0.0.1:HOST_PORT/``)."""
        return self.open(guest_port, host_port=host_port, address=address)["url"]

    def open(self, guest_port: int, *, host_port: Optional[int] = None, address: Optional[str] = None) -> Dict[str, Any]:
        """Starts a forward; returns it whole (``guest_port``, ``host_port``, ``address``, ``url``)."""
        body = c.port_body(guest_port, host_port, address)
        return self._sbx._rt._call("POST", f"/sandboxes/{self._sbx.id}/ports", json=body)

    def list(self) -> List[Dict[str, Any]]:
        return self._sbx._rt._call("GET", f"/sandboxes/{self._sbx.id}/ports")

    def close(self, host_port: int) -> None:
        self._sbx._rt._call("DELETE", f"/sandboxes/{self._sbx.id}/ports/{int(host_port)}")


class Files:
    """Files of a sandbox. Relative guest paths are taken from ``/root``."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sbx = sandbox

    def _url(self, what: str) -> str:
        return f"/sandboxes/{self._sbx.id}/{what}"

    def read_bytes(self, path: str) -> bytes:
        return self._sbx._rt._send("GET", self._url("files"), params={"path": path}).content

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return self.read_bytes(path).decode(encoding)

    def write_bytes(self, path: str, data: bytes, mode: int = 0o644) -> int:
        reply = self._sbx._rt._call(
            "PUT", self._url("files"), params={"path": path, "mode": f"{mode:o}"}, content=data
        )
        return int(reply["bytes"])

    def write_text(self, path: str, text: str, mode: int = 0o644, encoding: str = "utf-8") -> int:
        return self.write_bytes(path, text.encode(encoding), mode)

    def list(self, path: str) -> List[DirEntry]:
        reply = self._sbx._rt._call("GET", self._url("dir"), params={"path": path})
        return [DirEntry(**e) for e in reply["entries"]]

    def upload(self, local_dir: str, guest_dir: str) -> int:
        """Copies the host directory ``local_dir`` into ``guest_dir`` (made if missing) as
        one compressed archive; the bytes sent."""
        with tempfile.TemporaryFile() as spool:
            c.pack_dir(local_dir, spool)
            spool.seek(0)
            reply = self._sbx._rt._call(
                "PUT",
                self._url("archive"),
                params={"path": guest_dir, "format": "tar.gz"},
                content=_chunks(spool),
            )
        return int(reply["bytes"])

    def download(self, guest_path: str, local_dir: str) -> int:
        """Copies ``guest_path`` (a file or directory) into the new host directory
        ``local_dir``; the files written. Links and special files are refused."""
        with tempfile.TemporaryFile() as spool:
            try:
                with self._sbx._rt._http.stream(
                    "GET", self._url("archive"), params={"path": guest_path, "format": "tar.gz"}
                ) as r:
                    if r.status_code >= 400:
                        raise c.error_of(r.status_code, r.read())
                    for chunk in r.iter_bytes():
                        spool.write(chunk)
            except httpx.ConnectError as e:
                raise self._sbx._rt.endpoint.not_running(e) from None
            except httpx.HTTPError as e:
                raise ForkboxError(f"the download of {guest_path} broke off: {e}") from None
            spool.seek(0)
            return c.unpack_into(spool, local_dir)


def _chunks(f: Any, size: int = 1 << 20) -> Iterator[bytes]:
    while True:
        b = f.read(size)
        if not b:
            return
        yield b
