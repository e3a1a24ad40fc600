"""The asyncio client: the same operations as the synchronous one, awaited."""

from __future__ import annotations

import asyncio
import json
import tempfile
from typing import Any, AsyncIterator, Callable, Dict, List, Mapping, Optional, Sequence

import httpx

from . import _code
from . import _common as c
from ._common import Command, DirEntry, Endpoint, ExecResult, Image, OutputCallback, OutputEvent
from .errors import BuildError, ForkboxError, NotFound

_TIMEOUT = httpx.Timeout(None, connect=10.0)


class AsyncRuntime:
    """An asyncio connection to a forkbox daemon; see ``forkbox.Runtime``."""

    def __init__(self, api: Optional[str] = None, token: Optional[str] = None) -> None:
        self.endpoint = Endpoint.resolve(api, token)
        transport = (
            httpx.AsyncHTTPTransport(uds=self.endpoint.socket) if self.endpoint.socket else None
        )
        self._http = httpx.AsyncClient(
            base_url=self.endpoint.base_url,
            transport=transport,
            headers=self.endpoint.headers(),
            timeout=_TIMEOUT,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
        )
        self._started = False  # the daemon was started by this runtime
        self._alive = False  # a request got through
        self.images = AsyncImages(self)
        self.sandboxes = AsyncSandboxes(self)
        self.snapshots = AsyncSnapshots(self)
        self.volumes = AsyncVolumes(self)

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncRuntime":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def info(self) -> Dict[str, Any]:
        return await self._call("GET", "/info")

    async def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            try:
                r = await self._http.request(method, path, **kw)
            except httpx.ConnectError as e:
                if self._started:
                    raise
                self._started = True
                await asyncio.to_thread(self.endpoint.start_daemon, e)
                r = await self._http.request(method, path, **kw)
        except httpx.ConnectError as e:
            raise self.endpoint.not_running(e) from None
        except httpx.RemoteProtocolError as e:
            raise ForkboxError(f"the daemon closed the connection: {e}") from None
        self._alive = True
        if r.status_code >= 400:
            raise c.error_of(r.status_code, r.content)
        return r

    async def _call(self, method: str, path: str, **kw: Any) -> Any:
        return (await self._send(method, path, **kw)).json()

    async def _lines(self, method: str, path: str, **kw: Any) -> AsyncIterator[str]:
        if not self._alive and self.endpoint.autostart:
            await self._send("GET", "/health")
        try:
            async with self._http.stream(method, path, **kw) as r:
                if r.status_code >= 400:
                    raise c.error_of(r.status_code, await r.aread())
                async for line in r.aiter_lines():
                    yield line
        except httpx.ConnectError as e:
            raise self.endpoint.not_running(e) from None


class AsyncImages:
    def __init__(self, rt: AsyncRuntime) -> None:
        self._rt = rt

    async def build(
        self,
        name: str,
        recipe: Optional[Mapping[str, Any]] = None,
        *,
        if_changed: bool = False,
        on_progress: Optional[Callable[[Dict[str, Any]], Any]] = None,
    ) -> Image:
        body = {"name": name, "recipe": dict(recipe or {}), "if_changed": if_changed}
        async for line in self._rt._lines("POST", "/images", json=body):
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

    async def list(self) -> List[Image]:
        return [Image.from_json(d) for d in await self._rt._call("GET", "/images")]

    async def get(self, reference: str) -> Image:
        return Image.from_json(await self._rt._call("GET", f"/images/{reference}"))

    async def remove(self, reference: str) -> Image:
        return Image.from_json(await self._rt._call("DELETE", f"/images/{reference}"))


class AsyncSandboxes:
    def __init__(self, rt: AsyncRuntime) -> None:
        self._rt = rt

    async def create(
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
    ) -> "AsyncSandbox":
        """See ``Sandboxes.create``: ``idle_seconds`` makes it sleep when unused and wake on
        use."""
        body = c.create_body(
            image, snapshot, ttl_seconds, persistent, network, labels, cpus, memory_mib, disk_gib,
            node, secrets, idle_seconds, wake_on_use, volumes,
        )
        return AsyncSandbox(self._rt, await self._rt._call("POST", "/sandboxes", json=body), persistent)

    async def get(self, sandbox_id: str) -> "AsyncSandbox":
        return AsyncSandbox(self._rt, await self._rt._call("GET", f"/sandboxes/{sandbox_id}"))

    async def list(
        self,
        label: Optional[str] = None,
        state: Optional[str] = None,
        node: Optional[str] = None,
    ) -> List["AsyncSandbox"]:
        params = {k: v for k, v in (("label", label), ("state", state), ("node", node)) if v}
        return [
            AsyncSandbox(self._rt, d)
            for d in await self._rt._call("GET", "/sandboxes", params=params)
        ]


class AsyncVolumes:
    """Volumes: disks of their own that outlive the sandboxes that mount them (``volumes=
    ["NAME:/path"]`` read-write, one sandbox at a time; ``"NAME:/path:ro"`` read-only, any
    number)."""

    def __init__(self, rt: "AsyncRuntime") -> None:
        self._rt = rt

    async def create(self, name: str, *, size: Optional[str] = None, node: Optional[str] = None) -> Dict[str, Any]:
        """Makes volume ``name`` of ``size`` (``"512m"``, ``"10g"``; 1 GiB by default), its
        space taken on the host at once."""
        return await self._rt._call("POST", "/volumes", json=c.volume_body(name, size, node))

    async def list(self) -> List[Dict[str, Any]]:
        """Every volume, with ``holders``: the sandboxes that have it mounted."""
        return await self._rt._call("GET", "/volumes")

    async def get(self, name: str) -> Dict[str, Any]:
        return await self._rt._call("GET", f"/volumes/{name}")

    async def remove(self, name: str) -> None:
        """Removes the volume and what is on it; refused (``Conflict``) while a sandbox has it
        mounted."""
        await self._rt._call("DELETE", f"/volumes/{name}")


class AsyncSnapshots:
    def __init__(self, rt: AsyncRuntime) -> None:
        self._rt = rt

    async def list(self) -> List["AsyncSnapshot"]:
        return [AsyncSnapshot(self._rt, d) for d in await self._rt._call("GET", "/snapshots")]

    async def get(self, name: str) -> "AsyncSnapshot":
        return AsyncSnapshot(self._rt, await self._rt._call("GET", f"/snapshots/{name}"))


class AsyncSnapshot:
    def __init__(self, rt: AsyncRuntime, meta: Dict[str, Any]) -> None:
        self._rt = rt
        self.meta = meta
        self.name: str = meta["name"]

    def __repr__(self) -> str:
        return f"AsyncSnapshot({self.name!r})"

    async def fork(
        self,
        *,
        ttl_seconds: Optional[int] = None,
        network: Optional[Mapping[str, Any]] = None,
        labels: Optional[Mapping[str, str]] = None,
        node: Optional[str] = None,
        secrets: Optional[Sequence[Mapping[str, Any]]] = None,
    ) -> "AsyncSandbox":
        return (
            await self.fork_many(1, ttl_seconds=ttl_seconds, network=network, labels=labels, node=node, secrets=secrets)
        )[0]

    async def fork_many(
        self,
        count: int,
        *,
        ttl_seconds: Optional[int] = None,
        network: Optional[Mapping[str, Any]] = None,
        labels: Optional[Mapping[str, str]] = None,
        node: Optional[str] = None,
        secrets: Optional[Sequence[Mapping[str, Any]]] = None,
    ) -> List["AsyncSandbox"]:
        body = c.fork_body(count, ttl_seconds, network, labels, node, secrets)
        reply = await self._rt._call("POST", f"/snapshots/{self.name}/fork", json=body)
        return await _forked(self._rt, reply)

    async def delete(self) -> None:
        await self._rt._call("DELETE", f"/snapshots/{self.name}")


async def _forked(rt: AsyncRuntime, reply: Dict[str, Any]) -> List["AsyncSandbox"]:
    made = [AsyncSandbox(rt, d) for d in reply["sandboxes"]]
    if reply.get("failed"):
        for s in made:
            await s.stop()
        raise ForkboxError("fork failed: " + "; ".join(reply["failed"]))
    return made


class AsyncSandbox:
    """A running sandbox; ``async with`` deletes it when the block ends unless persistent."""

    def __init__(self, rt: AsyncRuntime, view: Dict[str, Any], persistent: bool = False) -> None:
        self._rt = rt
        self._own_runtime = False
        self.info = view
        self.id: str = view["id"]
        self.persistent = persistent or view.get("ttl_action") == "hibernate"
        self.files = AsyncFiles(self)
        self.ports = AsyncPorts(self)

    @classmethod
    async def create(
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
    ) -> "AsyncSandbox":
        rt = AsyncRuntime(api, token)
        try:
            sbx = await rt.sandboxes.create(
                template,
                ttl_seconds=ttl_seconds,
                persistent=persistent,
                network=network,
                labels=labels,
                idle_seconds=idle_seconds,
            )
        except BaseException:
            await rt.close()
            raise
        sbx._own_runtime = True
        return sbx

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.id!r})"

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if not self.persistent:
            await self.stop()
        elif self._own_runtime:
            await self._rt.close()

    async def refresh(self) -> "AsyncSandbox":
        self.info = await self._rt._call("GET", f"/sandboxes/{self.id}")
        return self

    async def exec(
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
        body = c.exec_body(cmd, cwd, env, timeout_seconds, timeout_ms)
        if on_stdout is None and on_stderr is None:
            reply = await self._rt._call("POST", f"/sandboxes/{self.id}/exec", json=body)
            return c.checked(ExecResult.from_json(reply), body.get("timeout_ms"))
        col = c.StreamCollector(on_stdout, on_stderr)
        async for line in self._rt._lines(
            "POST", f"/sandboxes/{self.id}/exec", params={"stream": "true"}, json=body
        ):
            col.feed(line)
        return c.checked(col.finish(), body.get("timeout_ms"))

    async def exec_stream(
        self,
        cmd: Command,
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        timeout_seconds: Optional[float] = None,
        timeout_ms: Optional[int] = None,
    ) -> AsyncIterator[OutputEvent]:
        """Output events as they happen; raises ``ExecTimeout`` at the end if it timed out."""
        body = c.exec_body(cmd, cwd, env, timeout_seconds, timeout_ms)
        col = c.StreamCollector()
        async for line in self._rt._lines(
            "POST", f"/sandboxes/{self.id}/exec", params={"stream": "true"}, json=body
        ):
            ev = col.feed(line)
            if ev is not None:
                yield ev
        c.checked(col.finish(), body.get("timeout_ms"))

    async def start(
        self,
        cmd: Command,
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        timeout_seconds: Optional[float] = None,
        timeout_ms: Optional[int] = None,
    ) -> "AsyncDetachedCommand":
        body = c.exec_body(cmd, cwd, env, timeout_seconds, timeout_ms)
        reply = await self._rt._call("POST", f"/sandboxes/{self.id}/commands", json=body)
        return AsyncDetachedCommand(self, reply["command_id"], body.get("timeout_ms"))

    async def run_code(
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
        async for line in self._rt._lines("POST", f"/sandboxes/{self.id}/code", json=body):
            col.feed(line)
        return col.finish()

    async def create_code_context(
        self, *, language: Optional[str] = None, cwd: Optional[str] = None
    ) -> _code.CodeContext:
        """A new context for :meth:`run_code`: its own state, language and working directory."""
        body = {k: v for k, v in (("language", language), ("cwd", cwd)) if v is not None}
        return _code.CodeContext.from_json(
            await self._rt._call("POST", f"/sandboxes/{self.id}/code/contexts", json=body)
        )

    async def list_code_contexts(self) -> List[_code.CodeContext]:
        return [
            _code.CodeContext.from_json(d)
            for d in await self._rt._call("GET", f"/sandboxes/{self.id}/code/contexts")
        ]

    async def restart_code_context(self, context: _code.ContextRef) -> _code.CodeContext:
        """Starts a context again, its state gone."""
        cid = _code.context_id(context)
        return _code.CodeContext.from_json(
            await self._rt._call("POST", f"/sandboxes/{self.id}/code/contexts/{cid}/restart")
        )

    async def remove_code_context(self, context: _code.ContextRef) -> None:
        cid = _code.context_id(context)
        await self._rt._call("DELETE", f"/sandboxes/{self.id}/code/contexts/{cid}")

    async def snapshot(self, name: Optional[str] = None, *, stay_paused: bool = False) -> AsyncSnapshot:
        body: Dict[str, Any] = {"stay_paused": stay_paused}
        if name:
            body["name"] = name
        reply = await self._rt._call("POST", f"/sandboxes/{self.id}/snapshot", json=body)
        return AsyncSnapshot(self._rt, reply)

    async def fork(
        self,
        count: int = 1,
        *,
        ttl_seconds: Optional[int] = None,
        network: Optional[Mapping[str, Any]] = None,
        labels: Optional[Mapping[str, str]] = None,
        node: Optional[str] = None,
        secrets: Optional[Sequence[Mapping[str, Any]]] = None,
        volumes: Optional[Sequence[Any]] = None,
    ) -> List["AsyncSandbox"]:
        body = c.fork_body(count, ttl_seconds, network, labels, node, secrets, volumes)
        reply = await self._rt._call("POST", f"/sandboxes/{self.id}/fork", json=body)
        return await _forked(self._rt, reply)

    async def hibernate(self, *, memory: bool = True) -> "AsyncSandbox":
        params = None if memory else {"memory": "false"}
        self.info = await self._rt._call(
            "POST", f"/sandboxes/{self.id}/hibernate", params=params
        )
        return self

    async def resume(self) -> "AsyncSandbox":
        self.info = await self._rt._call("POST", f"/sandboxes/{self.id}/resume")
        return self

    async def set_idle(
        self, idle_seconds: Optional[int], *, wake_on_use: Optional[bool] = None
    ) -> "AsyncSandbox":
        """Sleep after ``idle_seconds`` unused (None: never), woken by the next use unless
        ``wake_on_use`` is False."""
        body: Dict[str, Any] = {"idle": None}
        body.update(c.idle_body(idle_seconds, wake_on_use))
        self.info = await self._rt._call("PUT", f"/sandboxes/{self.id}/idle", json=body)
        return self

    async def set_ttl(self, ttl_seconds: int) -> "AsyncSandbox":
        self.info = await self._rt._call(
            "POST", f"/sandboxes/{self.id}/ttl", json={"ttl_seconds": ttl_seconds}
        )
        return self

    async def stop(self) -> None:
        try:
            await self._rt._call("DELETE", f"/sandboxes/{self.id}")
        except NotFound:
            pass
        finally:
            if self._own_runtime:
                await self._rt.close()

    kill = stop


class AsyncDetachedCommand:
    def __init__(self, sandbox: AsyncSandbox, command_id: str, timeout_ms: Optional[int]) -> None:
        self.sandbox = sandbox
        self.id = command_id
        self._timeout_ms = timeout_ms

    def _path(self) -> str:
        return f"/sandboxes/{self.sandbox.id}/commands/{self.id}"

    async def wait(
        self,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
    ) -> ExecResult:
        col = c.StreamCollector(on_stdout, on_stderr)
        async for line in self.sandbox._rt._lines("GET", self._path() + "/events"):
            col.feed(line)
        return c.checked(col.finish(), self._timeout_ms)

    async def poll(self) -> Optional[ExecResult]:
        reply = await self.sandbox._rt._call("GET", self._path())
        return None if reply.get("exit") is None else await self.wait()

    async def kill(self, signal: int = 15) -> None:
        await self.sandbox._rt._send("POST", self._path() + "/signal", json={"signal": signal})


class AsyncPorts:
    """Ports of a sandbox reached from this host (see ``Ports``)."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sbx = sandbox

    async def forward(self, guest_port: int, *, host_port: Optional[int] = None, address: Optional[str] = None) -> str:
        return (await self.open(guest_port, host_port=host_port, address=address))["url"]

    async def open(self, guest_port: int, *, host_port: Optional[int] = None, address: Optional[str] = None) -> Dict[str, Any]:
        body = c.port_body(guest_port, host_port, address)
        return await self._sbx._rt._call("POST", f"/sandboxes/{self._sbx.id}/ports", json=body)

    async def list(self) -> List[Dict[str, Any]]:
        return await self._sbx._rt._call("GET", f"/sandboxes/{self._sbx.id}/ports")

    async def close(self, host_port: int) -> None:
        await self._sbx._rt._call("DELETE", f"/sandboxes/{self._sbx.id}/ports/{int(host_port)}")


class AsyncFiles:
    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sbx = sandbox

    def _url(self, what: str) -> str:
        return f"/sandboxes/{self._sbx.id}/{what}"

    async def read_bytes(self, path: str) -> bytes:
        return (await self._sbx._rt._send("GET", self._url("files"), params={"path": path})).content

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return (await self.read_bytes(path)).decode(encoding)

    async def write_bytes(self, path: str, data: bytes, mode: int = 0o644) -> int:
        reply = await self._sbx._rt._call(
            "PUT", self._url("files"), params={"path": path, "mode": f"{mode:o}"}, content=data
        )
        return int(reply["bytes"])

    async def write_text(
        self, path: str, text: str, mode: int = 0o644, encoding: str = "utf-8"
    ) -> int:
        return await self.write_bytes(path, text.encode(encoding), mode)

    async def list(self, path: str) -> List[DirEntry]:
        reply = await self._sbx._rt._call("GET", self._url("dir"), params={"path": path})
        return [DirEntry(**e) for e in reply["entries"]]

    async def upload(self, local_dir: str, guest_dir: str) -> int:
        with tempfile.TemporaryFile() as spool:
            c.pack_dir(local_dir, spool)
            spool.seek(0)
            data = spool.read()
        reply = await self._sbx._rt._call(
            "PUT",
            self._url("archive"),
            params={"path": guest_dir, "format": "tar.gz"},
            content=data,
        )
        return int(reply["bytes"])

    async def download(self, guest_path: str, local_dir: str) -> int:
        with tempfile.TemporaryFile() as spool:
            try:
                async with self._sbx._rt._http.stream(
                    "GET", self._url("archive"), params={"path": guest_path, "format": "tar.gz"}
                ) as r:
                    if r.status_code >= 400:
                        raise c.error_of(r.status_code, await r.aread())
                    async for chunk in r.aiter_bytes():
                        spool.write(chunk)
            except httpx.ConnectError as e:
                raise self._sbx._rt.endpoint.not_running(e) from None
            except httpx.HTTPError as e:
                raise ForkboxError(f"the download of {guest_path} broke off: {e}") from None
            spool.seek(0)
            return c.unpack_into(spool, local_dir)
