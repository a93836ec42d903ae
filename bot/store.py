"""The thread store: one implementation for SQLite (one bot process) and PostgreSQL (several
replicas), written with SQLAlchemy Core (run as :mod:`bot.database` says), its schema kept by
Alembic.

It keeps what a thread needs to survive a bot restart (its OpenAI-format message
history), what ``export`` needs to rebuild it as a notebook (executed cells with their
nbformat outputs, interleaved with the messages by one per-thread ``seq`` counter), the
platform message ids already handled (each message answered once, whichever replica got it),
token usage, and the turns queued or running (``turns_in_flight``).

The turns table is also how replicas share threads: each claimed message takes the next
ticket of its thread, and a turn starts only when no earlier ticket of its thread is left,
so a thread's turns run one at a time and in order across replicas. Every replica marks
itself alive in ``replicas`` every few seconds; the tickets of a replica silent past
``storage.replica_timeout_s`` are taken over and reported as interrupted. With SQLite the
store belongs to one bot process, so every other process's tickets are interrupted ones.

Migrations run at :meth:`Store.open` (under an advisory lock on PostgreSQL, so replicas
starting together migrate once); an SQLite file from before Alembic is upgraded in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from bot.database import Database, database_url, open_database
from bot.events import ThreadKey
from bot.migrations import legacy
from bot.schedules.book import ScheduleBook
from bot.schema import cells, feedback, messages, processed, replicas, threads, turns_in_flight, usage
from bot.transcript import CellEntry, MessageEntry, TimelineEntry, result_to_outputs
from kernels.result import ExecutionResult

__all__ = [
    "SCHEMA_VERSION",
    "CellEntry",
    "InterruptedTurn",
    "KernelOwner",
    "MessageEntry",
    "QueuedTurn",
    "Store",
    "StoreError",
    "TimelineEntry",
    "TurnCheck",
]

log = logging.getLogger(__name__)

_MIGRATIONS_DIR = Path(__file__).with_name("migrations")

#: The Alembic revision this code writes (the newest in ``bot/migrations/versions``).
SCHEMA_VERSION = "0005"

#: The ``role`` of stored notices: shown in the timeline, never replayed to the model.
NOTICE_ROLE = "notice"

#: Processed message ids older than this are forgotten (platforms retry within minutes).
_DEDUPE_KEEP_S = 7 * 24 * 3600.0
#: Prune the processed ids once every this many claims (and at open).
_PRUNE_EVERY = 1000
#: An interrupted turn nobody could be told about within this long is dropped: a notice
#: that late would only confuse (its platform was off, or a console thread never resumed).
_INTERRUPTED_KEEP_S = 7 * 24 * 3600.0
#: Rows of replicas gone this long are deleted.
_FORGET_REPLICA_S = 24 * 3600.0
#: Any number: the key of the PostgreSQL advisory lock held while migrating.
_MIGRATION_LOCK = 0x7468726561640001


class StoreError(Exception):
    """The database cannot be used by this version of the bot (the message says why)."""


@dataclass(frozen=True, slots=True)
class InterruptedTurn:
    """A turn a bot process began (or queued) and never ended: it was killed or crashed."""

    thread: str
    message_id: str
    started_at: float


@dataclass(frozen=True, slots=True)
class UsageRow:
    """Turns counted together: their group (a channel, a person; "" when not grouped), model,
    tokens, kernel seconds and number."""

    group: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    kernel_s: float
    turns: int

    @property
    def tokens(self) -> int:
        """Prompt and completion tokens together."""
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class FeedbackCounts:
    """How many 👍 and 👎 answers got."""

    good: int
    bad: int


@dataclass(frozen=True, slots=True)
class QueuedTurn:
    """A message's place in its thread's line of turns."""

    ticket: int
    #: Turns of the thread before this one, on any replica.
    ahead: int


@dataclass(frozen=True, slots=True)
class KernelOwner:
    """The replica whose kernel last held a thread's variables."""

    run: str
    #: Its kernel's id on a Jupyter gateway (None: a local kernel, or not known yet).
    remote_id: str | None
    #: That replica is gone (killed, crashed): its gateway kernel has nobody driving it.
    gone: bool


@dataclass(frozen=True, slots=True)
class TurnCheck:
    """Whether a queued turn may start now, and the turns ahead of it found interrupted."""

    ready: bool
    interrupted: tuple[InterruptedTurn, ...] = ()


class Store:
    """The async store; open with :meth:`open` (or ``async with await Store.open(url)``)."""

    def __init__(self, db: Database, *, replica_timeout_s: float) -> None:
        self._db = db
        self._timeout_s = replica_timeout_s
        self._claims = 0
        #: This process among the replicas; marks the turns it queues.
        self._run = uuid.uuid4().hex
        self._heartbeat: asyncio.Task[None] | None = None
        self._insert = postgresql.insert if db.dialect == "postgresql" else sqlite.insert
        #: Scheduled analyses (``schedule`` in a thread).
        self.schedules = ScheduleBook(db)

    @classmethod
    async def open(cls, target: Path | str, *, replica_timeout_s: float = 15.0) -> Store:
        """Open the database at ``target`` (a path or URL; an SQLite file and its folders are
        created), migrate it to :data:`SCHEMA_VERSION` and register this process as a replica."""
        try:
            url = database_url(target)
        except ValueError as exc:
            raise StoreError(f"storage.url: {exc}") from None
        db = await open_database(url)
        store = cls(db, replica_timeout_s=replica_timeout_s)
        try:
            await db.write(_migrate)
            await store._register()
            await store._prune_processed()
        except (SQLAlchemyError, OSError) as exc:
            await db.close()
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StoreError(f"cannot open the store {db.shown}: {reason}") from None
        except BaseException:
            await db.close()
            raise
        store._heartbeat = asyncio.create_task(store._beat(), name="store-heartbeat")
        return store

    @property
    def shared(self) -> bool:
        """True when several bot processes may share this database (PostgreSQL)."""
        return self._db.dialect != "sqlite"

    @property
    def run(self) -> str:
        """The id of this process among the replicas."""
        return self._run

    async def close(self) -> None:
        """Leave the replicas (the tickets still held are left for others to report) and close."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
        try:
            await self._db.write(lambda conn: conn.execute(sa.delete(replicas).where(replicas.c.run == self._run)))
        except SQLAlchemyError as exc:
            log.warning("could not sign this replica off: %s", exc)
        await self._db.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def schema_version(self) -> str:
        """The Alembic revision of the open database."""
        return str(await self._db.read(lambda conn: MigrationContext.configure(conn).get_current_revision()))

    async def claim_message(self, message_id: str) -> bool:
        """Record a platform message id; True the first time, False for a duplicate (on any replica)."""
        statement = (
            self._insert(processed)
            .values(message_id=message_id, at=time.time())
            .on_conflict_do_nothing(index_elements=[processed.c.message_id])
            .returning(processed.c.message_id)
        )
        first = await self._db.write(lambda conn: conn.execute(statement).first() is not None)
        self._claims += 1
        if self._claims % _PRUNE_EVERY == 0:
            await self._prune_processed()
        return first

    async def touch_thread(self, key: str, channel_key: str) -> None:
        """Create the thread if new and mark it active now."""
        now = time.time()
        insert = self._insert(threads).values(key=key, channel_key=channel_key, created_at=now, last_active_at=now)
        statement = insert.on_conflict_do_update(
            index_elements=[threads.c.key],
            set_={"channel_key": insert.excluded.channel_key, "last_active_at": insert.excluded.last_active_at},
        )
        await self._db.write(lambda conn: conn.execute(statement))

    async def thread_exists(self, key: str) -> bool:
        """True when the thread has been seen before (touched or written to)."""
        statement = sa.select(threads.c.key).where(threads.c.key == key)
        return await self._db.read(lambda conn: conn.execute(statement).first() is not None)

    async def add_messages(self, key: str, messages_: Sequence[dict[str, Any]], *, user_id: str | None = None) -> None:
        """Append OpenAI-format messages (in order, in one transaction)."""
        if not messages_:
            return
        now = time.time()
        rows = [
            {
                "role": str(m.get("role", "")),
                "content": json.dumps(m),
                "user_id": user_id,
                "created_at": now,
                "thread": key,
            }
            for m in messages_
        ]

        def write(conn: Connection) -> None:
            first = self._reserve_seq(conn, key, len(rows), now)
            conn.execute(sa.insert(messages), [{**row, "seq": first + i} for i, row in enumerate(rows)])

        await self._db.write(write)

    async def history(self, key: str) -> list[dict[str, Any]]:
        """The thread's OpenAI-format messages, oldest first (notices left out)."""
        statement = (
            sa.select(messages.c.content)
            .where(messages.c.thread == key, messages.c.role != NOTICE_ROLE)
            .order_by(messages.c.seq)
        )
        rows = await self._db.read(lambda conn: conn.execute(statement).scalars().all())
        return [json.loads(content) for content in rows]

    async def add_cell(self, key: str, code: str, result: ExecutionResult) -> None:
        """Record an executed cell with its outputs converted to nbformat v4."""
        now = time.time()
        row = {
            "thread": key,
            "code": code,
            "outputs": json.dumps(result_to_outputs(result)),
            "execution_count": result.execution_count,
            "outcome": result.outcome.value,
            "duration_s": result.duration_s,
            "created_at": now,
        }

        def write(conn: Connection) -> None:
            conn.execute(sa.insert(cells).values(**row, seq=self._reserve_seq(conn, key, 1, now)))

        await self._db.write(write)

    async def cell_count(self, key: str) -> int:
        """How many cells the thread has executed."""
        statement = sa.select(sa.func.count()).select_from(cells).where(cells.c.thread == key)
        count: int | None = await self._db.read(lambda conn: conn.scalar(statement))
        return int(count or 0)

    async def begin_usage(self, key: str, *, model: str, user_id: str | None, at: float | None = None) -> int:
        """Start counting a turn of ``user_id`` in thread ``key`` (it counts for the per-minute
        budget from now); returns its row for :meth:`add_usage`."""
        statement = (
            sa.insert(usage)
            .values(
                thread=key,
                channel_key=_channel_key_of(key),
                user_id=user_id,
                model=model,
                prompt_tokens=0,
                completion_tokens=0,
                kernel_s=0.0,
                at=time.time() if at is None else at,
            )
            .returning(usage.c.id)
        )
        return int(await self._db.write(lambda conn: conn.execute(statement).scalar_one()))

    async def add_usage(self, row: int, *, prompt_tokens: int, completion_tokens: int, kernel_s: float = 0.0) -> None:
        """Add tokens and kernel seconds to the turn counted by ``row``."""
        statement = (
            sa.update(usage)
            .where(usage.c.id == row)
            .values(
                prompt_tokens=usage.c.prompt_tokens + prompt_tokens,
                completion_tokens=usage.c.completion_tokens + completion_tokens,
                kernel_s=usage.c.kernel_s + kernel_s,
            )
        )
        await self._db.write(lambda conn: conn.execute(statement))

    async def spent(
        self, *, since: float, user_id: str | None = None, channel_key: str | None = None, thread: str | None = None
    ) -> list[UsageRow]:
        """Turns since ``since`` (of a person, a channel or a thread when given), per model."""
        statement = _usage_totals(usage.c.model).where(usage.c.at >= since)
        for column, value in ((usage.c.user_id, user_id), (usage.c.channel_key, channel_key), (usage.c.thread, thread)):
            if value is not None:
                statement = statement.where(column == value)
        rows = await self._db.read(lambda conn: conn.execute(statement).all())
        return [UsageRow("", *row) for row in rows]

    async def turn_times(self, *, user_id: str, since: float) -> list[float]:
        """When ``user_id``'s turns since ``since`` started."""
        statement = sa.select(usage.c.at).where(usage.c.user_id == user_id, usage.c.at >= since)
        return [float(at) for at in await self._db.read(lambda conn: conn.execute(statement).scalars().all())]

    async def usage_report(self, *, since: float, by: Literal["channel_key", "user_id"]) -> list[UsageRow]:
        """Turns since ``since`` per channel or per person (``by``), and per model."""
        group = usage.c[by]
        statement = _usage_totals(group, usage.c.model).where(usage.c.at >= since)
        rows = await self._db.read(lambda conn: conn.execute(statement).all())
        return [UsageRow(str(row[0] or "?"), *row[1:]) for row in rows]

    async def usage(self, key: str) -> tuple[int, int]:
        """Total (prompt, completion) tokens used by the thread."""
        statement = sa.select(
            sa.func.coalesce(sa.func.sum(usage.c.prompt_tokens), 0),
            sa.func.coalesce(sa.func.sum(usage.c.completion_tokens), 0),
        ).where(usage.c.thread == key)
        row = await self._db.read(lambda conn: conn.execute(statement).first())
        return (int(row[0]), int(row[1])) if row else (0, 0)

    async def add_feedback(self, key: str, turn_id: str, user_id: str, *, good: bool) -> None:
        """Record a 👍 (``good``) or 👎 on the answer to ``turn_id``; a person's later click replaces theirs."""
        insert = self._insert(feedback).values(thread=key, turn_id=turn_id, user_id=user_id, good=good, at=time.time())
        statement = insert.on_conflict_do_update(
            index_elements=[feedback.c.thread, feedback.c.turn_id, feedback.c.user_id],
            set_={"good": insert.excluded.good, "at": insert.excluded.at},
        )
        await self._db.write(lambda conn: conn.execute(statement))

    async def feedback_counts(self, key: str | None = None, *, since: float | None = None) -> FeedbackCounts:
        """👍 and 👎 on the thread's answers (every thread's when ``key`` is None), clicked
        since ``since`` when given."""
        good = sa.func.coalesce(sa.func.sum(sa.case((feedback.c.good, 1), else_=0)), 0)
        bad = sa.func.coalesce(sa.func.sum(sa.case((feedback.c.good, 0), else_=1)), 0)
        statement = sa.select(good, bad).select_from(feedback)
        if key is not None:
            statement = statement.where(feedback.c.thread == key)
        if since is not None:
            statement = statement.where(feedback.c.at >= since)
        row = await self._db.read(lambda conn: conn.execute(statement).first())
        return FeedbackCounts(int(row[0]), int(row[1])) if row else FeedbackCounts(0, 0)

    async def timeline(self, key: str) -> list[TimelineEntry]:
        """Messages and cells of the thread interleaved in the order they were written."""

        def read(conn: Connection) -> list[TimelineEntry]:
            entries: list[TimelineEntry] = [
                MessageEntry(seq, json.loads(content), user_id, created)
                for seq, content, user_id, created in conn.execute(
                    sa.select(messages.c.seq, messages.c.content, messages.c.user_id, messages.c.created_at).where(
                        messages.c.thread == key
                    )
                )
            ]
            entries += [
                CellEntry(seq, code, json.loads(outputs), count, outcome, duration, created)
                for seq, code, outputs, count, outcome, duration, created in conn.execute(
                    sa.select(
                        cells.c.seq,
                        cells.c.code,
                        cells.c.outputs,
                        cells.c.execution_count,
                        cells.c.outcome,
                        cells.c.duration_s,
                        cells.c.created_at,
                    ).where(cells.c.thread == key)
                )
            ]
            return entries

        return sorted(await self._db.read(read), key=lambda entry: entry.seq)

    async def begin_turn(self, key: str, message_id: str) -> QueuedTurn:
        """Queue the turn for ``message_id`` in thread ``key`` (until :meth:`end_turn`): it takes
        the thread's next ticket. The thread's row is locked while the ticket is taken, so tickets
        are handed out in the order the transactions commit, on every replica."""
        now = time.time()
        take = (
            sa.update(threads)
            .where(threads.c.key == key)
            .values(last_ticket=threads.c.last_ticket + 1, last_active_at=now)
            .returning(threads.c.last_ticket)
        )

        def write(conn: Connection) -> QueuedTurn:
            ticket = conn.execute(take).scalar()
            if ticket is None:  # a new thread
                self._ensure_thread(conn, key, now)
                ticket = conn.execute(take).scalar_one()
            row = {"run": self._run, "started_at": now, "ticket": int(ticket)}
            conn.execute(
                self._insert(turns_in_flight)
                .values(thread=key, message_id=message_id, **row)
                .on_conflict_do_update(
                    index_elements=[turns_in_flight.c.thread, turns_in_flight.c.message_id], set_=row
                )
            )
            ahead = conn.scalar(
                sa.select(sa.func.count())
                .select_from(turns_in_flight)
                .where(turns_in_flight.c.thread == key, turns_in_flight.c.ticket < ticket)
            )
            return QueuedTurn(int(ticket), int(ahead or 0))

        return await self._db.write(write)

    async def check_turn(self, key: str, ticket: int) -> TurnCheck:
        """May the turn holding ``ticket`` start? It may once no earlier ticket of its thread is
        left. Earlier tickets of replicas that are gone are taken (and returned) on the way."""
        earlier = sa.and_(turns_in_flight.c.thread == key, turns_in_flight.c.ticket < ticket)

        def write(conn: Connection) -> TurnCheck:
            taken = self._take(conn, earlier)
            waiting = conn.scalar(sa.select(sa.func.count()).select_from(turns_in_flight).where(earlier))
            return TurnCheck(ready=not waiting, interrupted=tuple(taken))

        return await self._db.write(write)

    async def end_turn(self, key: str, message_id: str) -> None:
        """Clear the mark of :meth:`begin_turn` (the turn ended, or its thread was told it did not)."""
        statement = sa.delete(turns_in_flight).where(
            turns_in_flight.c.thread == key, turns_in_flight.c.message_id == message_id
        )
        await self._db.write(lambda conn: conn.execute(statement))

    async def request_stop(self, key: str) -> bool:
        """Ask the replica running thread ``key``'s turn to stop it; False when none runs."""
        head = sa.select(sa.func.min(turns_in_flight.c.ticket)).where(turns_in_flight.c.thread == key).scalar_subquery()
        statement = (
            sa.update(turns_in_flight)
            .where(turns_in_flight.c.thread == key, turns_in_flight.c.ticket == head)
            .values(stop_requested=True)
            .returning(turns_in_flight.c.message_id)
        )
        return await self._db.write(lambda conn: conn.execute(statement).first() is not None)

    async def stop_requested(self, key: str, message_id: str) -> bool:
        """Whether Stop was pressed (on any replica) for the turn of ``message_id``."""
        statement = sa.select(turns_in_flight.c.stop_requested).where(
            turns_in_flight.c.thread == key, turns_in_flight.c.message_id == message_id
        )
        return bool(await self._db.read(lambda conn: conn.scalar(statement)))

    async def take_interrupted_turns(self, reachable: Callable[[str], bool] | None = None) -> list[InterruptedTurn]:
        """Remove and return the turns of bot processes that are gone, oldest first.

        Only turns whose thread key ``reachable`` accepts are taken (all when it is None); the
        rest stay for a later start, e.g. when their platform is not enabled now. Turns of live
        replicas (this one included) are never taken. Leftovers older than seven days are
        dropped unreported. Selecting and deleting happen in one transaction, so each turn is
        returned once, even to two replicas sweeping at once.
        """

        def write(conn: Connection) -> list[InterruptedTurn]:
            stale = time.time() - _INTERRUPTED_KEEP_S
            conn.execute(sa.delete(turns_in_flight).where(self._gone(), turns_in_flight.c.started_at < stale))
            rows = conn.execute(
                sa.select(turns_in_flight.c.thread, turns_in_flight.c.message_id)
                .where(self._gone())
                .order_by(turns_in_flight.c.started_at)
                .with_for_update(skip_locked=True)
            ).all()
            taken: list[InterruptedTurn] = []
            for thread, message_id in rows:
                if reachable is not None and not reachable(str(thread)):
                    continue
                started = conn.execute(
                    sa.delete(turns_in_flight)
                    .where(turns_in_flight.c.thread == thread, turns_in_flight.c.message_id == message_id)
                    .returning(turns_in_flight.c.started_at)
                ).scalar()
                if started is not None:
                    taken.append(InterruptedTurn(str(thread), str(message_id), float(started)))
            return taken

        return await self._db.write(write)

    async def claim_kernel(self, key: str) -> KernelOwner | None:
        """Record that this replica's kernel now holds thread ``key``'s variables; returns the
        owner before (None when none was recorded)."""

        def write(conn: Connection) -> KernelOwner | None:
            row = conn.execute(
                sa.select(threads.c.kernel_run, threads.c.kernel_id).where(threads.c.key == key).with_for_update()
            ).first()
            before = None
            if row is not None and row.kernel_run is not None:
                if self.shared:
                    alive = conn.scalar(
                        sa.select(sa.func.count())
                        .select_from(replicas)
                        .where(replicas.c.run == row.kernel_run, replicas.c.seen_at >= time.time() - self._timeout_s)
                    )
                    gone = not alive
                else:
                    gone = row.kernel_run != self._run  # SQLite: one bot process at a time
                before = KernelOwner(str(row.kernel_run), row.kernel_id, gone)
            if before is None or before.run != self._run:
                conn.execute(
                    sa.update(threads).where(threads.c.key == key).values(kernel_run=self._run, kernel_id=None)
                )
            return before

        return await self._db.write(write)

    async def record_kernel(self, key: str, remote_id: str | None) -> None:
        """Record the gateway id of the kernel this replica holds thread ``key``'s variables in."""
        statement = (
            sa.update(threads)
            .where(threads.c.key == key, threads.c.kernel_run == self._run)
            .values(kernel_id=remote_id)
        )
        await self._db.write(lambda conn: conn.execute(statement))

    async def live_replicas(self) -> list[str]:
        """The runs of the replicas that showed signs of life within the timeout, this one included."""
        statement = (
            sa.select(replicas.c.run)
            .where(replicas.c.seen_at >= time.time() - self._timeout_s)
            .order_by(replicas.c.run)
        )
        return [str(run) for run in await self._db.read(lambda conn: conn.execute(statement).scalars().all())]

    def _gone(self) -> sa.ColumnElement[bool]:
        """Rows of ``turns_in_flight`` whose replica is gone."""
        if not self.shared:
            return turns_in_flight.c.run != self._run  # SQLite: one bot process at a time
        live = sa.select(replicas.c.run).where(replicas.c.seen_at >= time.time() - self._timeout_s)
        return sa.and_(turns_in_flight.c.run != self._run, turns_in_flight.c.run.not_in(live))

    def _take(self, conn: Connection, where: sa.ColumnElement[bool]) -> list[InterruptedTurn]:
        gone = conn.execute(
            sa.delete(turns_in_flight)
            .where(where, self._gone())
            .returning(turns_in_flight.c.thread, turns_in_flight.c.message_id, turns_in_flight.c.started_at)
        )
        return sorted((InterruptedTurn(str(t), str(m), float(s)) for t, m, s in gone), key=lambda turn: turn.started_at)

    def _ensure_thread(self, conn: Connection, key: str, now: float) -> None:
        conn.execute(
            self._insert(threads)
            .values(key=key, channel_key=_channel_key_of(key), created_at=now, last_active_at=now)
            .on_conflict_do_nothing(index_elements=[threads.c.key])
        )

    def _reserve_seq(self, conn: Connection, key: str, count: int, now: float) -> int:
        """Take ``count`` consecutive seq numbers of the thread (creating it); returns the first."""
        take = (
            sa.update(threads)
            .where(threads.c.key == key)
            .values(last_seq=threads.c.last_seq + count, last_active_at=now)
            .returning(threads.c.last_seq)
        )
        last = conn.execute(take).scalar()
        if last is None:  # a new thread
            self._ensure_thread(conn, key, now)
            last = conn.execute(take).scalar_one()
        return int(last) - count + 1

    async def _register(self) -> None:
        now = time.time()

        def write(conn: Connection) -> None:
            conn.execute(sa.delete(replicas).where(replicas.c.seen_at < now - _FORGET_REPLICA_S))
            conn.execute(
                sa.insert(replicas).values(run=self._run, host=socket.gethostname(), started_at=now, seen_at=now)
            )

        await self._db.write(write)

    async def _beat(self) -> None:
        """Mark this replica alive every third of the timeout, for as long as the store is open."""

        def write(conn: Connection) -> None:
            now = time.time()
            seen = conn.execute(sa.update(replicas).where(replicas.c.run == self._run).values(seen_at=now))
            if seen.rowcount == 0:  # deleted as long gone (the database was out of reach for a day)
                conn.execute(
                    sa.insert(replicas).values(run=self._run, host=socket.gethostname(), started_at=now, seen_at=now)
                )

        while True:
            await asyncio.sleep(self._timeout_s / 3)
            try:
                await self._db.write(write)
            except (SQLAlchemyError, OSError) as exc:
                log.warning("could not mark this replica alive: %s", exc)

    async def _prune_processed(self) -> None:
        statement = sa.delete(processed).where(processed.c.at < time.time() - _DEDUPE_KEEP_S)
        await self._db.write(lambda conn: conn.execute(statement))


def _migrate(conn: Connection) -> None:
    """Bring the database to :data:`SCHEMA_VERSION` (in the caller's transaction)."""
    if conn.dialect.name == "postgresql":
        # Replicas starting together: one migrates, the others wait here, then find nothing to do.
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
    elif not sa.inspect(conn).has_table("alembic_version"):
        _upgrade_legacy_sqlite(conn)
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS_DIR))
    config.attributes["connection"] = conn
    current = MigrationContext.configure(conn).get_current_revision()
    known = {script.revision for script in ScriptDirectory.from_config(config).walk_revisions()}
    if current is not None and current not in known:
        raise StoreError(
            f"the database has schema revision {current}, which this bot does not know (it knows up to "
            f"{SCHEMA_VERSION}): run a newer Threadbook, or a database of its own"
        )
    command.upgrade(config, "head")


def _upgrade_legacy_sqlite(conn: Connection) -> None:
    """An SQLite file from before Alembic (``PRAGMA user_version`` 1–3): finish its old
    migrations, then stamp it with revision ``0001``, which is that schema."""
    version = int(conn.exec_driver_sql("PRAGMA user_version").scalar() or 0)
    if version == 0:
        return  # a new file
    if version > legacy.LAST_VERSION:
        raise StoreError(f"the database has schema version {version}, newer than this bot knows")
    for statements in legacy.MIGRATIONS[version:]:
        for statement in statements:
            conn.exec_driver_sql(statement)
    conn.exec_driver_sql("PRAGMA user_version = 0")  # Alembic's table is the version from now on
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS_DIR))
    config.attributes["connection"] = conn
    command.stamp(config, "0001")
    log.info("upgraded the store from its pre-Alembic schema version %d", version)


def _usage_totals(*groups: sa.ColumnElement[Any]) -> sa.Select[Any]:
    """Sums of the usage columns, grouped by ``groups`` (which come first in each row)."""
    return sa.select(
        *groups,
        sa.func.coalesce(sa.func.sum(usage.c.prompt_tokens), 0),
        sa.func.coalesce(sa.func.sum(usage.c.completion_tokens), 0),
        sa.func.coalesce(sa.func.sum(usage.c.kernel_s), 0.0),
        sa.func.count(),
    ).group_by(*groups)


def _channel_key_of(key: str) -> str:
    """``platform:channel`` of a thread key string; empty when the key is not a ThreadKey."""
    try:
        return ThreadKey.parse(key).channel_key
    except ValueError:
        return ""
