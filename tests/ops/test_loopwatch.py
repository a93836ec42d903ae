"""The event loop's watchdog answers for the loop as it is now: stalled while it is blocked,
healthy the moment it turns again (``/healthz`` asks it between two of its thread's looks)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from bot.loopwatch import LoopWatchdog

pytestmark = pytest.mark.timeout(30)


async def test_a_loop_that_turns_again_is_healthy_before_the_watcher_looks_again() -> None:
    # Looks every 0.5 s: the answer right after the stall comes between two looks.
    watchdog = LoopWatchdog(stall_after_s=0.2, beat_s=0.5)
    watchdog.start()
    try:
        await asyncio.sleep(0.6)  # one beat and one look have passed
        during: list[float | None] = []
        asker = threading.Timer(0.45, lambda: during.append(watchdog.stalled_for))
        asker.start()
        time.sleep(0.7)  # the loop blocked past the watcher's next look
        asker.join()
        [stalled] = during
        assert stalled is not None and stalled > 0.2
        # The loop turns: the late beat runs first, then this task (its timer is due later).
        await asyncio.sleep(0.001)
        assert watchdog.stalled_for is None
    finally:
        watchdog.stop()
    time.sleep(0.3)  # stopped, it beats no more: that is not a stall
    assert watchdog.stalled_for is None
