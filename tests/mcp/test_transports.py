"""The bot's own MCP transports (bot/mcp/stdio.py, bot/mcp/http.py) against real servers:
a line or event past the cap costs its call one sentence and nothing else, and a large answer
does not stall the event loop."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from bench.mcp import largest_lag
from bot.mcp import stdio
from bot.mcp.connection import CallFailed, Connection
from bot.mcp.hiding import Hider
from bot.mcp.settings import McpServerSettings
from bot.mcp.stdio import Lines, Overlong
from tests.mcp.conftest import STDIO_TOKEN, TOKEN, HttpServer, stdio_settings


def text_of(result: Any) -> str:
    return "".join(part.text for part in result.content)


def test_lines_are_split_and_an_overlong_one_is_cut_to_its_head() -> None:
    lines = Lines(10)
    assert lines.feed(b"ab") == []
    assert lines.feed(b"c\n\n  \nde") == [b"abc"]  # blank lines are left out
    assert lines.feed(b"fghij\n") == [b"defghij"]
    got = lines.feed(b'{"id": 1' + b"x" * 5000)
    assert got == []
    got = lines.feed(b"y" * 5000 + b"\nok\n")
    assert len(got) == 2 and isinstance(got[0], Overlong) and got[1] == b"ok"
    assert got[0].head.startswith(b'{"id": 1') and len(got[0].head) == 1024
    assert lines.feed(b"0123456789\n") == [b"0123456789"]  # exactly the limit is kept


def test_collecting_a_long_line_takes_linear_time() -> None:
    # The SDK's reader copied all it had buffered for every chunk: 32 MiB took 10 s.
    lines = Lines(64 * 2**20)
    chunk = b"x" * 65536
    started = time.perf_counter()
    for _ in range(512):  # 32 MiB
        assert lines.feed(chunk) == []
    assert lines.feed(b"\n") == [b"x" * (512 * 65536)]
    assert time.perf_counter() - started < 1.0


async def _an_answer_past_the_cap_fails_only_its_call(connection: Connection) -> None:
    """Over ``connection`` (capped at 1 MiB): a 2 MiB answer fails its call in one sentence that
    names the server (not the tool); the next call works in the same session (not restarted,
    not a lost connection)."""
    try:
        assert await connection.connect()
        session = connection._session
        with pytest.raises(CallFailed) as failed:
            await connection.call("big_text", {"size": 2 * 2**20})
        assert failed.value.sentence == (
            f"The MCP server `{connection.name}` answered with more than 1 MiB; the answer was dropped."
        )
        assert failed.value.outcome == "failed" and "big_text" not in failed.value.sentence
        assert text_of(await connection.call("echo", {"text": "still here"})) == "still here"
        assert connection._session is session
    finally:
        await connection.close()


async def test_a_stdio_line_past_the_cap_fails_its_call_in_one_sentence_and_the_next_call_works() -> None:
    settings = McpServerSettings.model_validate(stdio_settings(timeout_s=30))
    await _an_answer_past_the_cap_fails_only_its_call(
        Connection("local", settings, Hider([STDIO_TOKEN]), connect_timeout_s=10, max_message_bytes=2**20)
    )


@pytest.mark.parametrize("json_response", [False, True])
async def test_an_http_answer_past_the_cap_fails_its_call_in_one_sentence_and_keeps_the_session(
    tmp_path: Path, json_response: bool
) -> None:
    # A JSON answer is read whole by the SDK: only the cap keeps it bounded (an SSE event has its own).
    server = HttpServer(tmp_path, json_response=json_response)
    server.start()
    try:
        settings = McpServerSettings.model_validate(server.settings(timeout_s=30))
        await _an_answer_past_the_cap_fails_only_its_call(
            Connection("tracker", settings, Hider([TOKEN]), connect_timeout_s=5, max_message_bytes=2**20)
        )
    finally:
        server.stop()


@pytest.mark.parametrize("mode", ["stdio", "http", "http-json"])
async def test_a_large_answer_does_not_stall_the_event_loop(tmp_path: Path, mode: str) -> None:
    # ~25 MB on the wire (12 MB of text, sent as content and as structured content), under a
    # cap raised for it. With the SDK's own transports the HTTP ones stalled the loop ~250 ms.
    server = HttpServer(tmp_path, json_response=mode == "http-json") if mode != "stdio" else None
    if server is not None:
        server.start()
    entry = server.settings(timeout_s=60) if server is not None else stdio_settings(timeout_s=60)
    settings = McpServerSettings.model_validate(entry)
    connection = Connection("big", settings, Hider([TOKEN]), connect_timeout_s=10, max_message_bytes=64 * 2**20)
    try:
        assert await connection.connect()
        await connection.call("big_text", {"size": 2**20})  # the worker threads and the first parse
        size = 12_000_000
        lag, result = await largest_lag(connection.call("big", {"size": size}))
        assert len(text_of(result)) == size
        assert lag < 0.150, f"the event loop stalled {lag * 1000:.0f} ms"
    finally:
        await connection.close()
        if server is not None:
            server.stop()


#: A server that ignores its stdin's end and SIGTERM, and has a child of its own.
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
print(child.pid, flush=True)
sys.stdin.read()
time.sleep(600)
"""


@pytest.mark.parametrize("cancelled", [False, True])
async def test_a_stdio_server_that_will_not_exit_is_killed_with_its_children(
    monkeypatch: pytest.MonkeyPatch, cancelled: bool
) -> None:
    monkeypatch.setattr(stdio, "GRACE_S", 0.3)
    with open(os.devnull, "w", encoding="utf-8") as errlog:
        scope = anyio.CancelScope()
        with scope:
            async with stdio.stdio_transport(
                sys.executable, ["-c", STUBBORN], dict(os.environ), errlog=errlog, max_line_bytes=2**20, name="t"
            ) as (read, _write):
                started = time.monotonic()
                # The child's pid is not JSON-RPC: the session is told so (it goes on).
                assert isinstance(await read.receive(), ValueError)
                server = next(
                    p for p in psutil.Process().children() if any("sys.stdin.read()" in arg for arg in p.cmdline())
                )
                children = server.children()
                assert len(children) == 1
                if cancelled:  # the owner task is cancelled while it waits for the server
                    scope.cancel()
                    await read.receive()
    assert scope.cancelled_caught == cancelled
    assert time.monotonic() - started < 5
    # SIGKILL went to the whole group; the orphaned child is reaped by init a moment later.
    _gone, alive = psutil.wait_procs([server, *children], timeout=2)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
