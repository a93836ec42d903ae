"""A read-only, bounded connection pool per source, streaming a query's rows in batches.

- **PostgreSQL** (``postgresql://``, any driver named): an ``asyncpg`` pool whose sessions start
  with ``default_transaction_read_only=on`` and ``statement_timeout``; every query runs in a
  ``BEGIN READ ONLY`` transaction with ``SET LOCAL statement_timeout`` (a session setting the
  query changed is reset when the connection goes back to the pool), as one prepared
  statement (the extended protocol takes one statement only), read through a server-side
  cursor in batches. A timeout in the bot cancels the query on the server (asyncpg sends the
  cancel request).
- **SQLite** (``sqlite:///file.db``): the file opened ``mode=ro`` (URI) with
  ``PRAGMA query_only``; **any other SQLAlchemy dialect** through SQLAlchemy's synchronous
  engine in a worker thread, ``stream_results`` on, the transaction always rolled back (grant
  such sources a read-only database user). A timeout interrupts an SQLite query
  (``sqlite3.Connection.interrupt``); other drivers' queries are abandoned to finish.

Each source allows ``max_concurrent`` queries at once (the others wait) over a pool of as many
connections. Errors come back as :class:`QueryFailed` with credentials scrubbed.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import asyncpg
import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import NoSuchModuleError

from bot.sources.guard import sqlglot_dialect
from bot.sources.parquet import SinkFailed, arrow_type_for
from bot.sources.scrub import scrub, secrets_of
from bot.sources.settings import SourceSettings

log = logging.getLogger(__name__)

#: Rows fetched (and written as one row group) at a time.
BATCH_ROWS = 20_000
#: How long an abandoned query of a driver that cannot be interrupted is waited for.
_ABANDON_WAIT_S = 5.0
#: Tables and columns listed for the model, at most.
_CATALOGUE_COLUMNS = 2_000


#: The package to install for a missing driver module, for the common ones.
_DRIVER_PACKAGES = {
    "MySQLdb": "mysqlclient",
    "pymysql": "PyMySQL",
    "mysql": "mysql-connector-python",
    "pyodbc": "pyodbc",
    "pymssql": "pymssql",
    "oracledb": "oracledb",
    "cx_Oracle": "cx_Oracle",
}


class SourceUnavailable(Exception):
    """A configured source's URL names a dialect or driver this installation lacks. ``str()``
    is one line naming the key (``sources.<name>.url``) and what to install or fix; never the URL."""


class QueryFailed(Exception):
    """The database refused or failed the query; the message is safe to show."""


class QueryTimedOut(QueryFailed):
    """The query ran past ``statement_timeout_s``."""


class RowSink(Protocol):
    """Where a query's rows go (blocking calls, made from a worker thread)."""

    def start(self, columns: Sequence[str], types: Sequence[pa.DataType | None]) -> None:
        """The result's columns, before any row."""

    def add(self, rows: Sequence[Sequence[Any]]) -> None:
        """One batch of rows."""


@dataclass(frozen=True, slots=True)
class Fetched:
    """How a query went: rows written, whether ``max_rows`` cut it, its wall time."""

    rows: int
    cut: bool
    seconds: float


@dataclass(frozen=True, slots=True)
class TableColumns:
    """One table (or view) and its columns with their database types."""

    table: str
    columns: tuple[tuple[str, str], ...]


class Source:
    """One configured source: see the module docstring."""

    def __init__(self, name: str, settings: SourceSettings) -> None:
        self.name = name
        self.settings = settings
        self._url = make_url(settings.url.get_secret_value())
        self._secrets = secrets_of(self._url)
        #: The SQLAlchemy dialect (``postgresql``, ``sqlite``, …) and the parser's for it.
        self.dialect = self._url.get_backend_name()
        self.sql_dialect = sqlglot_dialect(self.dialect)
        self._limit = asyncio.Semaphore(settings.max_concurrent)

    def scrub(self, text: str) -> str:
        """``text`` without this source's credentials or any URL."""
        return scrub(text, self._secrets)

    async def fetch(self, query: str, sink: RowSink, *, max_rows: int | None = None) -> Fetched:
        """Run ``query`` (already checked: :func:`bot.sources.guard.check_query`) into ``sink``,
        at most ``max_rows`` rows (default: the source's); :class:`QueryFailed` when it fails."""
        raise NotImplementedError

    async def tables(self) -> list[TableColumns]:
        """The tables and views a query can read, with their columns (bounded)."""
        raise NotImplementedError

    async def close(self) -> None:
        """Close every connection."""
        raise NotImplementedError


class PostgresSource(Source):
    """PostgreSQL through an asyncpg pool."""

    def __init__(self, name: str, settings: SourceSettings) -> None:
        super().__init__(name, settings)
        self._pool: asyncpg.Pool | None = None
        self._pool_lock = asyncio.Lock()
        self._timeout_ms = int(settings.statement_timeout_s * 1000)

    async def _connections(self) -> asyncpg.Pool:
        async with self._pool_lock:
            if self._pool is None:
                dsn = self._url.set(drivername="postgresql").render_as_string(hide_password=False)
                self._pool = await asyncpg.create_pool(
                    dsn,
                    min_size=0,
                    max_size=self.settings.max_concurrent,
                    server_settings={
                        "default_transaction_read_only": "on",
                        "statement_timeout": str(self._timeout_ms),
                        "application_name": "threadbook",
                    },
                )
            return self._pool

    async def fetch(self, query: str, sink: RowSink, *, max_rows: int | None = None) -> Fetched:
        limit = max_rows or self.settings.max_rows
        started = time.perf_counter()
        async with self._limit:
            try:
                async with asyncio.timeout(self.settings.statement_timeout_s):
                    rows = await self._fetch(query, sink, limit)
            except TimeoutError:
                raise QueryTimedOut(self._timed_out()) from None
            except asyncpg.QueryCanceledError as exc:
                if "statement timeout" in str(exc):
                    raise QueryTimedOut(self._timed_out()) from None
                raise QueryFailed(self.scrub(str(exc))) from None
            except asyncpg.PostgresError as exc:
                raise QueryFailed(self.scrub(_postgres_message(exc))) from None
            except (OSError, asyncpg.InterfaceError, asyncpg.InternalClientError) as exc:
                log.warning("source %s: %s", self.name, self.scrub(str(exc)))
                raise QueryFailed(f"the database could not be reached ({self.scrub(str(exc))[:200]})") from None
        return Fetched(rows=min(rows, limit), cut=rows > limit, seconds=time.perf_counter() - started)

    async def _fetch(self, query: str, sink: RowSink, limit: int) -> int:
        """Rows read (``limit + 1`` at most: one more says the result was cut)."""
        pool = await self._connections()
        async with pool.acquire() as conn:
            async with conn.transaction(readonly=True, isolation="repeatable_read"):
                await conn.execute(f"SET LOCAL statement_timeout = {self._timeout_ms}")
                statement = await conn.prepare(query)
                attributes = statement.get_attributes()
                types = [arrow_type_for(a.type.name) for a in attributes]
                await _to_sink(sink.start, [a.name for a in attributes], types)
                cursor = await statement.cursor()
                read = 0
                # The next batch is read from the server while the last one is written.
                writing: asyncio.Task[None] | None = None
                try:
                    while read <= limit:
                        batch = await cursor.fetch(min(BATCH_ROWS, limit + 1 - read))
                        if writing is not None:
                            await writing
                            writing = None
                        if not batch:
                            break
                        read += len(batch)
                        keep = batch if read <= limit else batch[: len(batch) - (read - limit)]
                        writing = asyncio.create_task(_to_sink(sink.add, keep))
                    if writing is not None:
                        await writing
                finally:
                    if writing is not None and not writing.done():
                        writing.cancel()  # its thread finishes the batch; the caller drops the file
                return read

    async def tables(self) -> list[TableColumns]:
        query = (
            "SELECT table_schema, table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema NOT IN ('pg_catalog', 'information_schema') AND table_schema NOT LIKE 'pg_toast%' "
            f"ORDER BY table_schema, table_name, ordinal_position LIMIT {_CATALOGUE_COLUMNS}"
        )
        async with self._limit:
            try:
                async with asyncio.timeout(self.settings.statement_timeout_s):
                    pool = await self._connections()
                    async with pool.acquire() as conn, conn.transaction(readonly=True):
                        records = await conn.fetch(query)
            except TimeoutError:
                raise QueryTimedOut(self._timed_out()) from None
            except (asyncpg.PostgresError, OSError, asyncpg.InterfaceError) as exc:
                raise QueryFailed(self.scrub(str(exc))) from None
        return _group([(_qualified(r[0], r[1]), r[2], r[3]) for r in records])

    def _timed_out(self) -> str:
        return f"the query ran longer than {self.settings.statement_timeout_s:g} s and was cancelled"

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None


class SyncSource(Source):
    """SQLite (read-only file) and other SQLAlchemy dialects, in worker threads."""

    def __init__(self, name: str, settings: SourceSettings) -> None:
        super().__init__(name, settings)
        url = self._url
        if self.dialect == "sqlite":
            url = _read_only_sqlite(url)
        self._engine = _engine(
            name,
            url,
            pool_size=settings.max_concurrent,
            max_overflow=0,
            pool_pre_ping=self.dialect != "sqlite",
        )
        if self.dialect == "sqlite":
            event.listen(self._engine, "connect", _query_only)

    async def fetch(self, query: str, sink: RowSink, *, max_rows: int | None = None) -> Fetched:
        limit = max_rows or self.settings.max_rows
        stop = threading.Event()
        held: list[Any] = []  # the DB-API connection, to interrupt
        started = time.perf_counter()
        await self._limit.acquire()
        work = asyncio.ensure_future(asyncio.to_thread(self._fetch, query, sink, limit, stop, held))
        work.add_done_callback(lambda _: self._limit.release())  # also when the query is abandoned

        def interrupt() -> None:
            stop.set()
            for connection in held:
                if hasattr(connection, "interrupt"):
                    connection.interrupt()  # sqlite3: thread-safe; the query ends with "interrupted"

        try:
            rows = await asyncio.wait_for(asyncio.shield(work), self.settings.statement_timeout_s)
        except asyncio.CancelledError:
            interrupt()  # the turn was stopped: the thread ends the query and drops the rows
            raise
        except TimeoutError:
            interrupt()
            try:
                await asyncio.wait_for(asyncio.shield(work), _ABANDON_WAIT_S)
            except BaseException:
                pass
            raise QueryTimedOut(
                f"the query ran longer than {self.settings.statement_timeout_s:g} s and was stopped"
            ) from None
        except sa.exc.DBAPIError as exc:
            raise QueryFailed(self.scrub(str(exc.orig))) from None
        except sa.exc.SQLAlchemyError as exc:
            raise QueryFailed(self.scrub(str(exc).split("\n")[0])) from None
        return Fetched(rows=min(rows, limit), cut=rows > limit, seconds=time.perf_counter() - started)

    def _fetch(self, query: str, sink: RowSink, limit: int, stop: threading.Event, held: list[Any]) -> int:
        with self._engine.connect() as conn:
            held.append(conn.connection.dbapi_connection)
            try:
                result = conn.execution_options(stream_results=True).exec_driver_sql(query)
                if stop.is_set():  # abandoned while the query ran: the sink may be aborted already
                    result.close()
                    raise QueryTimedOut("stopped")
                _sync_sink(sink.start, list(result.keys()), [None] * len(result.keys()))
                read = 0
                while read <= limit and not stop.is_set():
                    batch = result.fetchmany(min(BATCH_ROWS, limit + 1 - read))
                    if not batch:
                        break
                    read += len(batch)
                    keep = batch if read <= limit else batch[: len(batch) - (read - limit)]
                    _sync_sink(sink.add, [tuple(row) for row in keep])
                result.close()
                if stop.is_set():
                    raise QueryTimedOut("stopped")
                return read
            finally:
                conn.rollback()

    async def tables(self) -> list[TableColumns]:
        async with self._limit:
            try:
                return await asyncio.wait_for(asyncio.to_thread(self._tables), self.settings.statement_timeout_s)
            except TimeoutError:
                raise QueryTimedOut("listing the tables took too long") from None
            except sa.exc.SQLAlchemyError as exc:
                raise QueryFailed(self.scrub(str(getattr(exc, "orig", exc)))) from None

    def _tables(self) -> list[TableColumns]:
        inspector = sa.inspect(self._engine)
        found: list[tuple[str, str, str]] = []
        for table in [*inspector.get_table_names(), *inspector.get_view_names()]:
            for column in inspector.get_columns(table):
                found.append((table, str(column["name"]), str(column["type"])))
                if len(found) >= _CATALOGUE_COLUMNS:
                    return _group(found)
        return _group(found)

    async def close(self) -> None:
        await asyncio.to_thread(self._engine.dispose)


async def _to_sink(call: Callable[..., None], *args: Any) -> None:
    """A sink's (blocking) call in a worker thread; its OS errors are not the database's."""
    try:
        await asyncio.to_thread(call, *args)
    except OSError as exc:
        raise SinkFailed(str(exc)) from exc


def open_source(name: str, settings: SourceSettings) -> Source:
    """The :class:`Source` for a configured source: its engine is made (its dialect and driver
    loaded) but no connection yet. :class:`SourceUnavailable` when they cannot be loaded."""
    backend = make_url(settings.url.get_secret_value()).get_backend_name()
    return PostgresSource(name, settings) if backend == "postgresql" else SyncSource(name, settings)


def check_source(name: str, settings: SourceSettings) -> None:
    """Raise :class:`SourceUnavailable` unless the source's dialect and driver load (nothing
    connects): for start-up, so a source that could never open is not first found in a turn."""
    url = make_url(settings.url.get_secret_value())
    if url.get_backend_name() != "postgresql":  # PostgreSQL is asyncpg's, whatever driver the URL names
        _engine(name, url).dispose()


def _engine(name: str, url: URL, **options: Any) -> sa.Engine:
    """``sa.create_engine`` (which loads the dialect and its driver, and connects to nothing),
    its failure to load them as :class:`SourceUnavailable`."""
    key = f"sources.{name}.url"
    try:
        engine = sa.create_engine(url, **options)
    except NoSuchModuleError:
        raise SourceUnavailable(
            f"{key}: SQLAlchemy has no dialect {url.drivername!r}: fix the URL's scheme "
            "(dialect+driver://, such as mysql+pymysql://), or install the package that provides that dialect"
        ) from None
    except ImportError as exc:
        module = exc.name or str(exc)
        package = _DRIVER_PACKAGES.get(module.split(".")[0])
        install = f"pip install {package}" if package else f"install the package that provides the module {module!r}"
        raise SourceUnavailable(
            f"{key}: the {url.get_backend_name()} driver {url.get_driver_name()!r} is not installed "
            f"(no module {module!r}): {install} into the bot's environment, or name an installed driver "
            f"({url.get_backend_name()}+<driver>://)"
        ) from None
    if engine.dialect.is_async:
        engine.dispose()
        raise SourceUnavailable(
            f"{key}: {url.drivername!r} is an asyncio driver; name a synchronous one ({url.get_backend_name()}+<driver>://)"
        )
    return engine


def _sync_sink(call: Callable[..., None], *args: Any) -> None:
    try:
        call(*args)
    except OSError as exc:
        raise SinkFailed(str(exc)) from exc


def _read_only_sqlite(url: URL) -> URL:
    """``sqlite:///x.db`` → the file opened read-only through an SQLite URI (``mode=ro``)."""
    database = url.database or ""  # a file (the settings refuse an in-memory database)
    if not database.startswith("file:"):
        database = f"file:{database}"
    return url.set(database=database).update_query_dict({"mode": "ro", "uri": "true"})


def _query_only(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA query_only = ON")
    cursor.close()


def _postgres_message(exc: asyncpg.PostgresError) -> str:
    message = str(exc)
    detail = getattr(exc, "detail", None)
    hint = getattr(exc, "hint", None)
    return " ".join(
        part for part in (message, f"DETAIL: {detail}" if detail else "", f"HINT: {hint}" if hint else "") if part
    )


def _qualified(schema: str, table: str) -> str:
    return table if schema == "public" else f"{schema}.{table}"


def _group(rows: list[tuple[str, str, str]]) -> list[TableColumns]:
    tables: dict[str, list[tuple[str, str]]] = {}
    for table, column, type_ in rows:
        tables.setdefault(table, []).append((column, type_))
    return [TableColumns(table, tuple(columns)) for table, columns in tables.items()]
