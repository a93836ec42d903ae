"""The function allow-list against a real PostgreSQL, through the real tool, as a superuser
(the role a careless deployment gives the bot): a ``SELECT`` that writes through a function
is refused before it is sent, and nothing is written."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio
from sqlalchemy.engine import make_url

from bot.sources.registry import Sources
from bot.sources.settings import SourceSettings
from bot.sources.tool import SqlTool
from kernels.host.workspace import Workspace
from kernels.seam.result import ExecutionResult
from tests.sources.conftest import ORDERS_SQL, count_rows

MakeSettings = Callable[..., SourceSettings]
DBLINK = sorted(Path("/usr/share/postgresql").glob("*/extension/dblink.control"))


class RecordingKernel:
    def __init__(self) -> None:
        self.codes: list[str] = []

    async def execute(self, code: str, timeout: float | None = None) -> ExecutionResult:
        self.codes.append(code)
        return ExecutionResult()


@pytest_asyncio.fixture
async def shop(pg_url: str) -> AsyncIterator[str]:
    """The database's URL, holding ``orders`` (3 rows)."""
    conn = await asyncpg.connect(pg_url)
    try:
        for statement in ORDERS_SQL:
            await conn.execute(statement)
    finally:
        await conn.close()
    yield pg_url


async def ask(url: str, settings: MakeSettings, tmp_path: Path, query: str) -> tuple[str, list[str]]:
    sources = Sources({"shop": settings(url)})
    kernel = RecordingKernel()
    (tmp_path / "ws").mkdir(exist_ok=True)
    workspace = Workspace(tmp_path / "ws", max_file_bytes=2**26, quota_bytes=2**27)
    try:
        tool = await SqlTool.open(sources=sources, granted=["shop"], kernel=kernel, workspace=workspace)
        return await tool.call(json.dumps({"query": query})), kernel.codes
    finally:
        await sources.close()


async def large_objects(url: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM pg_largeobject_metadata"))
    finally:
        await conn.close()


async def test_large_objects_are_refused_and_none_is_made(
    shop: str, source_settings: MakeSettings, tmp_path: Path
) -> None:
    told, ran = await ask(shop, source_settings, tmp_path, "SELECT lo_from_bytea(0, 'x') FROM generate_series(1, 50)")
    assert told.startswith(
        "Refused: nothing was sent to the database, because it calls lo_from_bytea(), which is not on the list "
        "of functions a query may call."
    ), told
    assert ran == []
    assert await large_objects(shop) == 0


@pytest.mark.skipif(not DBLINK, reason="PostgreSQL's dblink extension is not installed (postgresql-contrib)")
async def test_dblink_exec_is_refused_and_no_row_is_deleted(
    shop: str, source_settings: MakeSettings, tmp_path: Path
) -> None:
    conn = await asyncpg.connect(shop)
    try:
        await conn.execute("CREATE EXTENSION dblink")
    finally:
        await conn.close()
    url = make_url(shop)
    other_session = f"host={url.host} port={url.port} dbname={url.database} user={url.username}"
    for query in [
        f"SELECT dblink_exec('{other_session}', 'DELETE FROM orders')",
        f"SELECT * FROM dblink('{other_session}', 'DELETE FROM orders RETURNING id') AS t(id int)",
    ]:
        told, ran = await ask(shop, source_settings, tmp_path, query)
        assert told.startswith("Refused: nothing was sent to the database, because it calls dblink"), told
        assert ran == []
    assert await count_rows(shop) == 3


async def test_an_analysis_query_still_runs(shop: str, source_settings: MakeSettings, tmp_path: Path) -> None:
    told, ran = await ask(
        shop,
        source_settings,
        tmp_path,
        "SELECT date_trunc('month', placed) AS month, customer, round(sum(amount), 1) AS total, "
        "string_agg(id::text, ',' ORDER BY id) AS ids, row_number() OVER (ORDER BY customer) AS n "
        "FROM orders GROUP BY 1, 2 ORDER BY 1, 2",
    )
    assert "3 rows × 5 columns" in told, told
    assert len(ran) == 1
