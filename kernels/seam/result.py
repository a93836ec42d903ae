"""What one execution produced, and the typed failures of the kernel layer.

User-code errors are data (``ExecutionResult.error``); infrastructure failures a
caller must handle are exceptions (:class:`KernelError` and subclasses).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Outcome(str, Enum):
    """How an execution ended."""

    OK = "ok"
    ERROR = "error"  # the code raised; see ExecutionResult.error
    TIMEOUT_INTERRUPTED = "timeout_interrupted"  # timed out, interrupt worked, variables kept
    TIMEOUT_RESTARTED = "timeout_restarted"  # interrupt did not stop it; kernel restarted
    INTERRUPTED = "interrupted"  # stopped on request (Stop button)
    DIED = "died"  # the kernel process died during the execution


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """A piece of stdout or stderr, in arrival order."""

    name: str  # "stdout" | "stderr"
    text: str


#: Image types a chat shows inline, best first (the kernel adds a PNG to charts and SVG).
CHAT_IMAGE_MIMES = ("image/png", "image/jpeg")


@dataclass(frozen=True, slots=True)
class DisplayOutput:
    """A display_data / execute_result bundle, MIME type → payload.

    Text types hold ``str``; binary types (``image/png``) hold the decoded ``bytes``.
    """

    data: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)

    def png(self) -> bytes | None:
        """The PNG bytes of this output, if it has any."""
        return self._binary("image/png")

    def image(self) -> tuple[bytes, str] | None:
        """The best image of this output for a chat, with its MIME type: PNG, else JPEG."""
        for mime in CHAT_IMAGE_MIMES:
            if (data := self._binary(mime)) is not None:
                return data, mime
        return None

    def _binary(self, mime: str) -> bytes | None:
        value = self.data.get(mime)
        if isinstance(value, str):
            return base64.b64decode(value)
        return value if isinstance(value, bytes) else None


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """An exception raised by user code (ANSI colour codes stripped)."""

    ename: str
    evalue: str
    traceback: str


@dataclass(slots=True)
class ExecutionResult:
    """Everything one ``KernelSession.execute`` call produced."""

    outcome: Outcome = Outcome.OK
    streams: list[StreamChunk] = field(default_factory=list)
    result: str | None = None  # execute_result text/plain
    result_data: DisplayOutput | None = None  # the full execute_result bundle
    displays: list[DisplayOutput] = field(default_factory=list)
    error: ErrorInfo | None = None
    execution_count: int | None = None
    duration_s: float = 0.0
    changed_files: list[str] = field(default_factory=list)  # workspace-relative, sorted
    truncated: bool = False
    #: The kernel is a fresh one (death, restart after timeout, reaped earlier):
    #: variables from before are gone, files in the workspace remain.
    kernel_restarted: bool = False
    #: A human-readable note about what happened to the kernel, if anything did.
    notice: str | None = None

    @property
    def stdout(self) -> str:
        """All stdout text, concatenated."""
        return "".join(c.text for c in self.streams if c.name == "stdout")

    @property
    def stderr(self) -> str:
        """All stderr text, concatenated."""
        return "".join(c.text for c in self.streams if c.name == "stderr")

    @property
    def images(self) -> list[bytes]:
        """Images (PNG, else JPEG) from display outputs and the execute_result, in order."""
        return [data for data, _ in self.chat_images]

    @property
    def chat_images(self) -> list[tuple[bytes, str]]:
        """(bytes, MIME type) of each output's best chat image (:meth:`DisplayOutput.image`), in order."""
        outputs = [*self.displays, *([self.result_data] if self.result_data else [])]
        return [image for out in outputs if (image := out.image()) is not None]

    @property
    def ok(self) -> bool:
        """True when the code ran to the end without an error."""
        return self.outcome is Outcome.OK


class KernelError(Exception):
    """Base class for failures of the kernel layer itself (not of user code)."""


class KernelStartError(KernelError):
    """A kernel could not be started."""


class SandboxUnavailableError(KernelStartError):
    """``kernels.sandbox`` asks for a sandbox that cannot start here: no kernel may run (one
    line: what is missing and what fixes it)."""


class KernelUnavailableError(KernelStartError):
    """The service that runs kernels (a Jupyter gateway) cannot be reached or refuses."""


class PoolFullError(KernelError):
    """Every kernel slot is taken by a busy kernel; try again later."""


class QueueFullError(PoolFullError):
    """Every kernel is in use and the queue of threads waiting for one is full."""


class QueueTimeoutError(PoolFullError):
    """No kernel came free within ``queue_timeout_s``."""


class QueueLeftError(PoolFullError):
    """The thread stopped waiting for a kernel (the Stop button)."""


class QuotaError(KernelError):
    """An upload would exceed the per-file or per-workspace quota."""


class UnsafePathError(KernelError):
    """A path would resolve outside its workspace."""
