"""The ``sql`` tool in whole turns: real kernels, the real openai client against the scripted
model server, real PostgreSQL and SQLite sources, an in-memory chat."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import nbformat
import pytest
import pytest_asyncio

from bot.app import Core
from tests.conftest import make_settings
from tests.fakes.memory import MemoryChat, MemoryOutbox
from tests.fakes.openai_server import ScriptedOpenAI, answer, raw_tool_call, tool_call
from tests.security.conftest import SKIP_REASON
from tests.sources.conftest import PASSWORD, count_rows


def sql_call(query: str, **arguments: Any) -> Any:
    return raw_tool_call(json.dumps({"query": query, **arguments}), name="sql")


def tool_results(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


def echo_last_tool() -> Any:
    return lambda request: answer("Seen: " + tool_results(request)[-1])


def offered(request: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["function"]["name"]: t["function"] for t in request.get("tools", [])}


@asynccontextmanager
async def open_core(
    tmp_path: Path, llm: ScriptedOpenAI, pg_reader_url: str, sqlite_file: Path, sandbox: str
) -> AsyncIterator[Core]:
    settings = make_settings(
        tmp_path,
        llm_url=llm.base_url,
        kernels={"sandbox": sandbox},
        sources={
            "warehouse": {"url": pg_reader_url, "description": "Orders of the shop", "statement_timeout_s": 5},
            "shop": {"url": f"sqlite:///{sqlite_file}", "max_rows": 2},
            "gone": {"url": f"postgresql://reader:{PASSWORD}@127.0.0.1:9/nowhere", "statement_timeout_s": 2},
        },
        channels={"test:C1": {"sources": ["warehouse"]}, "test:C3": {"sources": ["shop", "gone"]}},
    )
    async with Core.open(settings) as running:
        yield running


@pytest_asyncio.fixture
async def core(tmp_path: Path, llm: ScriptedOpenAI, pg_reader_url: str, sqlite_file: Path) -> AsyncIterator[Core]:
    async with open_core(tmp_path, llm, pg_reader_url, sqlite_file, "none") as running:
        yield running


@pytest_asyncio.fixture(params=["none", "bwrap"])
async def any_core(
    request: pytest.FixtureRequest, tmp_path: Path, llm: ScriptedOpenAI, pg_reader_url: str, sqlite_file: Path
) -> AsyncIterator[Core]:
    """Kernels unsandboxed (they see every process), then in bubblewrap as another uid."""
    if request.param == "bwrap" and SKIP_REASON:
        pytest.skip(SKIP_REASON)
    async with open_core(tmp_path, llm, pg_reader_url, sqlite_file, request.param) as running:
        yield running


@pytest_asyncio.fixture
async def llm() -> AsyncIterator[ScriptedOpenAI]:
    async with ScriptedOpenAI() as server:
        yield server


async def test_sql_then_python_on_the_dataframe(any_core: Core, llm: ScriptedOpenAI) -> None:
    core = any_core
    chat = MemoryChat(core.dispatcher, channel="C1")
    llm.script(
        sql_call("SELECT customer, amount, placed FROM orders ORDER BY id", name="orders"),
        tool_call("print(orders.groupby('customer')['amount'].sum().to_dict(), orders['placed'].dtype)"),
        echo_last_tool(),
    )
    out = await chat.say("total per customer?")

    first = llm.requests[0]
    sql_tool = offered(first)["sql"]
    assert "orders(" in sql_tool["description"] and "Orders of the shop" in sql_tool["description"]
    loaded = tool_results(llm.requests[1])[0]
    assert "`orders` is now a pandas DataFrame" in loaded and "3 rows × 3 columns" in loaded
    assert "customer (string)" in loaded and "amount (double)" in loaded and "ada | 12.5" in loaded
    assert "CUT" not in loaded
    assert "{'ada': 42.5, 'bob': 7.25}" in out.reply.text
    assert (
        "update",
        "🗄️ Querying `warehouse`: `SELECT customer, amount, placed FROM orders ORDER BY id`",
    ) in out.progress_log
    assert out.reply.files == ()  # the rows' file is not sent back as a file of the turn
    workspace = core.pool.workspaces.for_key(str(chat.key()))
    assert not [name for name in os.listdir(workspace.path / ".threadbook") if name.endswith(".parquet")]

    exported = (await chat.say("export", mentioned=False)).reply
    with exported.files[0].open_reader() as reader:
        notebook = nbformat.reads(reader.read().decode(), as_version=4)
    nbformat.validate(notebook)
    sources = [(c.cell_type, c.source) for c in notebook.cells]
    at = next(
        i for i, (kind, text) in enumerate(sources) if kind == "markdown" and text.startswith("```sql\n%%sql → orders")
    )
    assert "SELECT customer, amount, placed FROM orders ORDER BY id" in sources[at][1]
    loader = notebook.cells[at + 1]
    assert loader.cell_type == "code" and "read_parquet" in loader.source
    assert any("ada" in json.dumps(o) for o in loader.outputs)  # the first rows, as the kernel showed them
    assert "orders.groupby" in notebook.cells[at + 2].source


async def test_delete_and_several_statements_are_refused_and_change_nothing(
    core: Core, llm: ScriptedOpenAI, pg_reader_url: str
) -> None:
    chat = MemoryChat(core.dispatcher, channel="C1")
    llm.script(
        sql_call("DELETE FROM orders"),
        sql_call("SELECT 1; DELETE FROM orders"),
        sql_call("WITH d AS (DELETE FROM orders RETURNING *) SELECT * FROM d"),
        answer("I may only read."),
    )
    await chat.say("delete the orders")
    refusals = tool_results(llm.requests[-1])
    assert len(refusals) == 3
    assert all(text.startswith("Refused: nothing was sent to the database") for text in refusals)
    assert "DELETE" in refusals[0] and "2 statements" in refusals[1] and "DELETE" in refusals[2]
    assert await count_rows(pg_reader_url) == 3


async def test_a_channel_without_the_grant_has_no_sql(core: Core, llm: ScriptedOpenAI) -> None:
    chat = MemoryChat(core.dispatcher, channel="C2")
    llm.script(sql_call("SELECT * FROM orders", source="warehouse"), answer("no"))
    await chat.say("orders?")
    assert set(offered(llm.requests[0])) == {"python"}
    assert "warehouse" not in json.dumps(llm.requests[0])
    refused = tool_results(llm.requests[1])[0]
    assert "no tool named 'sql'" in refused
    workspace = core.pool.workspaces.for_key(str(chat.key()))
    assert not (workspace.path / ".threadbook").exists() or not os.listdir(workspace.path / ".threadbook")


async def test_a_source_of_another_channel_is_refused_by_name(core: Core, llm: ScriptedOpenAI) -> None:
    chat = MemoryChat(core.dispatcher, channel="C3")
    llm.script(sql_call("SELECT * FROM orders", source="warehouse"), answer("no"))
    await chat.say("orders?")
    assert offered(llm.requests[0])["sql"]["parameters"]["properties"]["source"]["enum"] == ["shop", "gone"]
    assert "there is no source 'warehouse' in this channel" in tool_results(llm.requests[1])[0]


async def test_max_rows_cut_on_sqlite_is_told(core: Core, llm: ScriptedOpenAI) -> None:
    chat = MemoryChat(core.dispatcher, channel="C3")
    llm.script(
        sql_call("SELECT * FROM orders ORDER BY id", source="shop"), tool_call("print(len(result))"), echo_last_tool()
    )
    out = await chat.say("orders?")
    told = tool_results(llm.requests[1])[0]
    assert "2 rows × 5 columns" in told and "CUT at max_rows = 2" in told
    assert out.reply.text.endswith("stdout:\n2")


def _hunt(text: str) -> list[str]:
    return [line for line in text.splitlines() if PASSWORD in line]


async def test_the_password_is_nowhere_outside_the_bot(any_core: Core, llm: ScriptedOpenAI) -> None:
    chat = MemoryChat(any_core.dispatcher, channel="C3")
    outs: list[MemoryOutbox] = []
    # A query that works, one that fails in the database, one on a source that cannot be reached.
    llm.script(
        sql_call("SELECT * FROM orders", source="shop"),
        sql_call("SELECT nope FROM orders", source="shop"),
        sql_call("SELECT 1", source="gone"),
        answer("done"),
    )
    outs.append(await chat.say("query it all"))
    hunt = (
        "import os, glob\n"
        f"secret = {PASSWORD[::-1]!r}[::-1]\n"  # the code itself must not hold it, or the hunt finds the hunt
        "found = []\n"
        "found += [k for k, v in os.environ.items() if secret in v or secret in k]\n"
        "for path in glob.glob('/proc/[0-9]*/environ') + glob.glob('/proc/[0-9]*/cmdline'):\n"
        "    try:\n"
        "        if secret.encode() in open(path, 'rb').read(): found.append(path)\n"
        "    except OSError: pass\n"
        "for top, _, names in os.walk('.'):\n"
        "    for name in names:\n"
        "        path = os.path.join(top, name)\n"
        "        try:\n"
        "            if secret.encode() in open(path, 'rb').read(): found.append(path)\n"
        "        except OSError: pass\n"
        "print('FOUND', found)"
    )
    llm.script(tool_call(hunt), echo_last_tool())
    outs.append(await chat.say("hunt", mentioned=False))
    assert "FOUND []" in outs[-1].reply.text
    outs.append(await chat.say("export", mentioned=False))

    results = [text for request in llm.requests for text in tool_results(request)]
    assert any("database refused or failed" in t and "nope" in t for t in results)
    assert any("could not be reached" in t for t in results)
    assert all(PASSWORD not in t and "postgresql://" not in t for t in results)
    assert _hunt(json.dumps(llm.requests)) == []
    for out in outs:
        posted = [out.reply.text if out.replies else "", *out.notices, *(str(s) for s in out.progress_log)]
        assert _hunt("\n".join(posted)) == []
        for file in out.reply.files if out.replies else ():
            with file.open_reader() as reader:
                assert PASSWORD.encode() not in reader.read()


async def test_stop_cancels_a_running_query_on_the_server(core: Core, llm: ScriptedOpenAI, pg_url: str) -> None:
    chat = MemoryChat(core.dispatcher, channel="C1")
    llm.script(sql_call("SELECT pg_sleep(4) AS slept"), tool_call("print('must not run')"), answer("stopped"))
    turn = asyncio.create_task(chat.say("slow one"))
    while not await _sleeping(pg_url):
        await asyncio.sleep(0.05)
    assert await core.dispatcher.stop(chat.key(), user_id="U1")
    out = await turn
    told = tool_results(llm.requests[1])[0]
    assert told.startswith("Not run: the user pressed Stop")
    assert not await _sleeping(pg_url)  # cancelled on the server, not left to finish
    assert await core.store.transcripts.cell_count(chat.key()) == 0  # neither the loading cell nor the python after it
    assert "Stopped on request" in out.reply.text


async def _sleeping(pg_url: str) -> bool:
    conn = await asyncpg.connect(pg_url)
    try:
        return bool(
            await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(4)%' AND state = 'active'"
            )
        )
    finally:
        await conn.close()


async def test_query_time_counts_in_the_kernel_seconds_budget(core: Core, llm: ScriptedOpenAI) -> None:
    chat = MemoryChat(core.dispatcher, channel="C1")
    llm.script(sql_call("SELECT 1 AS one FROM pg_sleep(1.5)"), answer("slept"))
    await chat.say("sleep in the database")
    # The loading cell costs the kernel milliseconds; the query at least 1.5 s.
    assert sum(row.kernel_s for row in await core.store.usage.spent(since=0, user_id="U1")) >= 1.5
