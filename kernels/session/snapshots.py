"""A thread's variables outlive its kernel: the bot's side of ``threadbook_kernel.snapshot``.

Serialising and loading happen inside the thread's sandboxed kernel; the bot only asks for
them with a silent user expression, reads the kernel's short JSON answer (bounded, checked
field by field, names and reasons cut to size) and tells the model what came back. The
snapshot's files are never opened by the bot: :meth:`kernels.workspace.Workspace.saved_state`
sizes them, :meth:`~kernels.workspace.Workspace.forget_state` deletes them.
"""

from __future__ import annotations

import json
import time
import unicodedata
from dataclasses import dataclass
from typing import Any

from kernels.units import human_age

__all__ = ["RESTORE_EXPRESSION", "RestoreReport", "SaveReport", "parse_restore", "parse_save", "save_expression"]

RESTORE_EXPRESSION = "__import__('threadbook_kernel.snapshot').snapshot.restore_for_bot()"
#: A save may take this long before it is interrupted (a GiB of DataFrames takes a few seconds).
SAVE_TIMEOUT_S = 120.0
#: A restore that takes longer is interrupted and reported as failed; the turn goes on.
RESTORE_TIMEOUT_S = 60.0
#: An answer longer than this is not read.
MAX_ANSWER_CHARS = 256 * 1024
_MAX_NAME_CHARS = 80
_MAX_TEXT_CHARS = 200
#: Names listed in a notice; the rest are counted.
_LISTED = 40

Pairs = tuple[tuple[str, str], ...]


def save_expression(max_bytes: int) -> str:
    """The user expression that saves the kernel's namespace, at most ``max_bytes``."""
    return f"__import__('threadbook_kernel.snapshot').snapshot.save_for_bot({int(max_bytes)})"


@dataclass(frozen=True)
class SaveReport:
    """What a save wrote: variables, bytes, the names left out (with why), and how long it took."""

    saved: int
    bytes: int
    lost: Pairs
    seconds: float


@dataclass(frozen=True)
class RestoreReport:
    """What a fresh kernel got back from the thread's snapshot.

    ``failure`` is set when the snapshot could not be loaded at all (then nothing counts as
    restored and the snapshot has been discarded).
    """

    restored: Pairs = ()
    lost: Pairs = ()
    saved_at: float = 0.0
    #: How long the restore took (the new kernel's start waited for it).
    seconds: float = 0.0
    failure: str | None = None

    def notice(self, now: float | None = None) -> str:
        """What the model is told about the thread's variables in this kernel."""
        if self.failure is not None:
            return (
                f"The thread's saved variables could not be restored ({self.failure}), so all variables from "
                "earlier in this thread are gone. Files in the workspace remain; reload what you need."
            )
        age = human_age((now if now is not None else time.time()) - self.saved_at)
        parts = [f"Variables were restored from this thread's snapshot saved {age} ago (later changes are lost)"]
        parts[0] += f": {_listed(self.restored, '({})')}." if self.restored else ", but it held none."
        if self.lost:
            parts.append(f"Not restored: {_listed(self.lost, '({})')}.")
        parts.append("Files in the workspace remain.")
        return " ".join(parts)


def parse_save(answer: str | None) -> SaveReport | None:
    """The kernel's answer to :func:`save_expression`, or None when there is none or it is malformed."""
    value = _json(answer)
    if not isinstance(value, dict):
        return None
    try:
        return SaveReport(
            saved=int(value["saved"]),
            bytes=int(value["bytes"]),
            lost=_pairs(value.get("lost")),
            seconds=float(value["seconds"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


def parse_restore(answer: str | None) -> RestoreReport | None:
    """The kernel's answer to :data:`RESTORE_EXPRESSION`: None when the thread has no snapshot,
    a report with ``failure`` set when the answer is missing or malformed."""
    value = _json(answer)
    if not isinstance(value, dict):
        return RestoreReport(failure="the kernel could not load it in time, or it is damaged")
    if value.get("found") is False:
        return None
    if isinstance(error := value.get("error"), str):
        return RestoreReport(failure=f"it is damaged: {_printable(error, _MAX_TEXT_CHARS)}")
    try:
        return RestoreReport(
            restored=_pairs(value.get("restored")),
            lost=_pairs(value.get("lost")),
            saved_at=float(value["saved_at"]),
            seconds=float(value["seconds"]),
        )
    except (KeyError, TypeError, ValueError):
        return RestoreReport(failure="the kernel's answer about it was malformed")


def _json(answer: str | None) -> Any:
    if answer is None or len(answer) > MAX_ANSWER_CHARS:
        return None
    try:
        return json.loads(answer)
    except (ValueError, RecursionError):
        return None


def _pairs(value: Any) -> Pairs:
    """``[[name, text], ...]`` from the kernel, each part made printable and cut to size."""
    if not isinstance(value, list):
        return ()
    pairs = []
    for item in value:
        if isinstance(item, list) and len(item) == 2 and all(isinstance(part, str) for part in item):
            pairs.append((_printable(item[0], _MAX_NAME_CHARS), _printable(item[1], _MAX_TEXT_CHARS)))
    return tuple(pairs)


def _printable(text: str, limit: int) -> str:
    clean = "".join(ch if not unicodedata.category(ch).startswith("C") else " " for ch in text).replace("`", "'")
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"


def _listed(pairs: Pairs, detail: str) -> str:
    shown = [f"`{name}` {detail.format(text)}" if text else f"`{name}`" for name, text in pairs[:_LISTED]]
    if len(pairs) > _LISTED:
        shown.append(f"and {len(pairs) - _LISTED} more")
    return ", ".join(shown)
