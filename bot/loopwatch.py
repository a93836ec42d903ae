"""A watchdog for the event loop: a thread outside it that notices when the loop stops turning.

Every turn of the bot (every thread's answer, every platform event) runs on one asyncio loop;
code that blocks or spins on it freezes them all while the process stays alive. The loop
beats (a callback every :data:`BEAT_S`); the watchdog thread looks every :data:`BEAT_S` and,
when no beat came for more than ``stall_after_s``, logs once with the stack the loop's thread
is in, counts the stall (``threadbook_event_loop_stalls_total``) and reports the loop as
stalled (``/healthz`` fails, so an orchestrator restarts a bot that hangs) until it beats again.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback

from bot import metrics

log = logging.getLogger(__name__)

#: How often the loop beats and the watchdog looks.
BEAT_S = 0.1
#: A loop that has not beaten for this long is stalled.
STALL_AFTER_S = 1.0


class LoopWatchdog:
    """Watches one event loop from a daemon thread (start it from the loop's own thread)."""

    def __init__(self, *, stall_after_s: float = STALL_AFTER_S, beat_s: float = BEAT_S) -> None:
        self.stall_after_s = stall_after_s
        self.beat_s = beat_s
        self._last_beat = time.monotonic()
        self._stalled_since: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread_id: int | None = None
        self._beat_handle: asyncio.TimerHandle | None = None

    @property
    def stalled_for(self) -> float | None:
        """Seconds the loop has been silent when that is over ``stall_after_s``, else None.

        Read from the last beat itself, not from the watching thread's last look: a loop that
        has just turned again is not reported stalled for up to another look. None once
        stopped (the loop no longer beats).
        """
        if self._stop.is_set():
            return None
        silent = time.monotonic() - self._last_beat
        return silent if silent > self.stall_after_s else None

    def start(self) -> None:
        """Begin beating on the running loop and watching from a thread of its own."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread_id = threading.get_ident()
        self._last_beat = time.monotonic()
        self._beat()
        self._thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and watching (the thread ends within one look)."""
        self._stop.set()
        if self._beat_handle is not None:
            self._beat_handle.cancel()
            self._beat_handle = None

    def _beat(self) -> None:
        self._last_beat = time.monotonic()
        if not self._stop.is_set() and self._loop is not None:
            self._beat_handle = self._loop.call_later(self.beat_s, self._beat)

    def _watch(self) -> None:
        while not self._stop.wait(self.beat_s):
            silent = time.monotonic() - self._last_beat
            if silent > self.stall_after_s and self._stalled_since is None:
                self._stalled_since = self._last_beat
                metrics.event_loop_stalled()
                log.error("the event loop has not turned for %.1f s; it is at:\n%s", silent, self._loop_stack())
            elif silent <= self.stall_after_s and self._stalled_since is not None:
                log.warning("the event loop turns again after %.1f s", time.monotonic() - self._stalled_since)
                self._stalled_since = None

    def _loop_stack(self) -> str:
        frame = sys._current_frames().get(self._loop_thread_id or -1)
        if frame is None:
            return "(the loop's thread is gone)"
        return "".join(traceback.format_stack(frame)).rstrip()
