"""What a turn shows while its code runs: the step, the time it has run, its latest output lines.

The kernel session hands every stream message of a running cell to :meth:`CellOutput.record`
(from its iopub loop, so recording only appends to a short buffer); :class:`LiveCell` renders
the running cell once a second into :meth:`~bot.events.Progress.cell`, whose platforms keep
only the newest state (never a backlog of edits).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import time
from collections import deque
from collections.abc import Callable

from bot.events import CellProgress, Progress
from bot.safetext import cut, without_terminal_control

log = logging.getLogger(__name__)

#: How often the status of a running cell is rendered (platforms throttle again on their side).
TICK_S = 1.0
#: How many of the latest output lines the status shows.
SHOWN_LINES = 6
#: How much of each line is kept: more than a status shows (:data:`bot.events.LINE_CHARS`), so
#: that the outbound rewrite (host paths) sees whole paths before the line is cut for showing.
KEPT_LINE_CHARS = 1_000
_BREAKS = re.compile(r"(\r\n|\r|\n)")


class CellOutput:
    """The latest lines a cell printed (stdout and stderr), as a terminal would show them:
    a ``\\r`` (a tqdm bar redrawing itself) makes the next text replace the line."""

    def __init__(self, keep: int = SHOWN_LINES) -> None:
        self._lines: deque[str] = deque(maxlen=keep)
        self._open: dict[str, str] = {}
        self._redraw: dict[str, bool] = {}
        #: Lines ended so far (the console prints the ones it has not printed yet).
        self.ended = 0

    def record(self, name: str, text: str) -> None:
        """Take one stream message (``name`` is ``stdout`` or ``stderr``); cheap, never blocks."""
        line = self._open.get(name, "")
        redraw = self._redraw.get(name, False)
        for piece in _BREAKS.split(text):
            if piece in ("\n", "\r\n"):
                self._lines.append(cut(line, KEPT_LINE_CHARS))
                self.ended += 1
                line, redraw = "", False
            elif piece == "\r":
                redraw = True
            # Bounded before the escapes go (a piece may be megabytes; what is kept is far less).
            elif piece := without_terminal_control(piece[: 4 * KEPT_LINE_CHARS]):
                line = piece if redraw else line + piece[: max(KEPT_LINE_CHARS + 1 - len(line), 0)]
                redraw = False
        self._open[name], self._redraw[name] = line[: KEPT_LINE_CHARS + 1], redraw

    def latest(self) -> tuple[tuple[str, ...], int]:
        """The last lines, the unfinished ones (a progress bar) last; and how many are unfinished.
        Lines are kept whole up to :data:`KEPT_LINE_CHARS`; they are cut for showing only after
        the outbound rewrite (:meth:`bot.events.CellProgress.shown_lines`)."""
        unfinished = [cut(line, KEPT_LINE_CHARS) for line in self._open.values() if line.strip()]
        keep = max((self._lines.maxlen or 0) - len(unfinished), 0)
        ended = list(self._lines)[-keep:] if keep else []
        return (*ended, *unfinished), len(unfinished)


class LiveCell:
    """Shows the turn's running cell on ``progress``: each step as it starts, then once a second."""

    def __init__(
        self, progress: Progress, *, tick_s: float = TICK_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._progress = progress
        self._tick_s = tick_s
        self._clock = clock
        self._round = 0
        self._label = ""
        self._code = ""
        self._started = 0.0
        self._output: CellOutput | None = None
        self._claimed = True
        self._ticker: asyncio.Task[None] | None = None

    async def step(self, round_no: int, label: str, code: str) -> None:
        """A new step's cell is about to run: show it at once, and keep showing it while it runs."""
        self._round, self._label, self._code = round_no, label, code
        self._claimed = False
        self.begin()
        await self._show()
        if self._ticker is None:
            self._ticker = asyncio.create_task(self._tick(), name="live cell")

    def claim(self) -> bool:
        """True once after each :meth:`step`: the code about to run is that step's (not, say,
        the loader a data-source query runs in the kernel)."""
        claimed, self._claimed = self._claimed, True
        return not claimed

    def begin(self) -> None:
        """The step's code starts (again, after a package it missed was installed)."""
        self._started = self._clock()
        self._output = CellOutput()

    def record(self, name: str, text: str) -> None:
        """The kernel's stream output of the running cell (called from its iopub loop)."""
        if self._output is not None:
            self._output.record(name, text)

    async def ran(self, *, ok: bool = True, show: bool = True) -> None:
        """The cell ended (``ok``: it ran without an error, a stop or a lost kernel): its last
        state is shown once more, marked ``complete`` or ``error`` (a quick cell's only showing
        of its output; not with ``show`` false, when the run itself failed), then nothing more."""
        cell = self.snapshot()
        self._output = None
        if show and cell is not None:
            await self._show(dataclasses.replace(cell, state="complete" if ok else "error"))

    async def close(self) -> None:
        """End the ticking (the turn is over)."""
        self._output = None
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None

    def snapshot(self) -> CellProgress | None:
        """The running cell as the status shows it now; None between cells."""
        output = self._output
        if output is None:
            return None
        lines, unfinished = output.latest()
        return CellProgress(
            round=self._round,
            label=self._label,
            code=self._code,
            elapsed_s=self._clock() - self._started,
            lines=lines,
            ended_lines=output.ended,
            unfinished_lines=unfinished,
        )

    async def _show(self, cell: CellProgress | None = None) -> None:
        if cell is None and (cell := self.snapshot()) is None:
            return
        try:
            await self._progress.cell(cell)
        except Exception:  # the status is cosmetic: a failed edit must not end the turn
            log.exception("showing the running cell failed")

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self._tick_s)
            await self._show()
