"""How the store reaches its database: one way to run an operation, two transports.

An operation is a plain function of a SQLAlchemy :class:`~sqlalchemy.engine.Connection`, run
whole as one read or one transaction:

- **SQLite** (one bot process): SQLAlchemy's synchronous engine on the standard ``sqlite3``
  driver, every operation on one worker thread, first come first served. One thread hop per
  operation (the async driver makes several per statement), and writes are serial in SQLite
  anyway. The connection runs in autocommit; a write opens ``BEGIN IMMEDIATE`` itself, taking
  the write lock up front (two deferred transactions that both write would deadlock).
- **PostgreSQL** (replicas): SQLAlchemy's async engine on ``asyncpg``, the same function run
  through ``AsyncConnection.run_sync`` (SQLAlchemy's bridge: each statement awaits the
  network, nothing blocks the event loop), a pool of connections; reads in autocommit; an
  operation whose connection the database dropped (restart, failover) runs once more.

The statements every turn runs are built once, at import or once per dialect (:func:`upsert`),
and their values bound at each run (``b_…`` parameters): building a SQLAlchemy statement costs
more CPU than SQLite running it (~250 against ~100 µs a statement, measured in a crowd of turns).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

__all__ = ["Database", "Operation", "database_url", "open_database", "upsert"]

T = TypeVar("T")

#: A store operation that returns nothing, for running several in one transaction (:meth:`Database.write_all`).
Operation = Callable[[Connection], object]


class Database:
    """Runs store operations; see the module docstring."""

    #: ``sqlite`` or ``postgresql``.
    dialect: str
    #: The URL to show (no password, no driver name).
    shown: str

    async def read(self, operation: Callable[[Connection], T]) -> T:
        """Run ``operation`` as one read."""
        raise NotImplementedError

    async def write(self, operation: Callable[[Connection], T]) -> T:
        """Run ``operation`` in one transaction: committed when it returns, rolled back when it raises."""
        raise NotImplementedError

    async def write_all(self, *operations: Operation) -> None:
        """Run ``operations`` in order, in one transaction (one trip to the database)."""

        def together(conn: Connection) -> None:
            for operation in operations:
                operation(conn)

        await self.write(together)

    async def close(self) -> None:
        """Close every connection."""
        raise NotImplementedError

    def upsert(self, table: sa.Table) -> postgresql.Insert | sqlite.Insert:
        """An INSERT into ``table`` that can say ``ON CONFLICT`` (each dialect has its own)."""
        return upsert(self.dialect, table)


def upsert(dialect: str, table: sa.Table) -> postgresql.Insert | sqlite.Insert:
    """An INSERT into ``table`` that can say ``ON CONFLICT`` in ``dialect`` (for statements
    built once per dialect; :meth:`Database.upsert` for the database at hand)."""
    return postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)


class _SQLite(Database):
    dialect = "sqlite"

    def __init__(self, url: URL, shown: str) -> None:
        self.shown = shown
        self._engine = sa.create_engine(url, isolation_level="AUTOCOMMIT", pool_size=1, max_overflow=0)
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="store")

        @event.listens_for(self._engine, "connect")
        def _connect(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON", "busy_timeout=5000"):
                cursor.execute(f"PRAGMA {pragma}")
            cursor.close()

    async def read(self, operation: Callable[[Connection], T]) -> T:
        def run() -> T:
            with self._engine.connect() as conn:
                return operation(conn)

        return await asyncio.get_running_loop().run_in_executor(self._worker, run)

    async def write(self, operation: Callable[[Connection], T]) -> T:
        def run() -> T:
            with self._engine.connect() as conn:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
                try:
                    result = operation(conn)
                except BaseException:
                    conn.exec_driver_sql("ROLLBACK")
                    raise
                conn.exec_driver_sql("COMMIT")
                return result

        # A cancelled caller does not stop the worker: the transaction ends whole either way.
        return await asyncio.get_running_loop().run_in_executor(self._worker, run)

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._worker, self._engine.dispose)
        self._worker.shutdown(wait=False)


class _Postgres(Database):
    dialect = "postgresql"

    def __init__(self, url: URL, shown: str) -> None:
        self.shown = shown
        # No pre-ping (it costs a round trip per operation): a connection the database dropped
        # (restart, failover) fails its operation, the pool drops it, and the operation runs once more.
        self._engine: AsyncEngine = create_async_engine(url, pool_size=10, max_overflow=10, pool_recycle=1800)
        #: Reads run in autocommit: one statement needs no BEGIN and ROLLBACK round trips.
        self._reader = self._engine.execution_options(isolation_level="AUTOCOMMIT")

    async def read(self, operation: Callable[[Connection], T]) -> T:
        for attempt in (1, 2):
            try:
                async with self._reader.connect() as conn:
                    return await conn.run_sync(operation)
            except DBAPIError as exc:
                if not exc.connection_invalidated or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def write(self, operation: Callable[[Connection], T]) -> T:
        for attempt in (1, 2):
            try:
                async with self._engine.begin() as conn:
                    return await conn.run_sync(operation)
            except DBAPIError as exc:  # the connection was lost: nothing was committed
                if not exc.connection_invalidated or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def close(self) -> None:
        await self._engine.dispose()


def database_url(target: Path | str) -> URL:
    """The SQLAlchemy URL of ``target``: a file path, ``sqlite:///…`` or ``postgresql://…``."""
    if isinstance(target, Path) or "://" not in target:
        return URL.create("sqlite", database=str(target))
    url = make_url(target)
    backend = url.get_backend_name()
    if backend == "sqlite":
        return url.set(drivername="sqlite")
    if backend in ("postgresql", "postgres"):
        query = dict(url.query)
        if "sslmode" in query:  # libpq's name; asyncpg takes the same values as ``ssl``
            query["ssl"] = query.pop("sslmode")
        return url.set(drivername="postgresql+asyncpg", query=query)
    raise ValueError(f"unsupported database {backend!r} (use sqlite:/// or postgresql://)")


async def open_database(url: URL) -> Database:
    """The :class:`Database` for ``url`` (an SQLite file's folders are created); connects lazily."""
    shown = url.set(drivername=url.get_backend_name()).render_as_string(hide_password=True)
    if url.get_backend_name() != "sqlite":
        return _Postgres(url, shown)
    if url.database:
        await asyncio.to_thread(Path(url.database).parent.mkdir, parents=True, exist_ok=True)
    return _SQLite(url, shown)
