"""The console for a person at a terminal: line editing and history (prompt_toolkit), Markdown
and code shown with rich.

While the prompt waits, whatever is printed (a scheduled run's answer) goes above it through
prompt_toolkit's ``patch_stdout``, so the line being typed is never garbled. The history of
what was typed is kept in a file per output folder, read and written off the event loop
(``ThreadedHistory``). A link shows its label and its target as text, never a label that opens
another address (no terminal hyperlinks). Used only when stdin is a terminal; a pipe gets
plain text (:mod:`adapters.console`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from prompt_toolkit import PromptSession
from prompt_toolkit.formatted_text import FormattedText
from prompt_toolkit.history import FileHistory, History, InMemoryHistory, ThreadedHistory
from prompt_toolkit.input import create_input
from prompt_toolkit.output import create_output
from prompt_toolkit.patch_stdout import patch_stdout
from rich.console import Console
from rich.markdown import Markdown
from rich.syntax import Syntax
from rich.table import Table as RichTable
from rich.text import Text

from bot.events import CellProgress, Number, Table
from bot.safetext import without_terminal_control
from bot.tables import cell_text, hidden_note

log = logging.getLogger(__name__)


class _CurrentStdout:
    """Writes to whatever ``sys.stdout`` is now (prompt_toolkit's proxy while the console runs)."""

    def write(self, text: str) -> int:
        return sys.stdout.write(text)

    def flush(self) -> None:
        sys.stdout.flush()


class Terminal:
    """Reads lines with editing and history; prints Markdown, code and the running cell's output."""

    def __init__(self, stdin: TextIO, stdout: TextIO, *, history: Path | None, show_code: bool) -> None:
        """``history``: the file that keeps what was typed (None: kept in memory only);
        ``show_code``: show each step's code and its output as it runs (else one line per step)."""
        self._stdin = stdin
        self._stdout = stdout
        self._history = history
        self._show_code = show_code
        self._session: PromptSession[str] | None = None
        self._round = 0
        self._printed_lines = 0

    @contextlib.contextmanager
    def attached(self) -> Iterator[None]:
        """While the console runs: prints go above the prompt."""
        with patch_stdout(raw=True):
            yield

    async def read(self, prompt: str) -> str | None:
        """The next line typed; None on Ctrl-D or Ctrl-C (the person quits)."""
        if self._session is None:
            output = create_output(self._stdout)
            # No cursor position requests: a terminal that does not answer them (a pseudo-terminal
            # under test, some multiplexers) would otherwise get a warning printed after 2 s.
            output.enable_cpr = False  # type: ignore[attr-defined]
            self._session = PromptSession(
                history=await asyncio.to_thread(self._open_history), input=create_input(self._stdin), output=output
            )
        try:
            # Coloured: prompt_toolkit draws an unstyled trailing space as a cursor move, not a space.
            # handle_sigint off: Ctrl-C at the prompt is a key (quit); during a turn the console's own handler stops it.
            message = FormattedText([("fg:ansigreen", prompt)])
            return await self._session.prompt_async(message, handle_sigint=False)
        except (EOFError, KeyboardInterrupt):
            return None

    def say(self, text: str) -> None:
        """A plain line (file names, the banner): printed as it is, no markup."""
        self._console().print(Text(without_terminal_control(text)), soft_wrap=True)

    def markdown(self, text: str) -> None:
        """An answer or notice, rendered."""
        self._console().print(Markdown(without_terminal_control(text), hyperlinks=False))

    def table(self, table: Table) -> None:
        """A table the code showed: a rich table of its rows (cells as plain text, never markup)
        under its caption, and how much is not shown."""
        clean = without_terminal_control
        grid = RichTable(show_lines=False)
        for number, name in enumerate(table.header):
            numeric = any(isinstance(row[number], Number) for row in table.rows if number < len(row))
            grid.add_column(Text(clean(name)), justify="right" if numeric else "left", overflow="fold")
        for row in table.rows:
            grid.add_row(*(Text(clean(cell_text(cell))) for cell in row))
        self._console().print(Text(clean(table.caption), style="bold"), soft_wrap=True)  # not wrapped to the grid
        self._console().print(grid)
        if note := hidden_note(table):
            self._console().print(Text(note, style="dim"))

    def status(self, text: str) -> None:
        """A status line, dimmed."""
        self._console().print(Text(f"  … {without_terminal_control(text)}", style="dim"), soft_wrap=True)

    def cell(self, cell: CellProgress) -> None:
        """The running cell: its code once when it starts (unless quiet), then each line it
        prints as it ends (quiet: the step's line only)."""
        console = self._console()
        if cell.round != self._round:
            self._round, self._printed_lines = cell.round, 0
            console.print(
                Text(f"  … Running step {cell.round}: {without_terminal_control(cell.label)}", style="dim"),
                soft_wrap=True,
            )
            if self._show_code:
                code = without_terminal_control(cell.code)
                console.print(Syntax(code, "python", theme="ansi_dark", line_numbers=False, word_wrap=True))
        if not self._show_code:
            return
        lines = cell.shown_lines()
        ended = lines[: len(lines) - cell.unfinished_lines]
        new = cell.ended_lines - self._printed_lines
        if new <= 0:
            return
        if new > len(ended):
            console.print(Text(f"  │ … {new - len(ended)} more lines", style="dim"))
        for line in ended[-new:]:
            console.print(Text(f"  │ {without_terminal_control(line)}", style="dim"), soft_wrap=True)
        self._printed_lines = cell.ended_lines

    def new_turn(self) -> None:
        """A turn starts: its steps count from 1 again."""
        self._round, self._printed_lines = 0, 0

    def _console(self) -> Console:
        return Console(
            file=_CurrentStdout(),  # type: ignore[arg-type]
            force_terminal=True,
            width=shutil.get_terminal_size().columns,
            highlight=False,
        )

    def _open_history(self) -> History:
        if self._history is None:
            return InMemoryHistory()
        try:
            self._history.parent.mkdir(parents=True, exist_ok=True)
            self._history.touch(exist_ok=True)
        except OSError as exc:
            log.warning("no history file at %s: %s", self._history, exc)
            return InMemoryHistory()
        return ThreadedHistory(FileHistory(str(self._history)))
