"""The parser's guard: one read query passes, anything else is refused before it is sent;
credentials scrubbed; the tool's answer stays short."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from bot.sources.cell import loader_code
from bot.sources.guard import QueryRefused, check_query
from bot.sources.registry import Sources
from bot.sources.scrub import scrub, secrets_of
from bot.sources.settings import SourceSettings
from bot.sources.tool import SqlTool
from kernels.host.workspace import Workspace
from kernels.seam.result import ExecutionResult

READS = [
    "SELECT * FROM orders",
    "select customer, sum(amount) from orders group by 1 order by 2 desc limit 5;",
    "WITH t AS (SELECT 1 AS x) SELECT x FROM t",
    "SELECT 1 UNION ALL SELECT 2",
    "(SELECT 1)",
    "SELECT 'a; DELETE FROM orders' AS text",
    "SELECT 1 -- ; DELETE FROM orders",
]
REFUSED = {
    "DELETE FROM orders": "DELETE",
    "delete from orders where id = 1": "DELETE",
    "UPDATE orders SET amount = 0": "UPDATE",
    "INSERT INTO orders VALUES (9)": "INSERT",
    "SELECT 1; DELETE FROM orders": "2 statements",
    "SELECT 1; SELECT 2": "2 statements",
    "WITH d AS (DELETE FROM orders RETURNING *) SELECT * FROM d": "DELETE",
    "SELECT * INTO copy FROM orders": "INTO",
    "SELECT * FROM orders FOR UPDATE": "FOR UPDATE",
    "DROP TABLE orders": "DROP",
    "TRUNCATE orders": "TRUNCATE",
    "CREATE TABLE x (a int)": "CREATE",
    "COPY orders TO STDOUT": "COPY",
    "SET statement_timeout = 0": "SET",
    "BEGIN": "TRANSACTION",
    "VACUUM": "VACUUM",
    "": "empty",
    "  -- only a comment": "empty",
    "SELECT FROM WHERE (": "could not be parsed",
}


@pytest.mark.parametrize("query", READS)
@pytest.mark.parametrize("dialect", ["postgres", "sqlite"])
def test_reads_pass(query: str, dialect: str) -> None:
    check_query(query, dialect)


@pytest.mark.parametrize("query", list(REFUSED))
def test_everything_else_is_refused_with_a_reason(query: str) -> None:
    with pytest.raises(QueryRefused) as refused:
        check_query(query, "postgres")
    assert REFUSED[query] in str(refused.value)


def test_sqlite_pragma_and_attach_are_refused() -> None:
    for query in ["PRAGMA writable_schema = 1", "ATTACH DATABASE 'x.db' AS x"]:
        with pytest.raises(QueryRefused):
            check_query(query, "sqlite")


def test_scrub_hides_the_url_and_the_password() -> None:
    url = make_url("postgresql://reader:s3cret-pass@db.internal:5432/shop")
    text = (
        'connect to "postgresql://reader:s3cret-pass@db.internal:5432/shop" failed: password s3cret-pass; '
        "reader:s3cret-pass@db.internal password=s3cret-pass"
    )
    cleaned = scrub(text, secrets_of(url))
    assert "s3cret-pass" not in cleaned and "postgresql://" not in cleaned and "db.internal:5432" not in cleaned


async def test_a_wide_result_is_summed_up_briefly(tmp_path: Path) -> None:
    db = tmp_path / "wide.db"
    columns = ", ".join(f"c{i} integer" for i in range(200))
    with sqlite3.connect(db) as conn:
        conn.execute(f"CREATE TABLE wide ({columns})")
        conn.execute(f"INSERT INTO wide VALUES ({', '.join('1' for _ in range(200))})")
    sources = Sources({"wide": SourceSettings.model_validate({"url": f"sqlite:///{db}"})})
    ran: list[str] = []

    class Kernel:
        async def execute(self, code: str, timeout: float | None = None) -> ExecutionResult:
            ran.append(code)
            return ExecutionResult()

    (tmp_path / "ws").mkdir()
    workspace = Workspace(tmp_path / "ws", max_file_bytes=2**30, quota_bytes=2**30)
    tool = await SqlTool.open(sources=sources, granted=["wide"], kernel=Kernel(), workspace=workspace)
    try:
        told = await tool.call(json.dumps({"query": "SELECT * FROM wide", "name": "w"}))
    finally:
        await sources.close()
    assert "1 row × 200 columns" in told and "188 more columns" in told and "see `w.dtypes`" in told
    assert len(told) < 3_000
    assert ran == [loader_code("w")]
    assert not list((tmp_path / "ws" / ".threadbook").iterdir())  # the file is gone once loaded
