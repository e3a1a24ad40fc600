"""Code cells (``Sandbox.run_code``): what a cell gave back, and the reading of its events."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Union

from .errors import ForkboxError

FORMATS = ("text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "json", "javascript")


@dataclass
class CodeResult:
    """A value a cell displayed, or its last expression's (``is_main_result``), in every format
    the kernel gave (a plot: ``png``, base64)."""

    is_main_result: bool = False
    text: Optional[str] = None
    html: Optional[str] = None
    markdown: Optional[str] = None
    svg: Optional[str] = None
    png: Optional[str] = None
    jpeg: Optional[str] = None
    pdf: Optional[str] = None
    latex: Optional[str] = None
    json: Optional[Any] = None
    javascript: Optional[str] = None

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "CodeResult":
        return CodeResult(is_main_result=bool(d.get("is_main_result")), **{k: d.get(k) for k in FORMATS})

    def formats(self) -> List[str]:
        return [k for k in FORMATS if getattr(self, k) is not None]


@dataclass(frozen=True)
class CodeError:
    """An exception a cell raised (its class name, message, traceback), or ``TimeoutError``,
    ``KernelDied``, ``OutputLimitError``, ``ForkboxRelayError``, ``CommandExitError`` (a bash cell's exit)."""

    name: str
    value: str
    traceback: str


@dataclass
class Execution:
    """What a cell gave back."""

    results: List[CodeResult] = field(default_factory=list)
    stdout: List[str] = field(default_factory=list)
    stderr: List[str] = field(default_factory=list)
    error: Optional[CodeError] = None
    execution_count: Optional[int] = None

    @property
    def text(self) -> Optional[str]:
        """The text of the cell's own value (its last expression), if it had one."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None


@dataclass(frozen=True)
class CodeContext:
    """A context: a language and a working directory with state of their own."""

    id: str
    language: str
    cwd: str

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "CodeContext":
        return CodeContext(id=d["id"], language=d["language"], cwd=d["cwd"])


ContextRef = Union[CodeContext, str]
TextCallback = Callable[[str], Any]


def context_id(context: ContextRef) -> str:
    return context.id if isinstance(context, CodeContext) else context


def body(
    code: str,
    language: Optional[str],
    context: Optional[ContextRef],
    env: Optional[Mapping[str, str]],
    timeout_seconds: Optional[float],
) -> Dict[str, Any]:
    b: Dict[str, Any] = {"code": code}
    if language is not None:
        b["language"] = language
    if context is not None:
        b["context_id"] = context_id(context)
    if env:
        b["env"] = dict(env)
    if timeout_seconds is not None:
        b["timeout_secs"] = max(1, int(round(timeout_seconds)))
    return b


class CellCollector:
    """Reads a cell's NDJSON events into an :class:`Execution`, calling back as they come."""

    def __init__(
        self,
        on_stdout: Optional[TextCallback] = None,
        on_stderr: Optional[TextCallback] = None,
        on_result: Optional[Callable[[CodeResult], Any]] = None,
    ) -> None:
        self.ex = Execution()
        self.ended = False
        self._cb = {"stdout": on_stdout, "stderr": on_stderr}
        self._on_result = on_result

    def feed(self, line: str) -> None:
        if not line.strip():
            return
        ev = json.loads(line)
        kind = ev.get("type")
        if kind in ("stdout", "stderr"):
            getattr(self.ex, kind).append(ev["text"])
            cb = self._cb[kind]
            if cb is not None:
                cb(ev["text"])
        elif kind == "result":
            r = CodeResult.from_json(ev)
            self.ex.results.append(r)
            if self._on_result is not None:
                self._on_result(r)
        elif kind == "error":
            self.ex.error = CodeError(ev.get("name", ""), ev.get("value", ""), ev.get("traceback", ""))
        elif kind == "end":
            self.ex.execution_count = ev.get("execution_count")
            self.ended = True

    def finish(self) -> Execution:
        if not self.ended:
            raise ForkboxError("the cell's stream ended before the cell did")
        return self.ex
