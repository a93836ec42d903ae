"""Background tasks an adapter starts and must not lose: one small tracker for every adapter.

asyncio keeps only a weak reference to a task, so a task started and forgotten can be
garbage-collected mid-run. :class:`BackgroundTasks` holds each task until it ends, logs the
exception a task ended with, and lets the adapter cancel the tasks still running when it
stops (:meth:`~BackgroundTasks.cancel_all`) or wait for all of them, including those started
meanwhile (:meth:`~BackgroundTasks.drain`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

__all__ = ["BackgroundTasks"]


class BackgroundTasks:
    """The running background tasks of one adapter.

    ``log`` and ``label`` name the adapter in the error logged when a task fails, e.g.
    ``Slack: slack turn 123 failed``.
    """

    def __init__(self, log: logging.Logger, label: str) -> None:
        self._log = log
        self._label = label
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        """How many tasks are still running."""
        return len(self._tasks)

    def spawn(self, work: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task[None]:
        """Run ``work`` as a task named ``name``, held until it ends."""
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    async def cancel_all(self) -> None:
        """Cancel the tasks running now and wait until they have ended."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until no task is running, including tasks started while waiting, for at most
        ``timeout_s`` (None: no limit); nothing is cancelled. True when none is left."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while self._tasks:
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return False
            await asyncio.wait(list(self._tasks), timeout=left)
        return True

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._log.error("%s: %s failed", self._label, task.get_name(), exc_info=task.exception())
