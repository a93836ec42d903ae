"""A read-only, bounded connection pool per source, streaming a query's rows in batches.

- **PostgreSQL** (``postgresql://``, any driver named): an ``asyncpg`` pool whose sessions start
  with ``default_transaction_read_only=on`` and ``statement_timeout``; every query runs in a
  ``BEGIN READ ONLY`` transaction with ``SET LOCAL statement_timeout`` (a session setting the
  query changed is reset when the connection goes back to the pool), as one prepared
  statement (the extended protocol takes one statement only), read through a server-side
  cursor in batches. A timeout in the bot cancels the query on the server (asyncpg sends the
  cancel request). Rows come by bytes, not by count (:mod:`bot.sources.budget`): a first fetch
  of one row, then as many as fit a few MB at the widest row seen; a :class:`~bot.sources.wire.WireWatch`
  on the connection refuses a row over the row cap from its header, before it is received.
- **SQLite** (``sqlite:///file.db``): the file opened ``mode=ro`` (URI) with
  ``PRAGMA query_only``; **any other SQLAlchemy dialect** through SQLAlchemy's synchronous
  engine in a worker thread, ``stream_results`` on, the transaction always rolled back (grant
  such sources a read-only database user). A timeout interrupts an SQLite query
  (``sqlite3.Connection.interrupt``); other drivers' queries are abandoned to finish. Rows are
  fetched by bytes here too, measured once the driver has made them; SQLite itself refuses to
  make a value over the row cap (``SQLITE_LIMIT_LENGTH``). Other drivers hand a row over
  whole, however large (MySQL: up to ``max_allowed_packet``): the bot's memory bound does not
  hold for them. **DuckDB** connects with external access off and its configuration locked
  (:data:`DUCKDB_CONFIG`).

Each source allows ``max_concurrent`` queries at once (the others wait) over a pool of as many
connections. Errors come back as :class:`QueryFailed` with credentials scrubbed.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, cast

import asyncpg
import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import NoSuchModuleError
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import SqlglotError

from bot.sources import budget
from bot.sources.budget import FETCH_CAP, ROW_CAP, Pacer, Stop
from bot.sources.guard import sqlglot_dialect
from bot.sources.parquet import SinkFailed, arrow_type_for
from bot.sources.pgtypes import decode_as_text, expansion
from bot.sources.scrub import scrub, secrets_of
from bot.sources.settings import SourceSettings
from bot.sources.wire import WatchUnavailable, WireWatch

log = logging.getLogger(__name__)

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
    """How a query went: rows written, whether ``max_rows`` cut it, its wall time, and why it
    stopped early by bytes (a row too wide, the result past ``max_result_mb``; "" when it did not)."""

    rows: int
    cut: bool
    seconds: float
    stopped: str = ""


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
        #: A result's rows stop once they pass this many bytes.
        self.max_bytes = int(settings.max_result_mb * 2**20)

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
                    init=decode_as_text,
                )
            return self._pool

    async def fetch(self, query: str, sink: RowSink, *, max_rows: int | None = None) -> Fetched:
        limit = max_rows or self.settings.max_rows
        started = time.perf_counter()
        async with self._limit:
            try:
                async with asyncio.timeout(self.settings.statement_timeout_s):
                    rows, stopped = await self._fetch(query, sink, limit)
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
            except WatchUnavailable as exc:
                log.error("source %s: %s (asyncpg changed?); no query runs unwatched", self.name, exc)
                raise QueryFailed(f"{exc}, so the bot runs no query on it") from None
        return Fetched(rows=min(rows, limit), cut=rows > limit, seconds=time.perf_counter() - started, stopped=stopped)

    async def _fetch(self, query: str, sink: RowSink, limit: int) -> tuple[int, str]:
        """Rows read (``limit + 1`` at most: one more says the result was cut), and why they
        stopped early by bytes ("" when they did not)."""
        pool = await self._connections()
        watch: WireWatch | None = None
        try:
            async with pool.acquire() as conn:
                watch = WireWatch.install(conn, row_cap=ROW_CAP, fetch_cap=FETCH_CAP)
                # Not ``async with``: a connection the watch aborted cannot be rolled back (there
                # is nothing to roll back then), and its exit would raise over the rows kept.
                transaction = conn.transaction(readonly=True, isolation="repeatable_read")
                await transaction.start()
                try:
                    return await self._read(conn, watch, query, sink, limit)
                finally:
                    # What is left (a cancelled query's rows still on their way, the rollback,
                    # the pool's reset) comes through the watch too, with a fetch's caps.
                    watch.start_fetch()
                    if not _closed(conn):
                        await transaction.rollback()  # read-only: nothing to commit
        finally:
            if watch is not None:
                watch.remove()  # the pool has the connection back; no other task ran since

    async def _read(self, conn: Any, watch: WireWatch, query: str, sink: RowSink, limit: int) -> tuple[int, str]:
        await conn.execute(f"SET LOCAL statement_timeout = {self._timeout_ms}")
        statement = await conn.prepare(query)
        # One thread writes all of a query's batches: spread over the default pool's threads, each
        # thread's allocator would keep its own share of freed batches (tens of MB more at peak).
        writer = ThreadPoolExecutor(1, thread_name_prefix=f"sql-{self.name}")
        try:
            return await self._rows(statement, sink, limit, writer, watch)
        finally:
            writer.shutdown(wait=False)  # a write still running finishes its batch; the caller drops the file

    async def _rows(
        self, statement: Any, sink: RowSink, limit: int, writer: Executor, watch: WireWatch
    ) -> tuple[int, str]:
        attributes = statement.get_attributes()
        types = [arrow_type_for(a.type.name) for a in attributes]
        await _to_sink(writer, sink.start, [a.name for a in attributes], types)
        # Columns whose values take several times their wire size once decoded get lower caps.
        pacer = Pacer(
            left=limit + 1, cap=self.max_bytes, expansion=expansion(a.type for a in attributes), columns=len(attributes)
        )
        watch.limit(row_cap=pacer.row_cap, fetch_cap=pacer.fetch_cap)
        cursor = await statement.cursor()
        stopped = ""
        # A narrow batch is written while the next one is read from the server; a wide one
        # (over the pacer's batch_bytes) is written first, so the bot never holds two wide ones.
        writing: asyncio.Task[None] | None = None
        try:
            while want := pacer.next_rows():
                watch.start_fetch()
                try:
                    batch = await cursor.fetch(want)
                except Exception:
                    if watch.over is None:
                        raise
                    if watch.over.row_bytes is not None:
                        row = pacer.rows + watch.over.index + 1
                        stopped = str(budget.row_too_wide(pacer.rows, row, watch.over.row_bytes, pacer.row_cap))
                    else:
                        stopped = str(budget.fetch_too_wide(pacer.rows, want, pacer.fetch_cap))
                    break
                if writing is not None:
                    await writing
                    writing = None
                if not batch:
                    break
                try:
                    pacer.took(len(batch), watch.fetched)
                except Stop as stop:
                    stopped = str(stop)
                    break
                read = pacer.rows
                keep = batch if read <= limit else batch[: len(batch) - (read - limit)]
                writing = asyncio.create_task(_to_sink(writer, sink.add, keep))
                del batch, keep
                if watch.fetched > pacer.batch_bytes:
                    await writing
                    writing = None
            if writing is not None:
                await writing
        finally:
            if writing is not None and not writing.done():
                writing.cancel()  # its thread finishes the batch; the caller drops the file
        return pacer.rows, stopped

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
        options: dict[str, Any] = {}
        if self.dialect == "sqlite":
            url = _read_only_sqlite(url)
        elif self.dialect == "duckdb":
            url, options = _walled_duckdb(url)
        self._engine = _engine(
            name,
            url,
            pool_size=settings.max_concurrent,
            max_overflow=0,
            pool_pre_ping=self.dialect != "sqlite",
            **options,
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
            rows, stopped = await asyncio.wait_for(asyncio.shield(work), self.settings.statement_timeout_s)
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
        return Fetched(rows=min(rows, limit), cut=rows > limit, seconds=time.perf_counter() - started, stopped=stopped)

    def _fetch(self, query: str, sink: RowSink, limit: int, stop: threading.Event, held: list[Any]) -> tuple[int, str]:
        with self._engine.connect() as conn:
            held.append(conn.connection.dbapi_connection)
            try:
                value_cap = _bound_sqlite_values(conn, query) if self.dialect == "sqlite" else ROW_CAP
                try:
                    result = conn.execution_options(stream_results=True).exec_driver_sql(query)
                except sa.exc.DBAPIError as exc:
                    if _too_big(exc):  # SQLite refused to make a value before the first row
                        raise QueryFailed(budget.value_refused(value_cap)) from None
                    raise
                if stop.is_set():  # abandoned while the query ran: the sink may be aborted already
                    result.close()
                    raise QueryTimedOut("stopped")
                _sync_sink(sink.start, list(result.keys()), [None] * len(result.keys()))
                rows, stopped = self._read(result, sink, limit, stop, value_cap)
                result.close()
                if stop.is_set():
                    raise QueryTimedOut("stopped")
                return rows, stopped
            finally:
                conn.rollback()
                if self.dialect == "sqlite":  # the listing of tables reads longer values
                    _sqlite(conn).setlimit(sqlite3.SQLITE_LIMIT_LENGTH, ROW_CAP)

    def _read(
        self, result: sa.CursorResult[Any], sink: RowSink, limit: int, stop: threading.Event, value_cap: int
    ) -> tuple[int, str]:
        """Rows read by bytes (measured as the driver made them) into ``sink``, and why they stopped early."""
        pacer = Pacer(left=limit + 1, cap=self.max_bytes, columns=len(result.keys()))
        while not stop.is_set() and (want := pacer.next_rows()):
            try:
                batch = [tuple(row) for row in result.fetchmany(want)]
            except sa.exc.DBAPIError as exc:
                if not _too_big(exc):
                    raise
                return pacer.rows, str(budget.value_too_big(pacer.rows, want, value_cap))
            if not batch:
                break
            size = budget.rows_bytes(batch)
            wide: Stop | None = None
            if size > ROW_CAP:
                index, width = budget.widest_row(batch)
                if index >= 0:
                    wide = budget.row_too_wide(pacer.rows + index, pacer.rows + index + 1, width)
                    batch = batch[:index]
                    size = budget.rows_bytes(batch)
            try:
                pacer.took(len(batch), size)
            except Stop as too_big:
                return pacer.rows, str(too_big)
            read = pacer.rows
            keep = batch if read <= limit else batch[: len(batch) - (read - limit)]
            if keep:
                _sync_sink(sink.add, keep)
            if wide is not None:
                return pacer.rows, str(wide)
        return pacer.rows, ""

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


async def _to_sink(writer: Executor, call: Callable[..., None], *args: Any) -> None:
    """A sink's (blocking) call in the query's writer thread; its OS errors are not the database's."""
    try:
        await asyncio.get_running_loop().run_in_executor(writer, call, *args)
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


#: DuckDB's own wall behind the guard's refusal of tables named like files: no file, URL or
#: extension a query can reach (``read_csv``, a replacement scan, ``ATTACH``, ``COPY``,
#: ``INSTALL``/``LOAD``), and no ``SET`` that could lift it. The database file itself opens.
DUCKDB_CONFIG: dict[str, Any] = {"enable_external_access": False, "lock_configuration": True}


def _walled_duckdb(url: URL) -> tuple[URL, dict[str, Any]]:
    """The URL and engine options of a DuckDB source: :data:`DUCKDB_CONFIG` given at connect
    (duckdb_engine passes ``connect_args["config"]`` to ``duckdb.connect``), and dropped from the
    URL's query, whose keys duckdb_engine would let override it."""
    walled = url.difference_update_query(list(DUCKDB_CONFIG))
    return walled, {"connect_args": {"config": dict(DUCKDB_CONFIG)}}


def _query_only(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA query_only = ON")
    cursor.close()
    dbapi_connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, ROW_CAP)


#: An SQLite value may always be this long, however many columns the result has.
_MIN_VALUE_CAP = 1024
#: The columns assumed when the result's cannot be learnt beforehand.
_UNKNOWN_COLUMNS = 32


def _bound_sqlite_values(conn: sa.Connection, query: str) -> int:
    """Hold every value SQLite makes for ``query`` (also on the way: a ``length()`` reads its
    argument whole) to the row cap ÷ the result's columns, and return that cap.

    SQLite runs in the bot's process and makes a whole row before the driver hands it over;
    its length limit refuses a longer value as it is made ("string or blob too big"). The
    columns come from the query wrapped in ``LIMIT 0`` (prepared, no row made)."""
    dbapi = _sqlite(conn)
    dbapi.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, ROW_CAP)
    try:
        probe = conn.exec_driver_sql(f"SELECT * FROM (\n{_without_trailing_semicolons(query)}\n) LIMIT 0")
        columns = len(probe.keys())
        probe.close()
    except sa.exc.DBAPIError:
        columns = _UNKNOWN_COLUMNS  # running the query itself says what is wrong with it
    cap = max(ROW_CAP // max(columns, 1), _MIN_VALUE_CAP)
    dbapi.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, cap)
    return cap


def _sqlite(conn: sa.Connection) -> sqlite3.Connection:
    return cast(sqlite3.Connection, conn.connection.dbapi_connection)


def _without_trailing_semicolons(query: str) -> str:
    """``query`` up to its last token that is not a ``;`` (comments after it dropped)."""
    try:
        tokens = Dialect.get_or_raise("sqlite").tokenize(query)
    except SqlglotError:
        return query  # the probe fails and the query itself says what is wrong with it
    while tokens and tokens[-1].token_type.name == "SEMICOLON":
        tokens.pop()
    return query[: tokens[-1].end + 1] if tokens else query


def _too_big(exc: sa.exc.DBAPIError) -> bool:
    """SQLite refused to make a value over its length limit."""
    return isinstance(exc.orig, sqlite3.Error) and "too big" in str(exc.orig)


def _closed(conn: Any) -> bool:
    """Whether an asyncpg pool connection is closed (a closed one has left the pool's proxy)."""
    try:
        return bool(conn.is_closed())
    except asyncpg.InterfaceError:
        return True


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
