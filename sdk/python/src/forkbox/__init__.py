"""forkbox: disposable microVM sandboxes with snapshot and fork, for agents.

Sync::

    from forkbox import Sandbox
    with Sandbox.create() as sbx:
        print(sbx.exec("python3 -V").stdout)

Async: ``AsyncRuntime``, ``AsyncSandbox``. Where the daemon is: ``$FORKBOX_API``
(``unix:/path`` or ``http://host:port`` with ``$FORKBOX_TOKEN``), else this host's socket.
"""

from ._async import (
    AsyncDetachedCommand,
    AsyncFiles,
    AsyncPorts,
    AsyncRuntime,
    AsyncSandbox,
    AsyncSnapshot,
)
from ._code import CodeContext, CodeError, CodeResult, Execution
from ._common import DirEntry, ExecResult, Image, OutputEvent
from ._sync import DetachedCommand, ExecStream, Files, Ports, Runtime, Sandbox, Snapshot
from .errors import (
    AuthError,
    BadRequest,
    BuildError,
    Conflict,
    DaemonNotRunning,
    ExecTimeout,
    ForkboxError,
    InsufficientStorage,
    InternalError,
    NotFound,
)

__all__ = [
    "AsyncDetachedCommand",
    "AsyncFiles",
    "AsyncPorts",
    "AsyncRuntime",
    "AsyncSandbox",
    "AsyncSnapshot",
    "CodeContext",
    "CodeError",
    "CodeResult",
    "Execution",
    "AuthError",
    "BadRequest",
    "BuildError",
    "Conflict",
    "DaemonNotRunning",
    "DetachedCommand",
    "DirEntry",
    "ExecResult",
    "ExecStream",
    "ExecTimeout",
    "Files",
    "Ports",
    "ForkboxError",
    "Image",
    "InsufficientStorage",
    "InternalError",
    "NotFound",
    "OutputEvent",
    "Runtime",
    "Sandbox",
    "Snapshot",
]
__version__ = "0.1.0"
