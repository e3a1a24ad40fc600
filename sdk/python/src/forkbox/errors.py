"""Errors the SDK raises. Each carries the daemon's own message."""

from __future__ import annotations

from typing import Optional


class ForkboxError(Exception):
    """Something forkbox refused or could not do. ``code`` is the daemon's stable name for it
    (``sandbox_not_found``, ``image_in_use``, …: the same from every forkbox front end) and
    ``status`` the HTTP status, when the daemon answered."""

    def __init__(
        self, message: str, status: Optional[int] = None, code: Optional[str] = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


class BadRequest(ForkboxError, ValueError):
    """The request was malformed or named something invalid (400); a ``ValueError`` too."""


class AuthError(ForkboxError):
    """The token is missing or wrong (401), or the request was refused (403)."""


class NotFound(ForkboxError):
    """No such sandbox, image, snapshot, command or file (404)."""


class Conflict(ForkboxError):
    """The thing is in the wrong state for this: hibernated, in use, failed (409)."""


class InsufficientStorage(ForkboxError):
    """A disk is full: the sandbox's own (an upload) or the host's (507)."""


class InternalError(ForkboxError):
    """A bug in forkbox, or its host failing under it: never the request's fault (500)."""


class DaemonNotRunning(ForkboxError):
    """No forkbox daemon answers where the SDK looked."""


class BuildError(ForkboxError):
    """An image build failed; the message holds the step and the last output."""


class ExecTimeout(ForkboxError):
    """A command ran past its timeout and was killed; ``result`` has what it printed."""

    def __init__(self, message: str, result: "object") -> None:
        super().__init__(message, None)
        self.result = result


# Every code the API answers with (forkbox_api::Code; a Rust test holds this table to it).
_BY_CODE = {
    "bad_request": BadRequest,
    "payload_too_large": BadRequest,
    "unauthorized": AuthError,
    "permission_denied": AuthError,
    "misdirected_request": AuthError,
    "sandbox_not_found": NotFound,
    "command_not_found": NotFound,
    "snapshot_not_found": NotFound,
    "image_not_found": NotFound,
    "volume_not_found": NotFound,
    "not_found": NotFound,
    "sandbox_hibernated": Conflict,
    "sandbox_not_hibernated": Conflict,
    "sandbox_failed": Conflict,
    "snapshot_exists": Conflict,
    "snapshot_in_use": Conflict,
    "snapshot_unrestorable": Conflict,
    "image_in_use": Conflict,
    "volume_exists": Conflict,
    "volume_in_use": Conflict,
    "conflict": Conflict,
    "refused_from_guest": ForkboxError,
    "disk_full": InsufficientStorage,
    "host_disk_full": InsufficientStorage,
    "setup_needed": ForkboxError,
    "build_failed": BuildError,
    "sandbox_lost": Conflict,
    "cluster_unavailable": ForkboxError,
    "no_capacity": ForkboxError,
    "node_unreachable": ForkboxError,
    "internal": InternalError,
}

# For answers without a code: a body that is not forkbox's (a proxy's, a framework's).
_BY_STATUS = {
    400: BadRequest,
    401: AuthError,
    403: AuthError,
    404: NotFound,
    409: Conflict,
    422: BadRequest,
    500: InternalError,
    507: InsufficientStorage,
}


def from_answer(status: int, code: Optional[str], message: str) -> ForkboxError:
    """The error for an answer: by its code, or by its status when it has none (or one newer
    than this SDK)."""
    cls = _BY_CODE.get(code or "") or _BY_STATUS.get(status, ForkboxError)
    return cls(message, status, code)
