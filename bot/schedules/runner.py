"""Runs due schedules: each due run becomes a normal turn of its thread.

Every :data:`POLL_S` the scheduler reads the due schedules from the store, claims each run
(only one replica wins a claim: :meth:`ScheduleBook.claim`) and hands the question to the
dispatcher as a message of the schedule's author, so the thread's kernel, restored
variables, queue, budgets and commands apply as to any message. The message id names the
schedule and the slot, so even a claim that somehow ran twice is answered once (the
dispatcher's duplicate check). A thread the platform says is gone disables its schedule.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from bot import metrics
from bot.budgets import Clock
from bot.events import InboundMessage, Outbox, ThreadReach
from bot.safetext import shown
from bot.schedules.when import When, WhenError
from bot.store import Schedule, ScheduleBook

log = logging.getLogger(__name__)

#: How often the store is asked for due runs (a run starts at most this late).
POLL_S = 10.0
#: Why a schedule stopped when its thread went away.
THREAD_GONE = "its thread is gone (deleted or archived)"

Handle = Callable[[InboundMessage, Outbox], Awaitable[None]]


def scheduled_message_id(schedule: Schedule, slot: float) -> str:
    """The id of the message a run of ``schedule`` at ``slot`` stands for (one per slot)."""
    return f"schedule-{schedule.id}-{int(slot)}"


class Scheduler:
    """Polls the store for due schedules and runs them through ``handle`` (the dispatcher's)."""

    def __init__(
        self,
        *,
        book: ScheduleBook,
        handle: Handle,
        reaches: Sequence[ThreadReach],
        clock: Clock = time.time,
        poll_s: float = POLL_S,
    ) -> None:
        self._book = book
        self._handle = handle
        self._reaches = reaches
        self._clock = clock
        self._poll_s = poll_s
        self._runs: set[asyncio.Task[None]] = set()
        self._unreachable: set[int] = set()  # logged once each
        self._polling: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Poll in the background until :meth:`stop`."""
        if self._polling is None:
            self._polling = asyncio.create_task(self._poll(), name="schedules")

    async def _poll(self) -> None:
        """Poll until cancelled; a failed poll is logged and the next one tries again."""
        while True:
            try:
                await self.tick()
            except Exception:
                log.exception("looking for due schedules failed")
            await asyncio.sleep(self._poll_s)

    async def tick(self) -> list[asyncio.Task[None]]:
        """Claim every due run this process can reach and start it; returns the runs started."""
        now = self._clock()
        started: list[asyncio.Task[None]] = []
        for schedule in await self._book.due(now, skip=self._unreachable):
            reach = self._reach(schedule)
            if reach is None:
                continue
            slot = schedule.next_run_at if schedule.next_run_at is not None else now
            try:
                next_run = When(schedule.cron, schedule.timezone, schedule.described).next_after(max(now, slot))
            except WhenError as exc:  # a zone that left the time zone database, say
                log.warning("schedule #%d of %s cannot run any more: %s", schedule.number, schedule.thread, exc)
                await self._book.disable(schedule.id, str(exc))
                continue
            if not await self._book.claim(schedule, now=now, next_run_at=next_run):
                continue  # another replica took this run
            task = asyncio.create_task(self._run(schedule, reach, slot), name=f"schedule-{schedule.id}")
            self._runs.add(task)
            task.add_done_callback(self._runs.discard)
            started.append(task)
        return started

    async def stop(self, grace_s: float) -> None:
        """Stop polling; give the runs under way ``grace_s`` to finish, then cancel what is
        left (each tells its thread, as any turn cut off by a stop does)."""
        if self._polling is not None:
            self._polling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._polling
            self._polling = None
        runs = set(self._runs)
        if not runs:
            return
        _, pending = await asyncio.wait(runs, timeout=grace_s)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _reach(self, schedule: Schedule) -> ThreadReach | None:
        """The adapter that reaches the schedule's thread; None (logged once) when none here does."""
        reach = next((r for r in self._reaches if r.outbox_for(schedule.thread) is not None), None)
        if reach is None and schedule.id not in self._unreachable:
            self._unreachable.add(schedule.id)
            log.info(
                "schedule #%d of %s is due, but no platform of this process reaches its thread",
                schedule.number,
                schedule.thread,
            )
        return reach

    async def _run(self, schedule: Schedule, reach: ThreadReach, slot: float) -> None:
        key = schedule.thread
        try:
            if not await reach.thread_open(key):
                log.warning("schedule #%d of %s disabled: %s", schedule.number, schedule.thread, THREAD_GONE)
                metrics.scheduled_run("thread_gone")
                await self._book.disable(schedule.id, THREAD_GONE)
                return
            outbox = reach.outbox_for(key)
            if outbox is None:
                raise LookupError("the platform no longer reaches the thread")
            await outbox.notify(
                f"⏰ Scheduled run #{schedule.number} ({schedule.described}, {schedule.timezone}): "
                f"“{shown(schedule.question)}”"
            )
        except Exception:
            log.exception("could not start scheduled run #%d of %s", schedule.number, schedule.thread)
            metrics.scheduled_run("failed")
            return
        metrics.scheduled_run("started")
        message = InboundMessage(
            key=key,
            message_id=scheduled_message_id(schedule, slot),
            user_id=schedule.creator,
            user_name=schedule.creator_name,
            text=schedule.question,
            scheduled=schedule.described,
        )
        log.info("scheduled run #%d of %s", schedule.number, schedule.thread)
        await self._handle(message, outbox)
