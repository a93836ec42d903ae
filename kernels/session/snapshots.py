"""A thread's variables outlive its kernel: the bot's side of ``threadbook_kernel.snapshot``.

Serialising and loading happen inside the thread's sandboxed kernel; the bot only asks for
them with a silent user expression, reads the kernel's short JSON answer (bounded, checked
field by field, names and reasons cut to size) and tells the model what came back. The
snapshot's files are never opened by the bot: :meth:`kernels.host.workspace.Workspace.saved_state`
sizes them, :meth:`~kernels.host.workspace.Workspace.forget_state` deletes them.

:class:`Snapshots` is a session's part in this: it loads the snapshot into each new kernel of
the thread and saves the kernel's variables into it, through the kernel the session lends it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import unicodedata
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from kernels.host.workspace import Workspace
from kernels.seam.settings import KernelSettings
from kernels.seam.units import human_age, human_size

__all__ = [
    "HOLDS_STATE_EXPRESSION",
    "RESTORE_EXPRESSION",
    "Ask",
    "RestoreReport",
    "SaveReport",
    "Snapshots",
    "parse_restore",
    "parse_save",
    "save_expression",
]

log = logging.getLogger(__name__)

RESTORE_EXPRESSION = "__import__('threadbook_kernel.snapshot').snapshot.restore_for_bot()"
#: Asked with every cell (a user expression of its request): whether a save would write
#: anything (``True``/``False``). Code in the kernel may answer falsely; it would cost only its
#: own thread's saves.
HOLDS_STATE_EXPRESSION = "__import__('threadbook_kernel.snapshot').snapshot.holds_state()"
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
#: The after-turn save is skipped once a save took longer than this (a namespace of GiBs); the
#: save when the kernel stops still runs.
QUICK_SAVE_S = 2.0
#: What the thread is told, once until a save works again, when its variables cannot be saved.
SAVE_FAILED_THREAD_NOTICE = (
    "⚠️ This thread's variables could not be saved ({why}): they are lost if its kernel stops. "
    "Files in the workspace are kept."
)

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


#: Evaluates an expression silently in the thread's kernel, then stops what the thread's code
#: left running (a cell may have replaced the functions a save or restore calls): the
#: ``text/plain`` of its value, or None when it raised, timed out or the kernel was lost.
Ask = Callable[[str, float], Awaitable[str | None]]


class Snapshots:
    """A session's side of its thread's snapshot: what each new kernel got back from it, the
    saves of the kernel's variables into it, and a failed save the thread has not been told of.

    The session holds its kernel for these (its lock; the kernel thawed only while asked) and
    lends it as an :data:`Ask`.
    """

    def __init__(self, key: str, workspace: Workspace, settings: KernelSettings) -> None:
        self._key = key
        self._workspace = workspace
        self._settings = settings
        #: What the current kernel got back from the thread's snapshot (None: there was none).
        self.restored: RestoreReport | None = None
        #: The last save of this session's variables.
        self.last_save: SaveReport | None = None
        #: Code ran since the last save.
        self.unsaved = False
        #: Why the last save failed, until the thread is told; ``_failing`` until one works.
        self._failed: str | None = None
        self._failing = False

    async def restore(self, ask: Ask) -> None:
        """Load the thread's snapshot, if it may have one, into a new kernel before any code of
        the model runs; :attr:`restored` says what came back. A snapshot that does not load is
        discarded (never tried again) and reported."""
        has_state = self._settings.snapshot and await asyncio.to_thread(self._workspace.may_hold_state)
        self.restored = await self._restore(ask) if has_state else None

    async def _restore(self, ask: Ask) -> RestoreReport | None:
        started = time.monotonic()
        report = parse_restore(await ask(RESTORE_EXPRESSION, RESTORE_TIMEOUT_S))
        if report is None:
            return None
        report = replace(report, seconds=time.monotonic() - started)  # as long as the start waited for it
        if report.failure is not None:
            log.warning("the snapshot of %s could not be loaded (%s): discarding it", self._key, report.failure)
            await asyncio.to_thread(self._workspace.forget_state)
        else:
            log.info(
                "restored %d variable(s) of %s in %.2f s (%d not restored)",
                len(report.restored),
                self._key,
                report.seconds,
                len(report.lost),
            )
        return report

    def ran(self, holds_state: str | None) -> None:
        """A cell ran; ``holds_state``: the kernel's answer to :data:`HOLDS_STATE_EXPRESSION`
        after it (None: none came, the cell failed or was stopped). Only ``False`` (nothing a
        save would keep, no snapshot to replace) leaves nothing unsaved."""
        self.unsaved = holds_state != "False"

    def due(self, *, only_if_quick: bool) -> bool:
        """Whether a save has something to write: code ran since the last one (and, with
        ``only_if_quick``, the last one took at most :data:`QUICK_SAVE_S`)."""
        if not self.unsaved:
            return False
        return not (only_if_quick and self.last_save is not None and self.last_save.seconds > QUICK_SAVE_S)

    async def save(self, ask: Ask, *, kernel_lost: Callable[[], bool]) -> SaveReport | None:
        """Save the kernel's variables into the thread's snapshot, within what the quota leaves.
        None when nothing was saved: a failure is logged and told to the thread (once until a
        save works again), unless the kernel was lost while saving (``kernel_lost()``: it died
        or ignored the interrupt, which the session noted)."""
        budget = await asyncio.to_thread(self._budget)
        if budget <= 0:
            log.warning("no room in the workspace of %s for a snapshot of its variables", self._key)
            self._note_failure("the workspace is full")
            return None
        report = parse_save(await ask(save_expression(budget), SAVE_TIMEOUT_S))
        if report is None:
            if kernel_lost():
                return None
            log.warning("saving the variables of %s failed", self._key)
            self._note_failure("saving them failed or took too long")
            return None
        self._note_failure(None)
        self.unsaved = False
        self.last_save = report
        log.info(
            "saved %d variable(s) of %s (%s) in %.2f s; %d left out",
            report.saved,
            self._key,
            human_size(report.bytes),
            report.seconds,
            len(report.lost),
        )
        return report

    def take_notice(self) -> str | None:
        """What the thread has not been told of a failed save, once; None when nothing."""
        failed, self._failed = self._failed, None
        return None if failed is None else SAVE_FAILED_THREAD_NOTICE.format(why=failed)

    async def forget(self) -> None:
        """``reset``: delete the thread's snapshot; nothing is unsaved or failing any more."""
        self.unsaved = False
        self._failed = None
        self._failing = False
        await asyncio.to_thread(self._workspace.forget_state)

    def _budget(self) -> int:
        """(Blocking) bytes a new snapshot may take: the configured limit, or what the
        workspace quota leaves beside the user's files, whichever is smaller."""
        scan = self._workspace.scan()
        current = self._workspace.saved_state(scan)
        others = scan.bytes - (current.bytes if current is not None else 0)
        limit = int(self._settings.snapshot_max_mb * 2**20)
        return min(limit, self._workspace.quota_bytes - others)

    def _note_failure(self, why: str | None) -> None:
        """Remember a save's failure for the thread (once until a save works again)."""
        if why is None:
            self._failing = False
        elif not self._failing:
            self._failing, self._failed = True, why


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
