"""The schedules in the store (``Store.schedules``): added, listed, removed, and claimed when due.

A due run is claimed by moving its ``next_run_at`` on in one conditional update (only if it
still holds the value read), so of several replicas polling the same database exactly one
runs each slot. The next run is counted from the moment of the claim: a bot that was down
over several slots runs the question once when it is back, not once per missed slot.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row

from bot.database import Database
from bot.events import ThreadKey
from bot.schema import schedules

log = logging.getLogger(__name__)

#: Why a schedule whose stored thread key does not read is disabled.
UNREADABLE_THREAD = "its thread key does not read"


@dataclass(frozen=True, slots=True)
class Schedule:
    """One stored schedule."""

    id: int
    thread: ThreadKey
    number: int
    creator: str
    creator_name: str
    question: str
    cron: str
    timezone: str
    described: str
    created_at: float
    #: None once disabled.
    next_run_at: float | None
    last_run_at: float | None
    disabled_reason: str | None

    @property
    def enabled(self) -> bool:
        """Whether it still runs."""
        return self.disabled_reason is None


@dataclass(frozen=True, slots=True)
class NewSchedule:
    """What ``schedule`` asks to store."""

    thread: ThreadKey
    creator: str
    creator_name: str
    question: str
    cron: str
    timezone: str
    described: str
    created_at: float
    next_run_at: float


class TooManySchedules(Exception):
    """The thread holds the most schedules it may."""


def _schedule(row: Row[tuple[object, ...]]) -> Schedule:
    return Schedule(**dict(row._mapping))


class ScheduleBook:
    """Schedules, in the store's database."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def add(self, new: NewSchedule, *, max_per_thread: int) -> Schedule:
        """Store ``new`` under the thread's next number; :class:`TooManySchedules` when the
        thread already holds ``max_per_thread`` schedules that run."""

        def write(conn: Connection) -> Schedule:
            of_thread = sa.select(sa.func.count()).select_from(schedules).where(schedules.c.thread == new.thread)
            running = conn.scalar(of_thread.where(schedules.c.disabled_reason.is_(None))) or 0
            if running >= max_per_thread:
                raise TooManySchedules
            last = conn.scalar(sa.select(sa.func.max(schedules.c.number)).where(schedules.c.thread == new.thread))
            statement = sa.insert(schedules).values(number=(last or 0) + 1, **_fields(new)).returning(*schedules.c)
            return _schedule(conn.execute(statement).one())

        return await self._db.write(write)

    async def of_thread(self, thread: ThreadKey) -> list[Schedule]:
        """The thread's schedules, by number."""
        statement = sa.select(schedules).where(schedules.c.thread == thread).order_by(schedules.c.number)
        return await self._db.read(lambda conn: [_schedule(row) for row in conn.execute(statement)])

    async def remove(self, thread: ThreadKey, number: int) -> bool:
        """Delete schedule ``number`` of ``thread``; False when there is none."""
        statement = sa.delete(schedules).where(schedules.c.thread == thread, schedules.c.number == number)
        return await self._db.write(lambda conn: conn.execute(statement).rowcount > 0)

    async def due(self, now: float, *, skip: Collection[int] = (), limit: int = 50) -> list[Schedule]:
        """Enabled schedules whose next run is at or before ``now``, oldest first (``skip``: ids left out)."""
        statement = (
            sa.select(schedules)
            .where(schedules.c.next_run_at <= now, schedules.c.disabled_reason.is_(None))
            .order_by(schedules.c.next_run_at)
            .limit(limit)
        )
        if skip:
            statement = statement.where(schedules.c.id.not_in(list(skip)))
        rows = await self._db.read(lambda conn: conn.execute(statement).all())
        for row in rows:
            if row.thread is None:  # a thread key that does not read: no thread to run it in
                log.warning("schedule #%d (id %d) disabled: its thread key does not read", row.number, row.id)
                await self.disable(row.id, UNREADABLE_THREAD)
        return [_schedule(row) for row in rows if row.thread is not None]

    async def claim(self, schedule: Schedule, *, now: float, next_run_at: float) -> bool:
        """Take ``schedule``'s due run (as read by :meth:`due`): True for exactly one caller."""
        statement = (
            sa.update(schedules)
            .where(
                schedules.c.id == schedule.id,
                schedules.c.next_run_at == schedule.next_run_at,
                schedules.c.disabled_reason.is_(None),
            )
            .values(next_run_at=next_run_at, last_run_at=now)
        )
        return await self._db.write(lambda conn: conn.execute(statement).rowcount == 1)

    async def disable(self, schedule_id: int, reason: str) -> None:
        """Stop running a schedule (it stays listed, with ``reason``)."""
        statement = (
            sa.update(schedules).where(schedules.c.id == schedule_id).values(disabled_reason=reason, next_run_at=None)
        )
        await self._db.write(lambda conn: conn.execute(statement))


def _fields(new: NewSchedule) -> dict[str, object]:
    fields = {name: getattr(new, name) for name in NewSchedule.__dataclass_fields__}
    return fields
