"""A channel's MCP servers in whole turns: real kernels, the real openai client against the
scripted model server, real MCP servers (streamable HTTP behind a bearer token, and stdio),
an in-memory chat."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import nbformat
import pytest
import pytest_asyncio

from bot import metrics
from bot.app import Core, serve_ops
from bot.mcp.result import HEAD_CHARS
from tests.conftest import make_settings
from tests.fakes.memory import MemoryChat, MemoryOutbox
from tests.fakes.openai_server import ScriptedOpenAI, answer, raw_tool_call, tool_call
from tests.mcp.conftest import STDIO_TOKEN, TOKEN, HttpServer, stdio_settings
from tests.security.conftest import SKIP_REASON

MB3 = 3_000_000


def mcp_call(function: str, **arguments: Any) -> Any:
    return raw_tool_call(json.dumps(arguments), name=function)


def tool_results(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


def echo_last_tool() -> Any:
    return lambda request: answer("Seen: " + tool_results(request)[-1])


def offered(request: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["function"]["name"]: t["function"] for t in request.get("tools", [])}


@asynccontextmanager
async def open_core(tmp_path: Path, llm: ScriptedOpenAI, server: HttpServer, sandbox: str) -> AsyncIterator[Core]:
    settings = make_settings(
        tmp_path,
        llm_url=llm.base_url,
        kernels={"sandbox": sandbox},
        mcp={
            "tracker": server.settings(description="The team's issue tracker", timeout_s=2),
            "local": stdio_settings(description="Local helpers"),
        },
        channels={"test:C1": {"mcp": ["tracker", "local"]}, "test:C2": {}},
    )
    async with Core.open(settings) as running:
        yield running


@pytest_asyncio.fixture
async def llm() -> AsyncIterator[ScriptedOpenAI]:
    async with ScriptedOpenAI() as server:
        yield server


@pytest_asyncio.fixture
async def core(tmp_path: Path, llm: ScriptedOpenAI, http_server: HttpServer) -> AsyncIterator[Core]:
    async with open_core(tmp_path, llm, http_server, "none") as running:
        yield running


@pytest_asyncio.fixture(params=["none", "bwrap"])
async def any_core(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    llm: ScriptedOpenAI,
    http_server: HttpServer,
    caplog: pytest.LogCaptureFixture,
) -> AsyncIterator[Core]:
    """Kernels unsandboxed (they see every process of the bot's user), then in bubblewrap as another uid."""
    if request.param == "bwrap" and SKIP_REASON:
        pytest.skip(SKIP_REASON)
    caplog.set_level(logging.DEBUG)  # what start-up logs (the stdio server's stderr) is hunted too
    async with open_core(tmp_path, llm, http_server, request.param) as running:
        yield running


async def test_a_granted_channel_calls_a_tool_and_uses_its_result_in_the_kernel(
    any_core: Core, llm: ScriptedOpenAI
) -> None:
    chat = MemoryChat(any_core.dispatcher, channel="C1")
    llm.script(
        mcp_call("tracker__table"),
        tool_call("import pandas as pd\ndf = pd.read_csv('tracker__table-sales.csv')\nprint(df.amount.sum())"),
        mcp_call("local__add", a=40, b=2),
        echo_last_tool(),
    )
    out = await chat.say("total sales?")

    tools = offered(llm.requests[0])
    assert {"python", "tracker__echo", "tracker__table", "local__echo", "local__add"} <= set(tools)
    assert "tracker__drop_table" not in tools and "local__drop_table" not in tools  # destructive: not offered
    assert tools["tracker__echo"]["description"] == "[The team's issue tracker] Echo the text back."
    assert tools["tracker__echo"]["parameters"]["properties"]["text"]["type"] == "string"
    saved = tool_results(llm.requests[1])[0]
    assert saved == "A resource (text/csv, 32 characters) is saved as `tracker__table-sales.csv`."
    assert "stdout:\n42" in tool_results(llm.requests[2])[-1]  # the kernel read the file the tool's result became
    assert out.reply.text == "Seen: 42.0"
    assert ("update", "🔌 Calling `tracker` → `table`") in out.progress_log
    assert [f.name for f in out.reply.files] == []  # the saved result is the model's to use, not sent back

    exported = (await chat.say("export", mentioned=False)).reply
    with exported.files[0].open_reader() as reader:
        notebook = nbformat.reads(reader.read().decode(), as_version=4)
    nbformat.validate(notebook)
    markdown = [c.source for c in notebook.cells if c.cell_type == "markdown"]
    call = next(m for m in markdown if m.startswith("🔌 **MCP** `local` → `add`"))
    assert '"a": 40' in call and '"b": 2' in call and "> 42.0" in call
    assert any(m.startswith("🔌 **MCP** `tracker` → `table`") and "tracker__table-sales.csv" in m for m in markdown)
    assert any("read_csv" in c.source for c in notebook.cells if c.cell_type == "code")


async def test_a_channel_without_the_grant_is_offered_nothing(core: Core, llm: ScriptedOpenAI) -> None:
    chat = MemoryChat(core.dispatcher, channel="C2")
    llm.script(mcp_call("tracker__echo", text="hi"), answer("no"))
    await chat.say("echo?")
    assert set(offered(llm.requests[0])) == {"python"}
    assert "tracker" not in json.dumps(llm.requests[0]) and "Local helpers" not in json.dumps(llm.requests[0])
    assert "no tool named 'tracker__echo'" in tool_results(llm.requests[1])[0]
    dm = MemoryChat(core.dispatcher, channel="D9")
    llm.script(answer("hello"))
    await dm.say("hi", is_dm=True)
    assert set(offered(llm.requests[-1])) == {"python"}


async def test_a_3_mb_result_is_saved_and_only_a_bounded_part_reaches_the_model(
    core: Core, llm: ScriptedOpenAI
) -> None:
    chat = MemoryChat(core.dispatcher, channel="C1")
    llm.script(
        mcp_call("tracker__big", size=MB3),
        tool_call("text = open('tracker__big.txt').read()\nprint(len(text), text.splitlines()[-1])"),
        echo_last_tool(),
    )
    out = await chat.say("the big export")
    told = tool_results(llm.requests[1])[0]
    assert len(told) < HEAD_CHARS + 400
    assert told.startswith(
        f"The result is {MB3:,} characters, too long to show here: it is saved in the workspace as `tracker__big.txt`"
    )
    workspace = core.pool.workspaces.for_key(str(chat.key()))
    assert (workspace.path / "tracker__big.txt").stat().st_size == MB3
    assert f"stdout:\n{MB3} row 00000187499" in out.reply.text
    assert all(len(json.dumps(request)) < 60_000 for request in llm.requests)  # no request carried the result


async def test_a_call_past_timeout_s_ends_the_call_not_the_turn(core: Core, llm: ScriptedOpenAI) -> None:
    chat = MemoryChat(core.dispatcher, channel="C1")
    llm.script(mcp_call("tracker__sleep", seconds=30), tool_call("print('went on')"), echo_last_tool())
    started = time.monotonic()
    out = await chat.say("slow one")
    assert time.monotonic() - started < 15
    assert tool_results(llm.requests[1])[0] == (
        "The call took longer than 2 s (this server's timeout_s) and was stopped."
    )
    assert out.reply.ok and "went on" in out.reply.text
    # The call's wall time counts in the person's budget, as a query's does.
    assert sum(row.kernel_s for row in await core.store.usage.spent(since=0, user_id="U1")) >= 2.0


async def test_a_server_that_is_down_costs_one_sentence(
    core: Core, llm: ScriptedOpenAI, http_server: HttpServer
) -> None:
    chat = MemoryChat(core.dispatcher, channel="C1")
    http_server.stop()
    failed_before = (
        metrics.REGISTRY.get_sample_value("threadbook_mcp_calls_total", {"server": "tracker", "outcome": "failed"})
        or 0.0
    )
    llm.script(mcp_call("tracker__echo", text="hi"), tool_call("print('still fine')"), echo_last_tool())
    out = await chat.say("echo")
    told = tool_results(llm.requests[1])[0]
    assert told.startswith("The connection to the MCP server `tracker`") and told.count(". ") == 0
    assert out.reply.ok and "still fine" in out.reply.text
    failed_after = metrics.REGISTRY.get_sample_value(
        "threadbook_mcp_calls_total", {"server": "tracker", "outcome": "failed"}
    )
    assert failed_after == failed_before + 1

    status = (await chat.say("status", mentioned=False)).reply.text
    assert "**MCP servers:**" in status and "`local` ✅ answers" in status and "`tracker` ⚠️ does not answer" in status
    # The next turn's model is told the server did not answer when last tried.
    llm.script(answer("ok"))
    await chat.say("again")
    assert "`tracker` of this channel did not answer when last tried" in llm.requests[-1]["messages"][0]["content"]

    http_server.start()
    assert core.mcp is not None
    await core.mcp.connection("tracker").connect(retry=True)  # as the watch does every 30 s
    llm.script(mcp_call("tracker__echo", text="back"), echo_last_tool())
    assert (await chat.say("echo again")).reply.text == "Seen: back"


async def test_ready_and_metrics_show_each_server(core: Core, llm: ScriptedOpenAI, http_server: HttpServer) -> None:
    chat = MemoryChat(core.dispatcher, channel="C1")
    llm.script(mcp_call("tracker__echo", text="hi"), echo_last_tool())
    await chat.say("echo")
    http_server.stop()
    assert core.mcp is not None
    await core.mcp.check(["tracker"])  # a ping finds it gone
    async with serve_ops(core, host="127.0.0.1", port=0) as ops, aiohttp.ClientSession() as http:
        async with http.get(f"{ops.url}/readyz") as response:
            body = await response.json()
        async with http.get(f"{ops.url}/metrics") as response:
            scraped = await response.text()
    assert body["mcp"]["local"] == {"ok": True, "detail": "12 tools"}
    assert body["mcp"]["tracker"]["ok"] is False and "mcp" not in body["failed"]  # informs, decides nothing
    assert 'threadbook_mcp_calls_total{outcome="ok",server="tracker"}' in scraped
    assert 'threadbook_mcp_call_duration_seconds_count{server="tracker"}' in scraped


def _hunt_code(secrets: list[str], proc: bool) -> str:
    hidden = [secret[::-1] for secret in secrets]  # the code itself must not hold them
    return (
        "import os, glob\n"
        f"secrets = [s[::-1] for s in {hidden!r}]\n"
        "found = []\n"
        "found += [k for k, v in os.environ.items() for s in secrets if s in v or s in k]\n"
        f"paths = glob.glob('/proc/[0-9]*/environ') + glob.glob('/proc/[0-9]*/cmdline') if {proc!r} else []\n"
        "for top, _, names in os.walk('.'):\n"
        "    paths += [os.path.join(top, name) for name in names]\n"
        "for path in paths:\n"
        "    try:\n"
        "        data = open(path, 'rb').read()\n"
        "    except OSError:\n"
        "        continue\n"
        "    found += [path for s in secrets if s.encode() in data]\n"
        "print('FOUND', found)"
    )


async def test_the_tokens_are_nowhere_outside_the_bot(
    any_core: Core, llm: ScriptedOpenAI, caplog: pytest.LogCaptureFixture, request: pytest.FixtureRequest
) -> None:
    caplog.set_level(logging.DEBUG)
    chat = MemoryChat(any_core.dispatcher, channel="C1")
    outs: list[MemoryOutbox] = []
    # Tools that echo their own token back, fail with it in the message, and return large text.
    llm.script(
        mcp_call("tracker__leak"),
        mcp_call("local__leak"),
        mcp_call("tracker__fail"),
        mcp_call("tracker__echo", text="x" * 10_000),
        mcp_call("local__chart"),
        answer("done"),
    )
    outs.append(await chat.say("call everything"))
    results = [text for req in llm.requests for text in tool_results(req)]
    assert "my token is [hidden], keep it safe" in results
    assert any(
        t.startswith("The tool reported an error:") and "the warehouse is closed" in t and "[hidden]" in t
        for t in results
    )

    sandboxed = "bwrap" in request.node.callspec.id
    # An unsandboxed kernel runs as the bot's user and can read /proc/<pid>/environ of the stdio
    # server the bot started (as anything else of that user): only the sandbox keeps that out.
    llm.script(tool_call(_hunt_code([TOKEN, STDIO_TOKEN], proc=sandboxed)), echo_last_tool())
    outs.append(await chat.say("hunt", mentioned=False))
    assert "FOUND []" in outs[-1].reply.text
    if not sandboxed:
        llm.script(tool_call(_hunt_code([TOKEN], proc=True)), echo_last_tool())
        outs.append(await chat.say("hunt the http token", mentioned=False))
        assert "FOUND []" in outs[-1].reply.text
    outs.append(await chat.say("export", mentioned=False))
    outs.append(await chat.say("status", mentioned=False))

    def hunt(text: str) -> list[str]:
        return [line for line in text.splitlines() if TOKEN in line or STDIO_TOKEN in line]

    assert hunt(json.dumps(llm.requests)) == []  # nothing the model saw
    logged = [r.getMessage() for when in ("setup", "call") for r in caplog.get_records(when)]
    assert hunt("\n".join(logged)) == [] and hunt(caplog.text) == []  # nothing logged, the servers' stderr included
    assert "MCP server local (stderr): stdio test server starting with token [hidden]" in logged
    for out in outs:
        posted = [out.reply.text if out.replies else "", *out.notices, *(str(s) for s in out.progress_log)]
        assert hunt("\n".join(posted)) == []
        for file in out.reply.files if out.replies else ():
            with file.open_reader() as reader:
                data = reader.read()
            assert TOKEN.encode() not in data and STDIO_TOKEN.encode() not in data
    # The workspace and the kernels' run folders, as the host sees them.
    workspace = any_core.pool.workspaces.for_key(str(chat.key()))
    run_root = getattr(any_core.pool.launcher, "run_root", None)
    for folder in [workspace.path, *([run_root] if run_root is not None else [])]:
        for top, _, names in os.walk(folder):
            for name in names:
                path = Path(top) / name
                if path.is_file() and not path.is_symlink():
                    try:
                        data = path.read_bytes()
                    except OSError:
                        continue
                    assert TOKEN.encode() not in data and STDIO_TOKEN.encode() not in data, path


async def test_concurrent_threads_share_the_session(core: Core, llm: ScriptedOpenAI) -> None:
    chats = [MemoryChat(core.dispatcher, channel="C1") for _ in range(3)]
    for _ in chats:
        llm.script(mcp_call("tracker__sleep", seconds=1.5))
    for _ in chats:
        llm.script(answer("done"))
    started = time.monotonic()
    outs = await asyncio.gather(*(chat.say("sleep", thread=f"t{i}") for i, chat in enumerate(chats)))
    took = time.monotonic() - started
    assert all(out.reply.text == "done" for out in outs)
    assert took < 4.0, took  # three 1.5 s calls side by side, not one after another
