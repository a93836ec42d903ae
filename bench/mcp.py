"""The ``mcp`` scenario (issue 43): what a call of an MCP server's tool costs the bot.

Against the test servers of ``tests/mcp/servers.py`` (the official SDK): ``http`` a streamable
HTTP server on 127.0.0.1 behind a bearer token, ``stdio`` a server the bot starts. ``p50_ms``
etc.: the model's tool call as a turn makes it (:class:`bot.mcp.tool.McpTool`: the arguments
parsed, the call over the bot's shared session, the result cut and hidden, the metrics) of
``echo`` with a short text; ``sdk_p50_ms``: the bare SDK call (``ClientSession.call_tool``) on
the same session, so their difference is the bot's own overhead. ``big_peak_mib``: how much the
bot process's resident memory rose over its level before, at most, while one call brought a
3 MB text and saved it into a workspace (sampled every 5 ms); ``big_kept_mib``: what it still held
after; ``big_ms``: that call's time. ``stall_3mb_ms`` and ``stall_12mb_ms``: the event loop's
largest lag (how much later than asked a 1 ms sleep woke up; the worst of :data:`STALL_CALLS`
calls) while the bot's connection brought a 3 MB and a 12 MB text (``big_text``: sent once, so
the message is about as large, under the 16 MiB cap).
"""

from __future__ import annotations

import asyncio
import gc
import json
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import psutil

from bench.kernels import summary
from bench.sources import _peak_while
from bot.mcp.registry import McpServers
from bot.mcp.settings import McpServerSettings
from bot.mcp.tool import McpTool
from kernels.host.workspace import Workspace
from tests.mcp.conftest import HttpServer, stdio_settings

T = TypeVar("T")

MODES = ("http", "stdio")
BIG = 3_000_000
#: The texts the loop's stall is measured for (bytes), and how many calls each.
STALL_SIZES = {"stall_3mb_ms": 3_000_000, "stall_12mb_ms": 12_000_000}
STALL_CALLS = 3


async def call_cost(mode: str, root: Path, samples: int) -> dict[str, Any]:
    """``samples`` small calls through the tool and through the bare SDK, then one 3 MB result."""
    server = HttpServer(root) if mode == "http" else None
    if server is not None:
        await asyncio.to_thread(server.start)
    try:
        entry = server.settings(timeout_s=60) if server is not None else stdio_settings(timeout_s=60)
        servers = McpServers({"bench": McpServerSettings.model_validate(entry)})
        await servers.open()
        try:
            return await _measure(servers, root, samples)
        finally:
            await servers.close()
    finally:
        if server is not None:
            await asyncio.to_thread(server.stop)


async def _measure(servers: McpServers, root: Path, samples: int) -> dict[str, Any]:
    connection = servers.connection("bench")
    if not connection.connected:
        raise RuntimeError(f"the MCP server did not answer: {connection.health.detail}")
    folder = Path(tempfile.mkdtemp(dir=root))
    workspace = Workspace(folder, max_file_bytes=64 * 2**20, quota_bytes=256 * 2**20)

    def tool(name: str) -> McpTool:
        offered = next(t for t in servers.offered(["bench"]) if t.tool == name)
        return McpTool(servers=servers, offered=offered, workspace=workspace)

    echo = tool("echo")
    arguments = json.dumps({"text": "hello"})
    for _ in range(5):  # the first requests (connection pool, imports)
        await echo.call(arguments)
    times: list[float] = []
    for _ in range(samples):
        started = time.perf_counter()
        told = await echo.call(arguments)
        times.append(time.perf_counter() - started)
        if told != "hello":
            raise RuntimeError(f"unexpected answer: {told[:200]}")
    bare: list[float] = []
    for _ in range(samples):
        started = time.perf_counter()
        await connection.call("echo", {"text": "hello"})
        bare.append(time.perf_counter() - started)

    big = tool("big")
    gc.collect()
    before = psutil.Process().memory_info().rss
    told_box: list[str] = []

    async def fetch_big() -> None:
        told_box.append(await big.call(json.dumps({"size": BIG})))

    peak, took = await _peak_while(fetch_big())
    if "`bench__big.txt`" not in told_box[0] or (folder / "bench__big.txt").stat().st_size != BIG:
        raise RuntimeError(f"the 3 MB result was not saved: {told_box[0][:200]}")
    told_box.clear()
    gc.collect()
    kept = psutil.Process().memory_info().rss - before
    await connection.call("big_text", {"size": 2**20})  # the worker threads and the first large parse
    stalls: dict[str, float] = {}
    for field, size in STALL_SIZES.items():
        worst = 0.0
        for _ in range(STALL_CALLS):
            lag, result = await largest_lag(connection.call("big_text", {"size": size}))
            if sum(len(getattr(part, "text", "")) for part in result.content) != size:
                raise RuntimeError(f"the {size}-byte text did not come whole")
            worst = max(worst, lag)
        stalls[field] = worst * 1000
    return {
        **summary(times),
        "sdk_p50_ms": summary(bare)["p50_ms"],
        "big_peak_mib": peak / 2**20,
        "big_kept_mib": kept / 2**20,
        "big_ms": took * 1000,
        **stalls,
    }


async def largest_lag(work: Awaitable[T]) -> tuple[float, T]:
    """``work``'s outcome and the event loop's largest lag (seconds) while it ran: how much later
    than asked a 1 ms sleep woke up."""
    lags = [0.0]
    done = False

    async def ticker() -> None:
        while not done:
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - before - 0.001)

    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    try:
        outcome = await work
    finally:
        done = True
        await ticking
    return max(lags), outcome
