"""The turns queued or running (``turns_in_flight``), and how replicas share a thread.

Each claimed message takes the next ticket of its thread, and a turn starts only when no
earlier ticket of its thread is left, so a thread's turns run one at a time and in order
across replicas. The tickets of a gone replica (:mod:`bot.store.replicas`) are taken over
and reported as interrupted.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from bot.database import Database, upsert
from bot.events import ThreadKey
from bot.schema import threads, turns_in_flight
from bot.store.replicas import Replicas
from bot.store.threads import take_counter

log = logging.getLogger(__name__)

#: An interrupted turn nobody could be told about within this long is dropped: a notice
#: that late would only confuse (its platform was off, or a console thread never resumed).
_INTERRUPTED_KEEP_S = 7 * 24 * 3600.0

#: ``turns_in_flight.thread`` as the text it holds: a row whose key does not read (None through
#: the column's type) is still found, logged and deleted by it.
_STORED_THREAD = sa.type_coerce(turns_in_flight.c.thread, sa.Text)


@dataclass(frozen=True, slots=True)
class InterruptedTurn:
    """A turn a bot process began (or queued) and never ended: it was killed or crashed."""

    thread: ThreadKey
    message_id: str
    started_at: float


@dataclass(frozen=True, slots=True)
class QueuedTurn:
    """A message's place in its thread's line of turns."""

    ticket: int
    #: Turns of the thread before this one, on any replica.
    ahead: int


@dataclass(frozen=True, slots=True)
class TurnCheck:
    """Whether a queued turn may start now, and the turns ahead of it found interrupted."""

    ready: bool
    interrupted: tuple[InterruptedTurn, ...] = ()


class TurnQueue:
    """Each thread's line of turns, shared by the replicas."""

    def __init__(self, db: Database, replicas: Replicas) -> None:
        self._db = db
        self._replicas = replicas

    async def begin(self, key: ThreadKey, message_id: str) -> QueuedTurn:
        """Queue the turn for ``message_id`` in thread ``key`` (until :meth:`end`): it takes
        the thread's next ticket. The thread's row is locked while the ticket is taken, so tickets
        are handed out in the order the transactions commit, on every replica."""
        now = time.time()

        def write(conn: Connection) -> QueuedTurn:
            ticket = take_counter(self._db, conn, key, threads.c.last_ticket, 1, now)
            values = {"b_thread": key, "b_message": message_id, "b_run": self._replicas.run, "b_now": now}
            conn.execute(_queue_statement(self._db.dialect), {**values, "b_ticket": ticket})
            ahead = conn.scalar(_AHEAD, {"b_thread": key, "b_ticket": ticket})
            return QueuedTurn(ticket, int(ahead or 0))

        return await self._db.write(write)

    async def check(self, key: ThreadKey, ticket: int) -> TurnCheck:
        """May the turn holding ``ticket`` start? It may once no earlier ticket of its thread is
        left. Earlier tickets of replicas that are gone are taken (and returned) on the way."""
        earlier = sa.and_(turns_in_flight.c.thread == key, turns_in_flight.c.ticket < ticket)

        def write(conn: Connection) -> TurnCheck:
            gone = conn.execute(
                sa.delete(turns_in_flight)
                .where(earlier, self._gone())
                .returning(turns_in_flight.c.thread, turns_in_flight.c.message_id, turns_in_flight.c.started_at)
            )
            taken = sorted((InterruptedTurn(key, str(m), float(s)) for _, m, s in gone), key=lambda t: t.started_at)
            waiting = conn.scalar(sa.select(sa.func.count()).select_from(turns_in_flight).where(earlier))
            return TurnCheck(ready=not waiting, interrupted=tuple(taken))

        return await self._db.write(write)

    async def end(self, key: ThreadKey, message_id: str) -> None:
        """Clear the mark of :meth:`begin` (the turn ended, or its thread was told it did not)."""
        statement = sa.delete(turns_in_flight).where(
            turns_in_flight.c.thread == key, turns_in_flight.c.message_id == message_id
        )
        await self._db.write(lambda conn: conn.execute(statement))

    async def request_stop(self, key: ThreadKey) -> bool:
        """Ask the replica running thread ``key``'s turn to stop it; False when none runs."""
        head = sa.select(sa.func.min(turns_in_flight.c.ticket)).where(turns_in_flight.c.thread == key).scalar_subquery()
        statement = (
            sa.update(turns_in_flight)
            .where(turns_in_flight.c.thread == key, turns_in_flight.c.ticket == head)
            .values(stop_requested=True)
            .returning(turns_in_flight.c.message_id)
        )
        return await self._db.write(lambda conn: conn.execute(statement).first() is not None)

    async def stop_requested(self, key: ThreadKey, message_id: str) -> bool:
        """Whether Stop was pressed (on any replica) for the turn of ``message_id``."""
        statement = sa.select(turns_in_flight.c.stop_requested).where(
            turns_in_flight.c.thread == key, turns_in_flight.c.message_id == message_id
        )
        return bool(await self._db.read(lambda conn: conn.scalar(statement)))

    async def take_interrupted(self, reachable: Callable[[ThreadKey], bool] | None = None) -> list[InterruptedTurn]:
        """Remove and return the turns of bot processes that are gone, oldest first.

        Only turns whose thread ``reachable`` accepts are taken (all when it is None); the rest
        stay for a later start, e.g. when their platform is not enabled now. Turns of live
        replicas (this one included) are never taken. Leftovers older than seven days, and rows
        whose thread key does not parse, are dropped unreported. Selecting and deleting happen
        in one transaction, so each turn is returned once, even to two replicas sweeping at once.
        """

        def write(conn: Connection) -> list[InterruptedTurn]:
            stale = time.time() - _INTERRUPTED_KEEP_S
            conn.execute(sa.delete(turns_in_flight).where(self._gone(), turns_in_flight.c.started_at < stale))
            rows = conn.execute(
                sa.select(turns_in_flight.c.thread, _STORED_THREAD, turns_in_flight.c.message_id)
                .where(self._gone())
                .order_by(turns_in_flight.c.started_at)
                .with_for_update(skip_locked=True)
            ).all()
            taken: list[InterruptedTurn] = []
            for key, stored, message_id in rows:
                if key is None:
                    log.warning("dropped an interrupted turn with a bad thread key %r", stored)
                elif reachable is not None and not reachable(key):
                    continue
                started = conn.execute(
                    sa.delete(turns_in_flight)
                    .where(_STORED_THREAD == stored, turns_in_flight.c.message_id == message_id)
                    .returning(turns_in_flight.c.started_at)
                ).scalar()
                if started is not None and key is not None:
                    taken.append(InterruptedTurn(key, str(message_id), float(started)))
            return taken

        return await self._db.write(write)

    def _gone(self) -> sa.ColumnElement[bool]:
        """Rows of ``turns_in_flight`` whose replica is gone."""
        return self._replicas.gone(turns_in_flight.c.run)


# Every turn runs these: built once (see bot.database).
_THREAD = sa.bindparam("b_thread", type_=turns_in_flight.c.thread.type)
_TICKET = sa.bindparam("b_ticket", type_=sa.Integer)
#: How many turns of ``b_thread`` hold a ticket before ``b_ticket``.
_AHEAD = (
    sa.select(sa.func.count())
    .select_from(turns_in_flight)
    .where(turns_in_flight.c.thread == _THREAD, turns_in_flight.c.ticket < _TICKET)
)


@functools.cache
def _queue_statement(dialect: str) -> sa.Insert:
    """Put message ``b_message`` of ``b_thread`` in line with ``b_ticket`` (again, if it was)."""
    insert = upsert(dialect, turns_in_flight)
    row = {
        "run": sa.bindparam("b_run", type_=sa.Text),
        "started_at": sa.bindparam("b_now", type_=sa.Float),
        "ticket": _TICKET,
    }
    return insert.values(
        thread=_THREAD, message_id=sa.bindparam("b_message", type_=sa.Text), **row
    ).on_conflict_do_update(index_elements=[turns_in_flight.c.thread, turns_in_flight.c.message_id], set_=row)
