"""The thread store: one implementation for SQLite (one bot process) and PostgreSQL (several
replicas), through SQLAlchemy's async engine (aiosqlite, asyncpg), its schema kept by Alembic.

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
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from bot.events import ThreadKey
from bot.migrations import legacy
from bot.notebook import CellEntry, MessageEntry, TimelineEntry, result_to_outputs
from bot.schema import cells, messages, processed, replicas, threads, turns_in_flight, usage
from kernels.result import ExecutionResult

__all__ = [
    "SCHEMA_VERSION", "CellEntry", "InterruptedTurn", "KernelOwner", "MessageEntry", "QueuedTurn", "Store", "StoreError",
    "TimelineEntry", "TurnCheck",
]  # fmt: skip

log = logging.getLogger(__name__)

_MIGRATIONS_DIR = Path(__file__).with_name("migrations")

#: The Alembic revision this code writes (the newest in ``bot/migrations/versions``).
SCHEMA_VERSION = "0002"

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


def database_url(target: Path | str) -> URL:
    """The SQLAlchemy async URL of ``target``: a file path, ``sqlite:///…`` or ``postgresql://…``."""
    if isinstance(target, Path) or "://" not in target:
        return URL.create("sqlite+aiosqlite", database=str(target))
    url = make_url(target)
    backend = url.get_backend_name()
    if backend == "sqlite":
        return url.set(drivername="sqlite+aiosqlite")
    if backend in ("postgresql", "postgres"):
        query = dict(url.query)
        if "sslmode" in query:  # libpq's name; asyncpg takes the same values as ``ssl``
            query["ssl"] = query.pop("sslmode")
        return url.set(drivername="postgresql+asyncpg", query=query)
    raise StoreError(f"storage.url: unsupported database {backend!r} (use sqlite:/// or postgresql://)")


class Store:
    """The async store; open with :meth:`open` (or ``async with await Store.open(url)``)."""

    def __init__(self, engine: AsyncEngine, *, replica_timeout_s: float) -> None:
        self._engine = engine
        self._timeout_s = replica_timeout_s
        self._claims = 0
        #: This process among the replicas; marks the turns it queues.
        self._run = uuid.uuid4().hex
        self._heartbeat: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, target: Path | str, *, replica_timeout_s: float = 15.0) -> Store:
        """Open the database at ``target`` (a path or URL; an SQLite file and its folders are
        created), migrate it to :data:`SCHEMA_VERSION` and register this process as a replica."""
        url = database_url(target)
        if url.get_backend_name() == "sqlite" and url.database:
            await asyncio.to_thread(Path(url.database).parent.mkdir, parents=True, exist_ok=True)
        engine = _create_engine(url)
        store = cls(engine, replica_timeout_s=replica_timeout_s)
        try:
            async with engine.begin() as conn:
                await conn.run_sync(_migrate)
            await store._register()
            await store._prune_processed()
        except (SQLAlchemyError, OSError) as exc:
            await engine.dispose()
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            shown = url.set(drivername=url.get_backend_name()).render_as_string(hide_password=True)
            raise StoreError(f"cannot open the store {shown}: {reason}") from None
        except BaseException:
            await engine.dispose()
            raise
        store._heartbeat = asyncio.create_task(store._beat(), name="store-heartbeat")
        return store

    @property
    def shared(self) -> bool:
        """True when several bot processes may share this database (PostgreSQL)."""
        return self._engine.dialect.name != "sqlite"

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
            async with self._engine.begin() as conn:
                await conn.execute(sa.delete(replicas).where(replicas.c.run == self._run))
        except SQLAlchemyError as exc:
            log.warning("could not sign this replica off: %s", exc)
        await self._engine.dispose()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def schema_version(self) -> str:
        """The Alembic revision of the open database."""
        async with self._engine.connect() as conn:
            return str(await conn.run_sync(lambda sync: MigrationContext.configure(sync).get_current_revision()))

    async def claim_message(self, message_id: str) -> bool:
        """Record a platform message id; True the first time, False for a duplicate (on any replica)."""
        async with self._transaction() as conn:
            claimed = await conn.execute(
                self._insert(processed).values(message_id=message_id, at=time.time())
                .on_conflict_do_nothing(index_elements=[processed.c.message_id]).returning(processed.c.message_id)
            )
            first = claimed.first() is not None
        self._claims += 1
        if self._claims % _PRUNE_EVERY == 0:
            await self._prune_processed()
        return first

    async def touch_thread(self, key: str, channel_key: str) -> None:
        """Create the thread if new and mark it active now."""
        now = time.time()
        statement = self._insert(threads).values(key=key, channel_key=channel_key, created_at=now, last_active_at=now)
        async with self._transaction() as conn:
            await conn.execute(statement.on_conflict_do_update(
                index_elements=[threads.c.key],
                set_={"channel_key": statement.excluded.channel_key, "last_active_at": statement.excluded.last_active_at},
            ))  # fmt: skip

    async def thread_exists(self, key: str) -> bool:
        """True when the thread has been seen before (touched or written to)."""
        async with self._engine.connect() as conn:
            found = await conn.execute(sa.select(threads.c.key).where(threads.c.key == key))
            return found.first() is not None

    async def add_messages(self, key: str, messages_: Sequence[dict[str, Any]], *, user_id: str | None = None) -> None:
        """Append OpenAI-format messages (in order, in one transaction)."""
        if not messages_:
            return
        now = time.time()
        async with self._transaction() as conn:
            first = await self._reserve_seq(conn, key, len(messages_), now)
            await conn.execute(sa.insert(messages), [
                {"thread": key, "seq": first + i, "role": str(message.get("role", "")), "content": json.dumps(message),
                 "user_id": user_id, "created_at": now}
                for i, message in enumerate(messages_)
            ])  # fmt: skip

    async def history(self, key: str) -> list[dict[str, Any]]:
        """The thread's OpenAI-format messages, oldest first (notices left out)."""
        async with self._engine.connect() as conn:
            rows = await conn.execute(
                sa.select(messages.c.content)
                .where(messages.c.thread == key, messages.c.role != NOTICE_ROLE).order_by(messages.c.seq)
            )
            return [json.loads(content) for (content,) in rows]

    async def add_cell(self, key: str, code: str, result: ExecutionResult) -> None:
        """Record an executed cell with its outputs converted to nbformat v4."""
        outputs = json.dumps(result_to_outputs(result))
        now = time.time()
        async with self._transaction() as conn:
            seq = await self._reserve_seq(conn, key, 1, now)
            await conn.execute(sa.insert(cells).values(
                thread=key, seq=seq, code=code, outputs=outputs, execution_count=result.execution_count,
                outcome=result.outcome.value, duration_s=result.duration_s, created_at=now,
            ))  # fmt: skip

    async def cell_count(self, key: str) -> int:
        """How many cells the thread has executed."""
        async with self._engine.connect() as conn:
            count = await conn.scalar(sa.select(sa.func.count()).select_from(cells).where(cells.c.thread == key))
        return int(count or 0)

    async def add_usage(self, key: str, model: str, prompt_tokens: int, completion_tokens: int) -> None:
        """Record the tokens one LLM call used."""
        async with self._transaction() as conn:
            await conn.execute(sa.insert(usage).values(
                thread=key, model=model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, at=time.time(),
            ))  # fmt: skip

    async def usage(self, key: str) -> tuple[int, int]:
        """Total (prompt, completion) tokens used by the thread."""
        async with self._engine.connect() as conn:
            row = (await conn.execute(
                sa.select(sa.func.coalesce(sa.func.sum(usage.c.prompt_tokens), 0),
                          sa.func.coalesce(sa.func.sum(usage.c.completion_tokens), 0)).where(usage.c.thread == key)
            )).first()  # fmt: skip
        return (int(row[0]), int(row[1])) if row else (0, 0)

    async def timeline(self, key: str) -> list[TimelineEntry]:
        """Messages and cells of the thread interleaved in the order they were written."""
        async with self._engine.connect() as conn:
            message_rows = (await conn.execute(
                sa.select(messages.c.seq, messages.c.content, messages.c.user_id, messages.c.created_at)
                .where(messages.c.thread == key)
            )).all()  # fmt: skip
            cell_rows = (await conn.execute(
                sa.select(cells.c.seq, cells.c.code, cells.c.outputs, cells.c.execution_count, cells.c.outcome,
                          cells.c.duration_s, cells.c.created_at).where(cells.c.thread == key)
            )).all()  # fmt: skip
        entries: list[TimelineEntry] = [
            MessageEntry(seq, json.loads(content), user_id, created) for seq, content, user_id, created in message_rows
        ]
        entries += [
            CellEntry(seq, code, json.loads(outputs), count, outcome, duration, created)
            for seq, code, outputs, count, outcome, duration, created in cell_rows
        ]
        return sorted(entries, key=lambda entry: entry.seq)

    async def begin_turn(self, key: str, message_id: str) -> QueuedTurn:
        """Queue the turn for ``message_id`` in thread ``key`` (until :meth:`end_turn`): it takes
        the thread's next ticket. The thread's row is locked while the ticket is taken, so tickets
        are handed out in the order the transactions commit, on every replica."""
        now = time.time()
        async with self._transaction() as conn:
            await self._ensure_thread(conn, key, now)
            ticket = int((await conn.execute(
                sa.update(threads).where(threads.c.key == key)
                .values(last_ticket=threads.c.last_ticket + 1, last_active_at=now).returning(threads.c.last_ticket)
            )).scalar_one())  # fmt: skip
            row = {"run": self._run, "started_at": now, "ticket": ticket}
            statement = self._insert(turns_in_flight).values(thread=key, message_id=message_id, **row)
            await conn.execute(statement.on_conflict_do_update(
                index_elements=[turns_in_flight.c.thread, turns_in_flight.c.message_id], set_=row
            ))  # fmt: skip
            ahead = await conn.scalar(
                sa.select(sa.func.count()).select_from(turns_in_flight)
                .where(turns_in_flight.c.thread == key, turns_in_flight.c.ticket < ticket)
            )
        return QueuedTurn(ticket, int(ahead or 0))

    async def check_turn(self, key: str, ticket: int) -> TurnCheck:
        """May the turn holding ``ticket`` start? It may once no earlier ticket of its thread is
        left. Earlier tickets of replicas that are gone are taken (and returned) on the way."""
        async with self._transaction() as conn:
            taken = await self._take(conn, sa.and_(turns_in_flight.c.thread == key, turns_in_flight.c.ticket < ticket))
            waiting = await conn.scalar(
                sa.select(sa.func.count()).select_from(turns_in_flight)
                .where(turns_in_flight.c.thread == key, turns_in_flight.c.ticket < ticket)
            )
        return TurnCheck(ready=not waiting, interrupted=tuple(taken))

    async def end_turn(self, key: str, message_id: str) -> None:
        """Clear the mark of :meth:`begin_turn` (the turn ended, or its thread was told it did not)."""
        async with self._transaction() as conn:
            await conn.execute(sa.delete(turns_in_flight).where(
                turns_in_flight.c.thread == key, turns_in_flight.c.message_id == message_id
            ))  # fmt: skip

    async def request_stop(self, key: str) -> bool:
        """Ask the replica running thread ``key``'s turn to stop it; False when none runs."""
        async with self._transaction() as conn:
            head = sa.select(sa.func.min(turns_in_flight.c.ticket)).where(turns_in_flight.c.thread == key).scalar_subquery()
            marked = await conn.execute(
                sa.update(turns_in_flight).where(turns_in_flight.c.thread == key, turns_in_flight.c.ticket == head)
                .values(stop_requested=True).returning(turns_in_flight.c.message_id)
            )  # fmt: skip
            return marked.first() is not None

    async def stop_requested(self, key: str, message_id: str) -> bool:
        """Whether Stop was pressed (on any replica) for the turn of ``message_id``."""
        async with self._engine.connect() as conn:
            return bool(await conn.scalar(sa.select(turns_in_flight.c.stop_requested).where(
                turns_in_flight.c.thread == key, turns_in_flight.c.message_id == message_id
            )))  # fmt: skip

    async def take_interrupted_turns(self, reachable: Callable[[str], bool] | None = None) -> list[InterruptedTurn]:
        """Remove and return the turns of bot processes that are gone, oldest first.

        Only turns whose thread key ``reachable`` accepts are taken (all when it is None); the
        rest stay for a later start, e.g. when their platform is not enabled now. Turns of live
        replicas (this one included) are never taken. Leftovers older than seven days are
        dropped unreported. Selecting and deleting happen in one transaction, so each turn is
        returned once, even to two replicas sweeping at once.
        """
        async with self._transaction() as conn:
            stale = time.time() - _INTERRUPTED_KEEP_S
            await conn.execute(sa.delete(turns_in_flight).where(self._gone(), turns_in_flight.c.started_at < stale))
            rows = (await conn.execute(
                sa.select(turns_in_flight.c.thread, turns_in_flight.c.message_id, turns_in_flight.c.started_at)
                .where(self._gone()).order_by(turns_in_flight.c.started_at).with_for_update(skip_locked=True)
            )).all()  # fmt: skip
            wanted = [(str(t), str(m)) for t, m, _ in rows if reachable is None or reachable(str(t))]
            taken: list[InterruptedTurn] = []
            for thread, message_id in wanted:
                gone = await conn.execute(
                    sa.delete(turns_in_flight).where(
                        turns_in_flight.c.thread == thread, turns_in_flight.c.message_id == message_id
                    ).returning(turns_in_flight.c.started_at)
                )
                if (started := gone.scalar()) is not None:
                    taken.append(InterruptedTurn(thread, message_id, float(started)))
        return taken

    async def claim_kernel(self, key: str) -> KernelOwner | None:
        """Record that this replica's kernel now holds thread ``key``'s variables; returns the
        owner before (None when none was recorded)."""
        async with self._transaction() as conn:
            row = (await conn.execute(
                sa.select(threads.c.kernel_run, threads.c.kernel_id).where(threads.c.key == key).with_for_update()
            )).first()  # fmt: skip
            if row is None or row.kernel_run is None:
                before = None
            else:
                gone = await conn.scalar(sa.select(sa.func.count()).select_from(replicas).where(
                    replicas.c.run == row.kernel_run, replicas.c.seen_at >= time.time() - self._timeout_s
                )) == 0 if self.shared else row.kernel_run != self._run  # fmt: skip
                before = KernelOwner(str(row.kernel_run), row.kernel_id, bool(gone))
            if before is None or before.run != self._run:
                await conn.execute(
                    sa.update(threads).where(threads.c.key == key).values(kernel_run=self._run, kernel_id=None)
                )
        return before

    async def record_kernel(self, key: str, remote_id: str | None) -> None:
        """Record the gateway id of the kernel this replica holds thread ``key``'s variables in."""
        async with self._transaction() as conn:
            await conn.execute(sa.update(threads).where(threads.c.key == key, threads.c.kernel_run == self._run)
                               .values(kernel_id=remote_id))  # fmt: skip

    async def live_replicas(self) -> list[str]:
        """The runs of the replicas that showed signs of life within the timeout, this one included."""
        async with self._engine.connect() as conn:
            rows = await conn.execute(
                sa.select(replicas.c.run).where(replicas.c.seen_at >= time.time() - self._timeout_s).order_by(replicas.c.run)
            )
            return [str(run) for (run,) in rows]

    def _gone(self) -> sa.ColumnElement[bool]:
        """Rows of ``turns_in_flight`` whose replica is gone."""
        if not self.shared:
            return turns_in_flight.c.run != self._run  # SQLite: one bot process at a time
        live = sa.select(replicas.c.run).where(replicas.c.seen_at >= time.time() - self._timeout_s)
        return sa.and_(turns_in_flight.c.run != self._run, turns_in_flight.c.run.not_in(live))

    async def _take(self, conn: AsyncConnection, where: sa.ColumnElement[bool]) -> list[InterruptedTurn]:
        gone = await conn.execute(
            sa.delete(turns_in_flight).where(where, self._gone())
            .returning(turns_in_flight.c.thread, turns_in_flight.c.message_id, turns_in_flight.c.started_at)
        )  # fmt: skip
        return sorted((InterruptedTurn(str(t), str(m), float(s)) for t, m, s in gone), key=lambda turn: turn.started_at)

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AsyncConnection]:
        async with self._engine.begin() as conn:
            yield conn

    def _insert(self, table: sa.Table) -> Any:
        """``INSERT`` with ``ON CONFLICT`` for this database's dialect."""
        if self.shared:
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            return pg_insert(table)
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(table)

    async def _ensure_thread(self, conn: AsyncConnection, key: str, now: float) -> None:
        await conn.execute(
            self._insert(threads).values(key=key, channel_key=_channel_key_of(key), created_at=now, last_active_at=now)
            .on_conflict_do_nothing(index_elements=[threads.c.key])
        )  # fmt: skip

    async def _reserve_seq(self, conn: AsyncConnection, key: str, count: int, now: float) -> int:
        """Take ``count`` consecutive seq numbers of the thread (creating it); returns the first."""
        await self._ensure_thread(conn, key, now)
        last = (await conn.execute(
            sa.update(threads).where(threads.c.key == key)
            .values(last_seq=threads.c.last_seq + count, last_active_at=now).returning(threads.c.last_seq)
        )).scalar_one()  # fmt: skip
        return int(last) - count + 1

    async def _register(self) -> None:
        now = time.time()
        async with self._transaction() as conn:
            await conn.execute(sa.delete(replicas).where(replicas.c.seen_at < now - _FORGET_REPLICA_S))
            await conn.execute(sa.insert(replicas).values(run=self._run, host=socket.gethostname(), started_at=now, seen_at=now))

    async def _beat(self) -> None:
        """Mark this replica alive every third of the timeout, for as long as the store is open."""
        while True:
            await asyncio.sleep(self._timeout_s / 3)
            try:
                async with self._transaction() as conn:
                    seen = await conn.execute(
                        sa.update(replicas).where(replicas.c.run == self._run).values(seen_at=time.time())
                    )
                    if seen.rowcount == 0:  # deleted as long gone (the database was out of reach for a day)
                        await conn.execute(sa.insert(replicas).values(
                            run=self._run, host=socket.gethostname(), started_at=time.time(), seen_at=time.time()
                        ))  # fmt: skip
            except SQLAlchemyError as exc:
                log.warning("could not mark this replica alive: %s", exc)

    async def _prune_processed(self) -> None:
        async with self._transaction() as conn:
            await conn.execute(sa.delete(processed).where(processed.c.at < time.time() - _DEDUPE_KEEP_S))


def _create_engine(url: URL) -> AsyncEngine:
    if url.get_backend_name() != "sqlite":
        # pre_ping: a connection the database dropped (restart, failover) is replaced, not used.
        return create_async_engine(url, pool_size=10, max_overflow=10, pool_pre_ping=True, pool_recycle=1800)
    # One connection, handed out first come, first served: SQLite writes one transaction at a
    # time anyway, and its busy handler (sleeping retries) would serve competing connections
    # of this process out of order and late.
    engine = create_async_engine(url, pool_size=1, max_overflow=0, pool_timeout=600)

    # SQLAlchemy's documented recipe for SQLite transactions: no implicit BEGIN from the
    # driver; each transaction starts with BEGIN IMMEDIATE, taking the write lock up front
    # (two deferred transactions that both write would otherwise deadlock into SQLITE_BUSY).
    @event.listens_for(engine.sync_engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON", "busy_timeout=5000"):
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


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


def _channel_key_of(key: str) -> str:
    """``platform:channel`` of a thread key string; empty when the key is not a ThreadKey."""
    try:
        return ThreadKey.parse(key).channel_key
    except ValueError:
        return ""
