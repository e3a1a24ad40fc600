"""Errors the SDK raises. Each carries the daemon's own message."""

from __future__ import annotations

from typing import Optional


class ForkboxError(Exception):
    """Something forkbox refused or could not do; ``status`` is the HTTP status, if any."""

    def __init__(self, message: str, status: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class BadRequest(ForkboxError):
    """The request was malformed or named something invalid (400)."""


class AuthError(ForkboxError):
    """The token is missing or wrong (401), or the request was refused (403)."""


class NotFound(ForkboxError):
    """No such sandbox, image, snapshot, command or file (404)."""


class Conflict(ForkboxError):
    """The thing is in the wrong state for this: hibernated, in use, failed (409)."""


class InsufficientStorage(ForkboxError):
    """A disk is full: the sandbox's own (an upload) or the host's (507)."""


class DaemonNotRunning(ForkboxError):
    """No forkbox daemon answers where the SDK looked."""


class BuildError(ForkboxError):
    """An image build failed; the message holds the step and the last output."""


class ExecTimeout(ForkboxError):
    """A command ran past its timeout and was killed; ``result`` has what it printed."""

    def __init__(self, message: str, result: "object") -> None:
        super().__init__(message, None)
        self.result = result


_BY_STATUS = {
    400: BadRequest,
    401: AuthError,
    403: AuthError,
    404: NotFound,
    409: Conflict,
    422: BadRequest,
    507: InsufficientStorage,
}


def from_status(status: int, message: str) -> ForkboxError:
    return _BY_STATUS.get(status, ForkboxError)(message, status)
