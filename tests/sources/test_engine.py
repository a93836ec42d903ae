"""Sources against real databases: rows and types into Parquet, max_rows, timeouts, the
read-only session (with the parser's guard bypassed), scrubbed errors, the catalogue."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import asyncpg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import pytest_asyncio

from bot.sources.catalogue import Catalogue, format_tables
from bot.sources.engine import QueryFailed, QueryTimedOut, Source, TableColumns, open_source
from bot.sources.parquet import ParquetSink
from bot.sources.settings import SourceSettings
from tests.sources.conftest import PASSWORD, count_rows

MakeSettings = Callable[..., SourceSettings]


@pytest_asyncio.fixture
async def pg(pg_reader_url: str, source_settings: MakeSettings) -> AsyncIterator[Source]:
    source = open_source("warehouse", source_settings(pg_reader_url, statement_timeout_s=2, max_rows=1000))
    yield source
    await source.close()


@pytest_asyncio.fixture
async def lite(sqlite_file: Path, source_settings: MakeSettings) -> AsyncIterator[Source]:
    source = open_source(
        "shop", source_settings(f"sqlite:///{sqlite_file}", statement_timeout_s=1, max_rows=1000, max_concurrent=1)
    )
    yield source
    await source.close()


@pytest_asyncio.fixture(params=["pg", "lite"])
async def either(
    request: pytest.FixtureRequest, source_settings: MakeSettings, tmp_path: Path
) -> AsyncIterator[Source]:
    """Each kind of source in turn (PostgreSQL, then SQLite), named by ``source.dialect``."""
    if request.param == "pg":
        url = str(request.getfixturevalue("pg_reader_url"))
    else:
        url = f"sqlite:///{request.getfixturevalue('sqlite_file')}"
    source = open_source("either", source_settings(url, statement_timeout_s=2, max_rows=1000))
    yield source
    await source.close()


def sink_in(folder: Path, name: str = "out.parquet") -> tuple[ParquetSink, int]:
    folder.mkdir(exist_ok=True)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    return ParquetSink(fd, name, limit_bytes=50 * 2**20), fd


async def fetch_table(
    source: Source, query: str, folder: Path, *, max_rows: int | None = None
) -> tuple[pa.Table, bool]:
    sink, fd = sink_in(folder)
    try:
        fetched = await source.fetch(query, sink, max_rows=max_rows)
        sink.finish()
    except BaseException:
        sink.abort()
        raise
    finally:
        os.close(fd)
    table = pq.read_table(folder / "out.parquet")
    assert table.num_rows == fetched.rows
    return table, fetched.cut


async def test_postgres_rows_arrive_with_their_types(pg: Source, tmp_path: Path) -> None:
    table, cut = await fetch_table(pg, "SELECT id, customer, amount, placed, paid FROM orders ORDER BY id", tmp_path)
    assert not cut
    assert table.column("customer").to_pylist() == ["ada", "bob", "ada"]
    assert table.column("amount").to_pylist() == [12.5, 7.25, 30.0]
    assert [str(t) for t in table.schema.types] == ["int32", "string", "double", "date32[day]", "bool"]
    assert [p.name for p in (tmp_path).iterdir()] == ["out.parquet"]  # no temporary file left


async def test_sqlite_rows_arrive(lite: Source, tmp_path: Path) -> None:
    table, _ = await fetch_table(
        lite, "SELECT customer, sum(amount) AS total FROM orders GROUP BY 1 ORDER BY 1", tmp_path
    )
    assert table.to_pylist() == [{"customer": "ada", "total": 42.5}, {"customer": "bob", "total": 7.25}]


async def test_max_rows_cuts_the_result(either: Source, tmp_path: Path) -> None:
    source = either
    series = (
        "SELECT generate_series(1, 5000) AS n"
        if source.dialect == "postgresql"
        else ("WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 5000) SELECT n FROM s")
    )
    table, cut = await fetch_table(source, series, tmp_path, max_rows=1234)
    assert cut and table.num_rows == 1234 and table.column("n").to_pylist()[-1] == 1234
    whole, cut = await fetch_table(source, series, tmp_path / "again", max_rows=5000)
    assert not cut and whole.num_rows == 5000


async def test_postgres_timeout_cancels_on_the_server(pg: Source, tmp_path: Path, pg_url: str) -> None:
    sink, fd = sink_in(tmp_path)
    with pytest.raises(QueryTimedOut, match="longer than 2 s"):
        await pg.fetch("SELECT pg_sleep(30)", sink)
    sink.abort()
    os.close(fd)
    conn = await asyncpg.connect(pg_url)
    try:  # nothing of the query is left running on the server
        running = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(30)' AND state = 'active'"
        )
    finally:
        await conn.close()
    assert running == 0
    table, _ = await fetch_table(pg, "SELECT 1 AS one", tmp_path / "after")  # the pool still works
    assert table.to_pylist() == [{"one": 1}]


class SlowSink(ParquetSink):
    """Takes its time over each batch: the server is idle, only the bot's deadline can stop it."""

    def add(self, rows: object) -> None:
        time.sleep(0.5)


async def test_postgres_bot_side_deadline_covers_the_whole_fetch(pg: Source, tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    sink = SlowSink(fd, "slow.parquet", limit_bytes=2**30)
    with pytest.raises(QueryTimedOut):  # 10 batches × 0.5 s against a 2 s deadline
        await pg.fetch("SELECT n FROM generate_series(1, 200000) n", sink, max_rows=200_000)
    sink.abort()
    os.close(fd)


async def test_sqlite_timeout_interrupts_the_query(lite: Source, tmp_path: Path) -> None:
    sink, fd = sink_in(tmp_path)
    with pytest.raises(QueryTimedOut):
        await lite.fetch("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c", sink)
    sink.abort()
    os.close(fd)
    # One query at a time on this source: the next one runs only once the endless one has
    # really ended (interrupted), not merely been given up on.
    table, _ = await fetch_table(lite, "SELECT count(*) AS n FROM orders", tmp_path / "after")
    assert table.to_pylist() == [{"n": 3}]


async def test_postgres_session_is_read_only(pg: Source, tmp_path: Path, pg_url: str) -> None:
    # The parser's guard is bypassed here: the session alone must refuse the write.
    for index, write in enumerate(
        [
            "DELETE FROM orders RETURNING id",
            "WITH d AS (DELETE FROM orders RETURNING id) SELECT * FROM d",
            "SELECT 1; DELETE FROM orders",
        ]  # the last: the extended protocol takes one statement only
    ):
        sink, fd = sink_in(tmp_path, f"{index}.parquet")
        with pytest.raises(QueryFailed, match="read-only transaction|multiple commands"):
            await pg.fetch(write, sink)
        sink.abort()
        os.close(fd)
    assert await count_rows(pg_url) == 3


async def test_sqlite_file_is_opened_read_only(lite: Source, tmp_path: Path, sqlite_file: Path) -> None:
    for index, write in enumerate(["DELETE FROM orders RETURNING id", "SELECT 1; DELETE FROM orders"]):
        sink, fd = sink_in(tmp_path, f"{index}.parquet")
        with pytest.raises(QueryFailed, match="readonly|read-only|one statement"):
            await lite.fetch(write, sink)
        sink.abort()
        os.close(fd)
    with sqlite3.connect(sqlite_file) as conn:
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (3,)


async def test_connection_errors_name_no_credentials(source_settings: MakeSettings, tmp_path: Path) -> None:
    url = f"postgresql://reader:{PASSWORD}@127.0.0.1:9/nowhere"
    source = open_source("gone", source_settings(url, statement_timeout_s=2))
    sink, fd = sink_in(tmp_path)
    try:
        with pytest.raises(QueryFailed) as raised:
            await source.fetch("SELECT 1", sink)
    finally:
        sink.abort()
        os.close(fd)
        await source.close()
    assert PASSWORD not in str(raised.value) and "postgresql://" not in str(raised.value)


async def test_tables_and_columns_are_listed(either: Source) -> None:
    tables = {t.table: dict(t.columns) for t in await either.tables()}
    assert set(tables["orders"]) == {"id", "customer", "amount", "placed", "paid"}


async def test_quota_stops_a_result_too_large(pg: Source, tmp_path: Path) -> None:
    from bot.sources.parquet import ResultTooLarge

    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    sink = ParquetSink(fd, "big.parquet", limit_bytes=10_000)
    try:
        with pytest.raises(ResultTooLarge):
            await pg.fetch("SELECT md5(n::text) AS h FROM generate_series(1, 50000) n", sink)
    finally:
        sink.abort()
        os.close(fd)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("limit", [1, 2])
async def test_queries_beyond_max_concurrent_wait_for_a_connection(
    limit: int, pg_reader_url: str, source_settings: MakeSettings, tmp_path: Path
) -> None:
    source = open_source("limited", source_settings(pg_reader_url, max_concurrent=limit))
    folders = [tmp_path / str(i) for i in range(2)]
    try:
        tables = await asyncio.gather(
            *(fetch_table(source, "SELECT pg_backend_pid() AS pid FROM pg_sleep(0.3)", folder) for folder in folders)
        )
    finally:
        await source.close()
    backends = {table.column("pid").to_pylist()[0] for table, _ in tables}
    assert len(backends) == limit  # one connection served both in turn, or two ran side by side


async def test_the_catalogue_is_cached_and_refreshed_on_demand(pg: Source, pg_url: str) -> None:
    catalogue = Catalogue()
    first = await catalogue.describe(pg)
    assert "- orders(id integer, customer text, amount numeric, placed date, paid boolean)" in first
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute("CREATE TABLE refunds (order_id integer, reason text)")
        await conn.execute("CREATE TABLE secrets (token text)")  # not granted: not listed
        await conn.execute("GRANT SELECT ON refunds TO reader")
    finally:
        await conn.close()
    assert "refunds" not in await catalogue.describe(pg)  # cached
    again = await catalogue.describe(pg, refresh=True)
    assert "- refunds(order_id integer, reason text)" in again and "secrets" not in again


def test_a_long_catalogue_is_cut_and_says_so() -> None:
    tables = [TableColumns(f"t{i}", tuple((f"c{j}", "integer") for j in range(20))) for i in range(100)]
    text = format_tables("Source `x`", tables, limit=2_000)
    assert len(text) <= 2_100 and text.endswith("more tables (query the database's catalogue to list them)")
