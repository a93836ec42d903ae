"""The shared client sessions against real MCP servers (streamable HTTP behind a bearer token,
and stdio): connecting, calling, timeouts, drops and restarts, concurrency, the stdio
server's environment and stderr, closing."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import pytest_asyncio

from bot.mcp.connection import CallFailed
from bot.mcp.registry import McpServers, offered_tools
from bot.mcp.settings import McpServerSettings
from tests.mcp.conftest import STDIO_TOKEN, TOKEN, HttpServer, stdio_settings


def servers(**entries: dict[str, Any]) -> McpServers:
    return McpServers({name: McpServerSettings.model_validate(e) for name, e in entries.items()}, connect_timeout_s=5)


@pytest_asyncio.fixture
async def tracker(http_server: HttpServer) -> AsyncIterator[McpServers]:
    registry = servers(tracker=http_server.settings(timeout_s=1.5))
    await registry.open()
    try:
        yield registry
    finally:
        await registry.close()


def text_of(result: Any) -> str:
    return "".join(part.text for part in result.content)


async def test_connects_lists_and_calls(tracker: McpServers) -> None:
    connection = tracker.connection("tracker")
    assert connection.health.up and connection.connected
    assert text_of(await connection.call("echo", {"text": "hi"})) == "hi"
    names = {tool.function for tool in offered_tools(connection)}
    assert {"tracker__echo", "tracker__big", "tracker__sleep", "tracker__chart"} <= names
    assert "tracker__drop_table" not in names  # annotated destructive: not offered by default


async def test_tools_named_in_the_config_are_offered_even_destructive_ones(http_server: HttpServer) -> None:
    registry = servers(tracker=http_server.settings(tools=["drop_table", "echo", "not_there"]))
    await registry.open()
    try:
        offered = offered_tools(registry.connection("tracker"))
        assert [tool.function for tool in offered] == ["tracker__drop_table", "tracker__echo"]
        assert offered[1].parameters["properties"]["text"]["type"] == "string"
    finally:
        await registry.close()


async def test_a_wrong_token_is_a_down_server_not_a_crash(http_server: HttpServer, caplog: Any) -> None:
    entry = http_server.settings()
    entry["headers"] = {"Authorization": "Bearer wrong-token-123"}
    registry = servers(tracker=entry)
    await registry.open()  # never raises
    try:
        health = registry.health()["tracker"]
        assert not health.up and health.detail == "HTTP 401 (check its headers)"
        with pytest.raises(CallFailed) as failed:
            await registry.connection("tracker").call("echo", {"text": "x"})
        assert failed.value.outcome == "unreachable"
        assert "cannot be reached now (HTTP 401" in failed.value.sentence
    finally:
        await registry.close()
    assert "wrong-token-123" not in caplog.text and http_server.url not in caplog.text


async def test_a_call_past_timeout_s_ends_and_the_session_goes_on(tracker: McpServers) -> None:
    connection = tracker.connection("tracker")
    started = time.monotonic()
    with pytest.raises(CallFailed) as failed:
        await connection.call("sleep", {"seconds": 10})
    assert time.monotonic() - started < 4
    assert failed.value.outcome == "timeout"
    assert failed.value.sentence == "The call took longer than 1.5 s (this server's timeout_s) and was stopped."
    assert text_of(await connection.call("echo", {"text": "still here"})) == "still here"


async def test_stop_abandons_a_running_call(tracker: McpServers) -> None:
    leave = asyncio.Event()
    asyncio.get_running_loop().call_later(0.3, leave.set)
    started = time.monotonic()
    with pytest.raises(CallFailed) as failed:
        await tracker.connection("tracker").call("sleep", {"seconds": 1.2}, leave=leave)
    assert time.monotonic() - started < 1.0
    assert failed.value.outcome == "stopped"


async def test_concurrent_calls_neither_wait_for_each_other_nor_block_the_loop(tracker: McpServers) -> None:
    connection = tracker.connection("tracker")
    lags: list[float] = []

    async def ticker() -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.01)
            lags.append(time.monotonic() - before - 0.01)

    ticking = asyncio.create_task(ticker())
    started = time.monotonic()
    results = await asyncio.gather(*(connection.call("sleep", {"seconds": 1.0}) for _ in range(8)))
    took = time.monotonic() - started
    ticking.cancel()
    assert [text_of(r) for r in results] == ["slept 1.0"] * 8
    assert took < 2.0, took  # eight one-second calls at once, not one after another
    assert max(lags) < 0.25, max(lags)


async def test_a_restarted_server_is_reconnected_without_failing_the_call(
    tracker: McpServers, http_server: HttpServer
) -> None:
    connection = tracker.connection("tracker")
    assert text_of(await connection.call("echo", {"text": "one"})) == "one"
    http_server.stop()
    http_server.start()  # a new process: it does not know the bot's session
    assert text_of(await connection.call("echo", {"text": "two"})) == "two"
    assert connection.health.up


async def test_a_server_that_went_down_costs_one_sentence_and_is_back_when_it_is(
    tracker: McpServers, http_server: HttpServer
) -> None:
    connection = tracker.connection("tracker")
    http_server.stop()
    with pytest.raises(CallFailed) as failed:
        await connection.call("echo", {"text": "x"})
    assert failed.value.sentence.count(".") == 1 and "`tracker`" in failed.value.sentence
    assert not connection.health.up
    http_server.start()
    # Within RETRY_AFTER_S of the failed connect a call does not wait for another try; after it, it does.
    await connection.connect(retry=True)
    assert text_of(await connection.call("echo", {"text": "back"})) == "back"


async def test_a_server_down_at_start_is_tried_again_by_the_watch(tmp_path: Path) -> None:
    server = HttpServer(tmp_path)
    registry = McpServers(
        {"tracker": McpServerSettings.model_validate(server.settings())}, connect_timeout_s=3, check_every_s=0.2
    )
    await registry.open()
    try:
        assert not registry.health()["tracker"].up
        assert registry.offered(["tracker"]) == []  # never listed: nothing to offer
        assert "`tracker`" in registry.down_note(["tracker"])
        server.start()
        deadline = time.monotonic() + 15
        while not registry.health()["tracker"].up and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert registry.health()["tracker"].up
        assert registry.offered(["tracker"]) and registry.down_note(["tracker"]) == ""
    finally:
        await registry.close()
        server.stop()


async def test_stdio_server_gets_only_its_environment(monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    monkeypatch.setenv("THREADBOOK_TEST_BOT_SECRET", "bot-secret-value-1")
    caplog.set_level(logging.INFO)
    registry = servers(local=stdio_settings())
    await registry.open()
    try:
        connection = registry.connection("local")
        assert connection.health.up, connection.health
        assert text_of(await connection.call("token_ok", {})) == "token ok"
        names = set(text_of(await connection.call("env_names", {})).split(","))
        # Its own env, LANG, and the SDK's minimal PATH/HOME/USER/LOGNAME/SHELL/TERM (where the bot has them).
        assert {"STDIO_TOKEN", "PYTHONPATH", "LANG", "PATH"} <= names
        assert names <= {"STDIO_TOKEN", "PYTHONPATH", "LANG", "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM"}
        assert "THREADBOOK_TEST_BOT_SECRET" not in names
        leaked = text_of(await connection.call("leak", {}))
        assert STDIO_TOKEN in leaked  # the server said it; what the model gets is hidden (test_result, turns)
        started = time.monotonic()
        results = await asyncio.gather(*(connection.call("sleep", {"seconds": 0.5}) for _ in range(4)))
        assert [text_of(r) for r in results] == ["slept 0.5"] * 4 and time.monotonic() - started < 1.5
        children = [p for p in psutil.Process().children(recursive=True) if "stdio" in " ".join(p.cmdline())]
        assert children
    finally:
        await registry.close()
    assert not [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]  # stopped on close
    # Its stderr is logged, its token hidden.
    assert "MCP server local (stderr): stdio test server starting with token [hidden]" in caplog.text
    assert STDIO_TOKEN not in caplog.text


async def test_a_stdio_server_that_dies_is_started_again(caplog: Any) -> None:
    registry = servers(local=stdio_settings())
    await registry.open()
    try:
        connection = registry.connection("local")
        first = [p for p in psutil.Process().children(recursive=True) if "stdio" in " ".join(p.cmdline())]
        for process in first:
            process.kill()
        with pytest.raises(CallFailed) as failed:
            await connection.call("echo", {"text": "x"})
        assert failed.value.outcome in ("failed", "unreachable")
        assert text_of(await connection.call("echo", {"text": "again"})) == "again"  # a new process
    finally:
        await registry.close()


async def test_a_stdio_command_that_does_not_exist_is_down(caplog: Any) -> None:
    registry = servers(local={"command": "/nonexistent/mcp-server"})
    await registry.open()
    try:
        assert registry.health()["local"].detail == "its command was not found"
    finally:
        await registry.close()


async def test_an_unreachable_url_is_logged_without_its_address(caplog: Any) -> None:
    registry = servers(tracker={"url": "http://127.0.0.1:9/mcp?key=url-secret-999", "timeout_s": 1})
    await registry.open()
    try:
        assert not registry.health()["tracker"].up
    finally:
        await registry.close()
    assert "url-secret-999" not in caplog.text
    assert "could not connect (ConnectError)" in caplog.text


async def test_tokens_never_reach_the_log(tracker: McpServers, caplog: Any) -> None:
    caplog.set_level(logging.DEBUG)
    connection = tracker.connection("tracker")
    await connection.call("echo", {"text": "x"})
    assert TOKEN not in caplog.text


async def test_a_key_in_the_url_is_hidden_in_the_http_clients_log(http_server: HttpServer, caplog: Any) -> None:
    caplog.set_level(logging.INFO)
    registry = servers(tracker=http_server.settings(url=f"{http_server.url}?key=url-secret-abc123"))
    await registry.open()
    try:
        assert text_of(await registry.connection("tracker").call("echo", {"text": "x"})) == "x"
    finally:
        await registry.close()
    assert "HTTP Request: POST [hidden]" in caplog.text  # the SDK's HTTP client logs each request's URL
    assert "url-secret-abc123" not in caplog.text
