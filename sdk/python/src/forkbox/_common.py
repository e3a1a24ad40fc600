"""What the sync and async clients share: where the daemon is, the typed results, and how
requests are written and answers read. No I/O here."""

from __future__ import annotations

import base64
import codecs
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from .errors import ExecTimeout, ForkboxError, from_answer

Command = Union[str, Sequence[str]]
"""A shell string (run with ``/bin/sh -c``) or an argv list (run directly)."""

OutputCallback = Callable[[str], Any]


def default_socket() -> str:
    """The daemon's socket: ``$FORKBOX_HOME/forkbox.sock``, the home defaulting as the CLI's."""
    home = os.environ.get("FORKBOX_HOME")
    if not home:
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            home = "/var/lib/forkbox"
        else:
            home = os.path.join(os.path.expanduser("~"), ".local/share/forkbox")
    return os.path.join(home, "forkbox.sock")


@dataclass(frozen=True)
class Endpoint:
    """Where the API is: a Unix socket, or an HTTP base URL with a bearer token."""

    socket: Optional[str]
    base_url: str
    token: Optional[str]
    # This host's own daemon (no address given): started with `forkbox serve --detach` when
    # it does not answer, as the CLI's sandbox commands do.
    autostart: bool = False

    @staticmethod
    def resolve(api: Optional[str] = None, token: Optional[str] = None) -> "Endpoint":
        """``api``: ``unix:/path``, ``/path`` or ``http(s)://host:port``; else ``$FORKBOX_API``;
        else this host's daemon socket. ``token`` defaults to ``$FORKBOX_TOKEN``."""
        api = api or os.environ.get("FORKBOX_API") or ""
        token = token or os.environ.get("FORKBOX_TOKEN") or None
        if api.startswith(("http://", "https://")):
            return Endpoint(None, api.rstrip("/") + "/v1", token)
        if api.startswith("unix:"):
            api = api[len("unix:"):]
        if api and not api.startswith("/"):
            raise ForkboxError(
                f"FORKBOX_API={api!r}: give unix:/path/to/socket or http://host:port"
            )
        return Endpoint(api or default_socket(), "http://forkbox/v1", token, autostart=not api)

    def start_daemon(self, cause: BaseException) -> None:
        """Starts this host's daemon with the CLI; raises ``DaemonNotRunning`` if it cannot."""
        import shutil
        import subprocess

        exe = shutil.which("forkbox")
        if not self.autostart or exe is None:
            raise self.not_running(cause)
        done = subprocess.run(
            [exe, "serve", "--detach"], capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            from .errors import DaemonNotRunning

            raise DaemonNotRunning(
                f"no forkbox daemon answered on {self.socket}, and `forkbox serve --detach` "
                f"failed: {done.stderr.strip()}"
            )

    def headers(self) -> Dict[str, str]:
        return {"authorization": f"Bearer {self.token}"} if self.token else {}

    def not_running(self, cause: BaseException) -> ForkboxError:
        from .errors import DaemonNotRunning

        if self.socket:
            return DaemonNotRunning(
                f"no forkbox daemon answers on {self.socket} ({cause}); start one with "
                "`forkbox serve &` (any `forkbox sandbox` command also starts it), or point "
                "FORKBOX_API at another"
            )
        return DaemonNotRunning(f"no forkbox API answers at {self.base_url} ({cause})")


def error_of(status: int, body: bytes) -> ForkboxError:
    code = None
    try:
        answer = json.loads(body)
        message = answer["error"]
        if not isinstance(message, str):
            raise TypeError
        code = answer.get("code") if isinstance(answer.get("code"), str) else None
    except (ValueError, KeyError, TypeError, AttributeError):
        message = body.decode("utf-8", "replace").strip() or f"HTTP {status}"
    return from_answer(status, code, message)


@dataclass
class ExecResult:
    """How a command ended and what it printed. A plain exec keeps 64 KiB per stream and sets
    ``*_truncated`` past that; a streamed one (callbacks) keeps everything."""

    exit_code: int
    stdout: str
    stderr: str
    signal: Optional[int] = None
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "ExecResult":
        return ExecResult(
            exit_code=d["exit_code"],
            stdout=d.get("stdout", ""),
            stderr=d.get("stderr", ""),
            signal=d.get("signal"),
            timed_out=bool(d.get("timed_out")),
            stdout_truncated=bool(d.get("stdout_truncated")),
            stderr_truncated=bool(d.get("stderr_truncated")),
            duration_ms=d.get("duration_ms", 0),
        )


def checked(result: ExecResult, timeout_ms: Optional[int]) -> ExecResult:
    if result.timed_out:
        raise ExecTimeout(
            f"the command ran past its timeout of {timeout_ms} ms and was killed", result
        )
    return result


@dataclass(frozen=True)
class Image:
    reference: str
    name: str
    version: int
    suite: str
    base: Optional[str]
    content_mib: int
    disk_mib: int
    build_seconds: float
    env: Dict[str, str] = field(default_factory=dict)
    #: The registry image under it, pinned (``HOST/PATH@sha256:…``).
    pulled: Optional[str] = None
    #: Where commands start unless they say (a registry image's WorkingDir).
    workdir: Optional[str] = None
    #: Who commands run as unless they say (a registry image's User).
    user: Optional[str] = None

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "Image":
        return Image(
            reference=d["reference"],
            name=d["name"],
            version=d["version"],
            suite=d["suite"],
            base=d.get("base"),
            content_mib=d["content_mib"],
            disk_mib=d["disk_mib"],
            build_seconds=d["build_seconds"],
            env=dict(d.get("env") or {}),
            pulled=d.get("pulled"),
            workdir=d.get("workdir"),
            user=d.get("user"),
        )

    def __str__(self) -> str:
        return self.reference


@dataclass(frozen=True)
class DirEntry:
    name: str
    kind: str  # file, dir, symlink, other
    size: int
    mode: int
    modified_unix: float

    @property
    def is_dir(self) -> bool:
        return self.kind == "dir"


@dataclass(frozen=True)
class OutputEvent:
    """A chunk of a command's output as it happened."""

    stream: str  # "stdout" or "stderr"
    data: bytes

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


def exec_body(
    cmd: Command,
    cwd: Optional[str],
    env: Optional[Mapping[str, str]],
    timeout_seconds: Optional[float],
    timeout_ms: Optional[int],
) -> Dict[str, Any]:
    if isinstance(cmd, str):
        body: Dict[str, Any] = {"shell": cmd}
    else:
        argv = list(cmd)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise TypeError("cmd must be a shell string or a non-empty list of strings")
        body = {"argv": argv}
    if cwd is not None:
        body["cwd"] = cwd
    if env:
        body["env"] = dict(env)
    if timeout_seconds is not None and timeout_ms is not None:
        raise TypeError("give timeout_seconds or timeout_ms, not both")
    if timeout_seconds is not None:
        timeout_ms = int(timeout_seconds * 1000)
    if timeout_ms is not None:
        body["timeout_ms"] = int(timeout_ms)
    return body


def network_body(network: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    """``{"internet": bool}``, ``{"allow": [hosts]}``, or ``{"internet": True, "deny":
    [hosts or networks], "allow": [exceptions]}``; None means no network at all."""
    if network is None:
        return None
    unknown = set(network) - {"internet", "allow", "deny"}
    if unknown:
        raise TypeError(f"network takes 'internet', 'allow' and 'deny', not {sorted(unknown)}")
    if not network.get("internet") and not network.get("allow"):
        return None
    body = {"internet": bool(network.get("internet")), "allow": list(network.get("allow") or [])}
    if network.get("deny"):
        body["deny"] = list(network["deny"])
    return body


def secrets_body(secrets: Optional[Sequence[Mapping[str, Any]]]) -> Optional[List[Dict[str, Any]]]:
    """``[{"name": "NPM_TOKEN", "hosts": ["registry.npmjs.org"], "value": "..."}]``: the guest's
    ``$NAME`` is a placeholder; HTTPS requests to ``hosts`` carry the value in its place. The
    value is sent to the daemon once and never returned."""
    if not secrets:
        return None
    out = []
    for s in secrets:
        unknown = set(s) - {"name", "hosts", "value"}
        if unknown or not {"name", "hosts", "value"} <= set(s):
            raise TypeError(f"a secret is {{'name', 'hosts', 'value'}}, not {sorted(s)}")
        hosts = s["hosts"]
        if isinstance(hosts, str):
            hosts = [hosts]
        out.append({"name": str(s["name"]), "hosts": [str(h) for h in hosts], "value": str(s["value"])})
    return out


def port_body(guest_port: int, host_port: Optional[int], address: Optional[str]) -> Dict[str, Any]:
    if not isinstance(guest_port, int) or not 1 <= guest_port <= 65535:
        raise ValueError(f"guest_port {guest_port!r}: give a port from 1 to 65535")
    body: Dict[str, Any] = {"guest_port": guest_port}
    if host_port is not None:
        body["host_port"] = int(host_port)
    if address is not None:
        body["address"] = address
    return body


def volume_body(name: str, size: Optional[str], node: Optional[str]) -> Dict[str, Any]:
    body: Dict[str, Any] = {"name": name}
    if size is not None:
        body["size"] = str(size)
    if node is not None:
        body["node"] = node
    return body


def create_body(
    image: Optional[str] = None,
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
) -> Dict[str, Any]:
    body: Dict[str, Any] = {"labels": dict(labels or {})}
    body.update(idle_body(idle_seconds, wake_on_use))
    if volumes:
        body["volumes"] = volumes_body(volumes)
    for k, v in (
        ("image", image),
        ("snapshot", snapshot),
        ("ttl_seconds", ttl_seconds),
        ("cpus", cpus),
        ("memory_mib", memory_mib),
        ("disk_gib", disk_gib),
        ("network", network_body(network)),
        ("node", node),
        ("secrets", secrets_body(secrets)),
    ):
        if v is not None:
            body[k] = v
    if persistent:
        body["ttl_action"] = "hibernate"
    return body


def volumes_body(volumes: Sequence[Any]) -> List[Dict[str, Any]]:
    """Volumes to mount: each ``"NAME:/path"`` (read-write), ``"NAME:/path:ro"``, or
    ``{"name", "path", "read_only"}``."""
    out: List[Dict[str, Any]] = []
    for v in volumes:
        if isinstance(v, str):
            name, sep, rest = v.partition(":")
            path, ro = rest, False
            if rest.endswith(":ro") or rest.endswith(":rw"):
                path, ro = rest[:-3], rest.endswith(":ro")
            if not sep or not name or not path:
                raise ValueError(f"{v!r} is not a volume mount: give NAME:/path or NAME:/path:ro")
            out.append({"name": name, "path": path, "read_only": ro})
        else:
            out.append({"name": v["name"], "path": v["path"], "read_only": bool(v.get("read_only", False))})
    return out


def idle_body(idle_seconds: Optional[int], wake_on_use: Optional[bool]) -> Dict[str, Any]:
    """The idle policy of a create, a fork or ``set_idle``: sleep after ``idle_seconds`` unused
    (woken by the next use unless ``wake_on_use`` is False)."""
    body: Dict[str, Any] = {}
    if idle_seconds is not None:
        body["idle"] = {"after_secs": int(idle_seconds), "action": "hibernate"}
    if wake_on_use is not None:
        body["wake_on_use"] = bool(wake_on_use)
    return body


def fork_body(
    count: int,
    ttl_seconds: Optional[int],
    network: Optional[Mapping[str, Any]],
    labels: Optional[Mapping[str, str]],
    node: Optional[str] = None,
    secrets: Optional[Sequence[Mapping[str, Any]]] = None,
    volumes: Optional[Sequence[Any]] = None,
) -> Dict[str, Any]:
    body: Dict[str, Any] = {"count": count, "labels": dict(labels or {})}
    if volumes:
        body["volumes"] = volumes_body(volumes)
    if secrets:
        body["secrets"] = secrets_body(secrets)
    if ttl_seconds is not None:
        body["ttl_seconds"] = ttl_seconds
    if node is not None:
        body["node"] = node
    if network is not None:
        body["network"] = network_body(network) or {"internet": False, "allow": []}
    return body


class StreamCollector:
    """Reads a command's NDJSON events into callbacks and a final result."""

    def __init__(
        self,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        keep: bool = True,
    ) -> None:
        self.on = {"stdout": on_stdout, "stderr": on_stderr}
        self.decoders = {
            "stdout": codecs.getincrementaldecoder("utf-8")("replace"),
            "stderr": codecs.getincrementaldecoder("utf-8")("replace"),
        }
        self.text: Dict[str, List[str]] = {"stdout": [], "stderr": []}
        self.keep = keep
        self.command_id: Optional[str] = None
        self.result: Optional[ExecResult] = None

    def feed(self, line: str) -> Optional[OutputEvent]:
        """One NDJSON line; the output event it carries, if any."""
        if not line.strip():
            return None
        ev = json.loads(line)
        kind = ev.get("type")
        if kind == "command":
            self.command_id = ev["command_id"]
        elif kind in ("stdout", "stderr"):
            data = base64.b64decode(ev["data_b64"])
            text = self.decoders[kind].decode(data)
            if self.keep:
                self.text[kind].append(text)
            cb = self.on[kind]
            if cb is not None and text:
                cb(text)
            return OutputEvent(kind, data)
        elif kind == "exit":
            for k in ("stdout", "stderr"):
                tail = self.decoders[k].decode(b"", final=True)
                if tail:
                    self.text[k].append(tail)
            self.result = ExecResult(
                exit_code=ev["exit_code"],
                stdout="".join(self.text["stdout"]),
                stderr="".join(self.text["stderr"]),
                signal=ev.get("signal"),
                timed_out=bool(ev.get("timed_out")),
                duration_ms=ev.get("duration_ms", 0),
            )
        elif kind == "error":
            if ev.get("exit_code") is not None:
                # It could not start, as a shell says it: 127 not found, 126 not runnable.
                self.result = ExecResult(
                    exit_code=ev["exit_code"],
                    stdout="".join(self.text["stdout"]),
                    stderr="".join(self.text["stderr"]) + f"forkbox: {ev['message']}\n",
                    signal=None,
                    timed_out=False,
                    duration_ms=0,
                )
                return None
            raise ForkboxError(ev.get("message", "the command failed"))
        return None

    def finish(self) -> ExecResult:
        if self.result is None:
            raise ForkboxError("the command's event stream ended before the command did")
        return self.result


def pack_dir(local_dir: str, fileobj: Any) -> None:
    """Writes ``local_dir``'s tree as one tar.gz (symlinks stay links) into ``fileobj``."""
    import tarfile

    if not os.path.isdir(local_dir):
        raise ForkboxError(f"{local_dir} is not a directory on this host")
    with tarfile.open(fileobj=fileobj, mode="w:gz", compresslevel=1) as tar:
        for entry in sorted(os.listdir(local_dir)):
            tar.add(os.path.join(local_dir, entry), arcname=entry, recursive=True)


def _real_dirs(root: str, parts: list) -> str:
    """Makes ``parts`` under ``root`` a chain of real directories: an existing component must
    be a directory itself, never a link, so nothing is written through a link the archive
    made. Returns the path."""
    import stat

    path = root
    for p in parts:
        path = os.path.join(path, p)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            os.mkdir(path)
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise ForkboxError(f"refused archive entry {path!r}: its path goes through a link or a file")
    return path


def _write_sparse(src: Any, fd: int) -> None:
    """Copies ``src`` into ``fd``, leaving holes where whole blocks are zero."""
    block = 64 * 1024
    zero = bytes(block)
    size = 0
    while True:
        chunk = src.read(block)
        if not chunk:
            break
        if chunk == zero[: len(chunk)]:
            os.lseek(fd, len(chunk), os.SEEK_CUR)
        else:
            os.write(fd, chunk)
        size += len(chunk)
    os.ftruncate(fd, size)


def unpack_into(fileobj: Any, local_dir: str) -> int:
    """Unpacks a tar.gz from a sandbox into ``local_dir``, which must not exist yet. Regular
    files (sparse ones kept sparse), directories and symbolic links with plain relative names
    are accepted; a link is made as a link and never followed (every directory an entry goes
    through must be a real one). Hard links, devices, absolute names and ``..`` are refused.
    Returns the files written; on error nothing is left."""
    import shutil
    import tarfile

    if os.path.lexists(local_dir):
        raise ForkboxError(f"{local_dir} already exists; download into a directory that does not")
    os.makedirs(local_dir)
    files = 0
    try:
        with tarfile.open(fileobj=fileobj, mode="r|gz") as tar:
            for m in tar:
                name = m.name
                parts = [p for p in name.split("/") if p not in ("", ".")]
                if name.startswith("/") or ".." in parts:
                    raise ForkboxError(f"refused archive entry {name!r}: not a plain relative name")
                if not (m.isfile() or m.isdir() or m.issym()):
                    raise ForkboxError(f"refused archive entry {name!r}: not a file, directory or symbolic link")
                if not parts:
                    continue
                if m.isdir():
                    _real_dirs(local_dir, parts)
                    continue
                dest = os.path.join(_real_dirs(local_dir, parts[:-1]), parts[-1])
                if m.issym():
                    os.symlink(m.linkname, dest)
                    files += 1
                    continue
                src = tar.extractfile(m)
                assert src is not None
                fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                try:
                    _write_sparse(src, fd)
                    os.fchmod(fd, m.mode & 0o755)
                finally:
                    os.close(fd)
                files += 1
    except BaseException:
        shutil.rmtree(local_dir, ignore_errors=True)
        raise
    return files
