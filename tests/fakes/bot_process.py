"""The real bot as a child process (``python -m bot run --config FILE``), for tests that kill it.

Each run logs to its own file (a pipe nobody reads would fill and block the bot). At the end,
:meth:`BotProcesses.cleanup` makes sure every bot and every kernel it started is gone: kernels
of a killed bot notice their parent died and exit on their own; stragglers are killed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]


class BotProcesses:
    """Starts ``python -m bot run`` (one at a time), logging each run to its own file; kills leftovers at the end."""

    def __init__(self, tmp_path: Path, config: Path) -> None:
        self.tmp_path = tmp_path
        self.config = config
        self.runs = 0
        self.process: asyncio.subprocess.Process | None = None
        self.log_path = tmp_path / "bot-0.log"
        self._seen: list[psutil.Process] = []

    async def start(self) -> None:
        """Start the next run (the previous one must have ended)."""
        assert self.process is None or self.process.returncode is not None, "a bot is still running"
        self.runs += 1
        self.log_path = self.tmp_path / f"bot-{self.runs}.log"
        with self.log_path.open("wb") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bot",
                "run",
                "--config",
                str(self.config),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=self.tmp_path,
                env={**os.environ, "PYTHONPATH": str(REPO)},
                start_new_session=True,
            )
        self._seen.append(psutil.Process(self.process.pid))

    def log(self) -> str:
        """What the current run has logged so far."""
        return self.log_path.read_text(errors="replace")

    async def wait_for_log(self, text: str, timeout: float = 15.0) -> None:
        """Wait until the current run logs ``text``; fail early if it exits."""
        deadline = time.monotonic() + timeout
        while text not in self.log():
            assert self.process is not None and self.process.returncode is None, f"bot exited:\n{self.log()}"
            assert time.monotonic() < deadline, f"{text!r} not logged within {timeout}s:\n{self.log()}"
            await asyncio.sleep(0.05)

    async def kill(self) -> None:
        """SIGKILL, as an OOM killer or ``kill -9`` would: no clean-up code runs."""
        assert self.process is not None
        self._remember_children()
        self.process.kill()
        assert await asyncio.wait_for(self.process.wait(), 10) == -signal.SIGKILL

    async def terminate(self) -> int:
        """SIGTERM (a graceful stop); returns the exit code."""
        assert self.process is not None
        self._remember_children()
        self.process.terminate()
        return await asyncio.wait_for(self.process.wait(), 30)

    def _remember_children(self) -> None:
        assert self.process is not None
        try:
            self._seen.extend(psutil.Process(self.process.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            pass

    def cleanup(self) -> None:
        """Kernels of a killed bot notice their parent is gone and exit; make sure of it, and of the bots."""
        if self.process is not None and self.process.returncode is None:
            self._remember_children()
        _, alive = psutil.wait_procs(self._seen, timeout=5)
        for process in alive:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)


def in_flight_marks(db: Path) -> list[tuple[str, str]]:
    """(thread, message id) of every turn marked in flight, oldest first, read beside the bot."""
    with sqlite3.connect(db) as raw:
        rows = raw.execute("SELECT thread, message_id FROM turns_in_flight ORDER BY started_at").fetchall()
    raw.close()
    return [(str(t), str(m)) for t, m in rows]


async def eventually(predicate: Callable[[], object], timeout: float = 15.0) -> None:
    """Poll ``predicate`` until it is truthy (for state no fake signals a change of, e.g. the model's requests)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not true within {timeout}s"
        await asyncio.sleep(0.02)
