"""Whole-bot scenarios through the real Slack adapter, a fake Slack and a zero-latency model.

The model answers each turn with one tool call ``print(1)`` and then a text answer; the
time measured runs from the event's delivery (HTTP Events API) to the turn's final ✅
reaction, which the adapter adds after the reply is posted. The fake Slack, the model and
the posting of events run in a process of their own (:mod:`bench.world`), as Slack and the
model run elsewhere. ``api_overhead`` runs the same turns over chat completions and over the
Responses API side by side.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from adapters.slack import SlackAdapter
from bench.cpu import CpuMeter, phase
from bench.kernels import Sandbox, mode_config, summary
from bot.app import Core, freeze_startup_heap
from bot.config import parse_settings

REPO = Path(__file__).resolve().parents[1]


class World:
    """The fake Slack and the model in their own process (:mod:`bench.world`), and the bot's
    Events API endpoint to post to (:attr:`events_url`, set once the adapter listens)."""

    def __init__(self, process: asyncio.subprocess.Process, where: dict[str, str]) -> None:
        self._process = process
        self.where = where
        self.events_url = ""

    @classmethod
    @asynccontextmanager
    async def running(cls, api: str, reasoning: bool) -> AsyncIterator[World]:
        """Start the world process; stop it (its standard input closed) on exit."""
        args = ["--api", api, *(["--reasoning"] if reasoning else [])]
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.world",
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        try:
            assert process.stdout is not None
            first = await asyncio.wait_for(process.stdout.readline(), 60)
            if not first:
                raise RuntimeError("the bench's fake Slack and model did not start (bench.world)")
            yield cls(process, json.loads(first))
        finally:
            if process.stdin is not None:
                process.stdin.close()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()

    async def turns(self, turns: list[dict[str, Any]], timeout: float) -> list[tuple[float, bool, str]]:
        """Post ``turns`` (channel, text, thread_ts or None: a new thread's mention) at once;
        each one's (seconds until its final reaction, whether ✅, its message ts)."""
        assert self._process.stdin is not None and self._process.stdout is not None
        request = {"events_url": self.events_url, "timeout": timeout, "turns": turns}
        self._process.stdin.write(json.dumps(request).encode() + b"\n")
        await self._process.stdin.drain()
        line = await self._process.stdout.readline()
        if not line:
            raise RuntimeError("the bench's fake Slack and model exited (bench.world)")
        return [(float(t[0]), bool(t[1]), str(t[2])) for t in json.loads(line)["turns"]]

    async def turn(
        self, channel: str, text: str, thread_ts: str | None = None, timeout: float = 60
    ) -> tuple[float, str]:
        """One turn (see :meth:`turns`): its seconds and ts; raises if it did not end in ✅."""
        ((elapsed, ok, ts),) = await self.turns([{"channel": channel, "text": text, "thread_ts": thread_ts}], timeout)
        if not ok:
            raise RuntimeError(f"the turn {text!r} in {channel} failed")
        return elapsed, ts


@asynccontextmanager
async def running_bot(
    mode: str,
    root: Path,
    *,
    warm: int,
    sandbox: Sandbox = "none",
    max_kernels: int = 120,
    api: str = "chat",
    reasoning: bool = False,
) -> AsyncIterator[tuple[World, Core]]:
    """The world (fake Slack, model), Core and the Slack adapter with kernels of ``mode``;
    yields (world, core) with the world's ``events_url`` set.

    ``api``: the one API the model server speaks, and ``llm.api``; ``reasoning``: the model
    thinks aloud first (:func:`bench.world.reasoning_model`)."""
    async with World.running(api, reasoning) as world:
        where = world.where
        raw = {
            "llm": {
                "base_url": where["llm_base_url"],
                "api_key": "k",
                "model": "fake-model",
                "request_timeout_s": 60,
                "api": api,
            },
            "slack": {
                "bot_token": where["bot_token"],
                "signing_secret": where["signing_secret"],
                "api_url": where["slack_api_url"],
                "http_host": "127.0.0.1",
                "http_port": 0,
            },
            "kernels": {
                "workspace_root": str(root / "workspaces"),
                "sandbox": sandbox,
                "max_kernels": max_kernels,
                "preload": ["pandas", "numpy", "matplotlib"],
                "exec_timeout_s": 120,
                **mode_config(mode, warm),
            },
            "storage": {"path": str(root / "threadbook.db")},
        }
        settings = parse_settings(raw, env={})
        async with Core.open(settings) as core:
            if core.pool.warm is not None:
                await core.pool.warm.wait_ready(timeout=120)
            if (oneshot := getattr(core, "oneshot", None)) is not None:
                await oneshot.wait_ready()  # its imports are the bot's start, not the turns' cost
            adapter = SlackAdapter(settings.slack, core.dispatcher)
            freeze_startup_heap()  # as python -m bot run does before its adapters start
            await adapter.start()
            try:
                world.events_url = f"http://127.0.0.1:{adapter.port}/slack/events"
                yield world, core
            finally:
                await adapter.wait_idle()
                await adapter.stop()


async def _counted_turns(world: World, turns: list[dict[str, Any]], timeout: float) -> list[tuple[float, bool, str]]:
    """:meth:`World.turns` whose own work here (the requests to the world) is counted as the fakes'."""
    with phase("fakes"):
        return await world.turns(turns, timeout)


def _new_threads(threads: int) -> list[dict[str, Any]]:
    """``threads`` new threads' first mentions, in seven channels."""
    return [{"channel": f"C{i % 7}", "text": f"go {i}", "thread_ts": None} for i in range(threads)]


async def turn_overhead(mode: str, root: Path, turns: int, *, sandbox: Sandbox = "none") -> dict[str, Any]:
    """Follow-up turns in one thread (its kernel running): event → final reply posted."""
    async with running_bot(mode, root, warm=1, sandbox=sandbox) as (world, _):
        _, first = await world.turn("C1", "start", timeout=120)
        times = [(await world.turn("C1", f"again {i}", first))[0] for i in range(turns)]
    return summary(times)


async def api_overhead(mode: str, root: Path, turns: int, *, sandbox: Sandbox = "none") -> dict[str, Any]:
    """``turn_overhead`` over chat completions and over the Responses API at once: two bots, the
    same reasoning model's turns (its reasoning handed back with the tool result on the Responses
    API), turns alternating between them so both meet the same machine. The result is the
    Responses turns' figures, with ``chat_p50_ms`` and ``delta_p50_ms`` (Responses − chat)."""
    times: dict[str, list[float]] = {"chat": [], "responses": []}
    for api in times:
        (root / api).mkdir()
    async with AsyncExitStack() as stack:
        worlds = {
            api: (
                await stack.enter_async_context(
                    running_bot(mode, root / api, warm=1, sandbox=sandbox, api=api, reasoning=True)
                )
            )[0]
            for api in times
        }
        firsts = {api: (await world.turn("C1", "start", timeout=120))[1] for api, world in worlds.items()}
        for i in range(turns):
            for api in ("chat", "responses") if i % 2 == 0 else ("responses", "chat"):
                times[api].append((await worlds[api].turn("C1", f"again {i}", firsts[api]))[0])
    chat, responses = summary(times["chat"]), summary(times["responses"])
    return {**responses, "chat_p50_ms": chat["p50_ms"], "delta_p50_ms": responses["p50_ms"] - chat["p50_ms"]}


async def concurrent_threads(mode: str, root: Path, threads: int, *, sandbox: Sandbox = "none") -> dict[str, Any]:
    """``threads`` new threads mentioned at once; every one must be answered without error.
    Also the CPU the crowd cost, per turn, by process and phase (:mod:`bench.cpu`), and its
    floor (that CPU ÷ cores)."""
    meter = CpuMeter()
    async with running_bot(mode, root, warm=threads, sandbox=sandbox) as (world, _):
        with meter.installed(asyncio.get_running_loop()):
            await asyncio.to_thread(meter.begin)
            started = time.perf_counter()
            outcomes = await _counted_turns(world, _new_threads(threads), 600)
            wall = time.perf_counter() - started
            await asyncio.to_thread(meter.end)
    times = [elapsed for elapsed, ok, _ in outcomes if ok]
    errors = sum(1 for _, ok, _ in outcomes if not ok)
    result: dict[str, Any] = summary(times) if times else {"n": 0}
    cpu = meter.report(threads, len(os.sched_getaffinity(0)))
    result.update(wall_s=wall, errors=errors, floor_s=cpu["floor_s"], cpu_per_turn_ms=cpu["total_ms"], cpu=cpu)
    return result


async def queued_threads(mode: str, root: Path, threads: int, *, sandbox: Sandbox = "none") -> dict[str, Any]:
    """``threads`` new threads at once against ``max_kernels = threads // 2``: every one must be
    answered (those that find no kernel wait in the queue); p50/max are the queue waits."""
    kernels = max(1, threads // 2)
    async with running_bot(mode, root, warm=kernels, sandbox=sandbox, max_kernels=kernels) as (world, core):
        started = time.perf_counter()
        outcomes = await world.turns(_new_threads(threads), 600)
        wall = time.perf_counter() - started
        stats = core.pool.queue_stats()
    errors = sum(1 for _, ok, _ in outcomes if not ok)
    turns = [elapsed for elapsed, ok, _ in outcomes if ok]
    return {
        "n": stats.recent_waits,
        "p50_ms": stats.p50_wait_s * 1000,
        "p90_ms": None,
        "max_ms": stats.max_wait_s * 1000,
        "wall_s": wall,
        "errors": errors,
        "turn_max_ms": max(turns, default=0.0) * 1000,
        "max_kernels": kernels,
    }
