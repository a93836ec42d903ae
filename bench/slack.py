"""Whole-bot scenarios through the real Slack adapter, a fake Slack and a zero-latency model.

The model answers each turn with one tool call ``print(1)`` and then a text answer; the
time measured runs from the event's delivery (HTTP Events API) to the turn's final ✅
reaction, which the adapter adds after the reply is posted. ``api_overhead`` runs the same
turns over chat completions and over the Responses API side by side.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from adapters.slack import SlackAdapter
from bench.cpu import CpuMeter, phase
from bench.kernels import Sandbox, mode_config, summary
from bot.app import Core
from bot.config import parse_settings
from tests.fakes.openai_server import ScriptedOpenAI, answer, last_tool_output, tool_call
from tests.fakes.slack_server import FakeSlack

DONE = frozenset({"white_check_mark", "x"})


class _BenchSlack(FakeSlack):
    """The fake Slack, telling each turn's waiter when its message got its last reaction: a
    crowd's waiters do not all wake on every call (``FakeSlack.wait_for``), which cost the
    process more than the bot's own work for the turns."""

    def __init__(self) -> None:
        super().__init__()
        self._done: dict[tuple[str, str], asyncio.Future[None]] = {}

    def _notify(self) -> None:
        super()._notify()
        for key, done in list(self._done.items()):
            if DONE & self.reactions.get(key, set()) and not done.done():
                done.set_result(None)

    async def until_done(self, key: tuple[str, str], timeout: float) -> None:
        """Wait until the message ``key`` (channel, ts) has ✅ or ❌."""
        if DONE & self.reactions.get(key, set()):
            return
        self._done[key] = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(self._done[key], timeout)
        finally:
            del self._done[key]


def _model(request: dict[str, Any]) -> Any:
    """print(1) first, then the answer (whatever order concurrent threads ask in)."""
    if request["messages"][-1]["role"] == "tool":
        return answer("It printed 1.")
    return tool_call("print(1)")


def _reasoning_model(request: dict[str, Any]) -> Any:
    """:func:`_model` as a reasoning model answers: its thinking first, on either API."""
    if last_tool_output(request) is not None:
        return answer("It printed 1.", reasoning="The code printed 1, so the answer is 1.")
    return tool_call("print(1)", reasoning="Run print(1) to see what it prints.")


@asynccontextmanager
async def running_bot(
    mode: str,
    root: Path,
    *,
    warm: int,
    sandbox: Sandbox = "none",
    max_kernels: int = 120,
    api: str = "chat",
    model: Callable[[dict[str, Any]], Any] = _model,
) -> AsyncIterator[tuple[_BenchSlack, str, Core]]:
    """Fake Slack, model, Core and Slack adapter with kernels of ``mode``; yields (slack, events url, core).

    ``api``: the one API the model server speaks, and ``llm.api``."""
    async with AsyncExitStack() as fakes:
        with phase("fakes"):  # their servers' work is counted apart from the bot's (bench.cpu)
            slack = _BenchSlack()
            await fakes.enter_async_context(slack)
            llm = await fakes.enter_async_context(ScriptedOpenAI(apis=(api,)))
        llm.script(*[model] * 10_000)
        raw = {
            "llm": {
                "base_url": llm.base_url,
                "api_key": "k",
                "model": "fake-model",
                "request_timeout_s": 60,
                "api": api,
            },
            "slack": {
                "bot_token": slack.bot_token,
                "signing_secret": slack.signing_secret,
                "api_url": slack.api_url,
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
            await adapter.start()
            try:
                yield slack, f"http://127.0.0.1:{adapter.port}/slack/events", core
            finally:
                await adapter.wait_idle()
                await adapter.stop()


async def _turn(slack: _BenchSlack, url: str, event: dict[str, Any], timeout: float) -> tuple[float, bool]:
    key = (event["channel"], event["ts"])
    started = time.perf_counter()
    status, _ = await slack.post_event(url, event)
    await slack.until_done(key, timeout)
    elapsed = time.perf_counter() - started
    ok = status == 200 and slack.reactions[key] & DONE == {"white_check_mark"}
    return elapsed, ok


async def _counted_turn(slack: _BenchSlack, url: str, event: dict[str, Any], timeout: float) -> tuple[float, bool]:
    """:func:`_turn` whose own work (Slack delivering the event, watching the reactions) is the fakes'."""
    with phase("fakes"):
        return await _turn(slack, url, event, timeout)


async def turn_overhead(mode: str, root: Path, turns: int, *, sandbox: Sandbox = "none") -> dict[str, Any]:
    """Follow-up turns in one thread (its kernel running): event → final reply posted."""
    async with running_bot(mode, root, warm=1, sandbox=sandbox) as (slack, url, _):
        first = slack.mention("C1", "start")
        await _turn(slack, url, first, 120)
        times = []
        for i in range(turns):
            event = slack.message_event("C1", f"again {i}", thread_ts=first["ts"])
            elapsed, ok = await _turn(slack, url, event, 60)
            if not ok:
                raise RuntimeError(f"turn {i} failed")
            times.append(elapsed)
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
        bots = {
            api: await stack.enter_async_context(
                running_bot(mode, root / api, warm=1, sandbox=sandbox, api=api, model=_reasoning_model)
            )
            for api in times
        }
        firsts = {}
        for api, (slack, url, _) in bots.items():
            firsts[api] = slack.mention("C1", "start")
            await _turn(slack, url, firsts[api], 120)
        for i in range(turns):
            for api in ("chat", "responses") if i % 2 == 0 else ("responses", "chat"):
                slack, url, _ = bots[api]
                event = slack.message_event("C1", f"again {i}", thread_ts=firsts[api]["ts"])
                elapsed, ok = await _turn(slack, url, event, 60)
                if not ok:
                    raise RuntimeError(f"{api} turn {i} failed")
                times[api].append(elapsed)
    chat, responses = summary(times["chat"]), summary(times["responses"])
    return {**responses, "chat_p50_ms": chat["p50_ms"], "delta_p50_ms": responses["p50_ms"] - chat["p50_ms"]}


async def concurrent_threads(mode: str, root: Path, threads: int, *, sandbox: Sandbox = "none") -> dict[str, Any]:
    """``threads`` new threads mentioned at once; every one must be answered without error.
    Also the CPU the crowd cost, per turn, by process and phase (:mod:`bench.cpu`), and its
    floor (that CPU ÷ cores)."""
    meter = CpuMeter()
    async with running_bot(mode, root, warm=threads, sandbox=sandbox) as (slack, url, _):
        events = [slack.mention(f"C{i % 7}", f"go {i}") for i in range(threads)]
        with meter.installed(asyncio.get_running_loop()):
            await asyncio.to_thread(meter.begin)
            started = time.perf_counter()
            turns = (_counted_turn(slack, url, e, 600) for e in events)
            outcomes = await asyncio.gather(*turns, return_exceptions=True)
            wall = time.perf_counter() - started
            await asyncio.to_thread(meter.end)
    times = [o[0] for o in outcomes if isinstance(o, tuple)]
    errors = sum(1 for o in outcomes if not isinstance(o, tuple) or not o[1])
    result: dict[str, Any] = summary(times) if times else {"n": 0}
    cpu = meter.report(threads, len(os.sched_getaffinity(0)))
    result.update(wall_s=wall, errors=errors, floor_s=cpu["floor_s"], cpu_per_turn_ms=cpu["total_ms"], cpu=cpu)
    return result


async def queued_threads(mode: str, root: Path, threads: int, *, sandbox: Sandbox = "none") -> dict[str, Any]:
    """``threads`` new threads at once against ``max_kernels = threads // 2``: every one must be
    answered (those that find no kernel wait in the queue); p50/max are the queue waits."""
    kernels = max(1, threads // 2)
    async with running_bot(mode, root, warm=kernels, sandbox=sandbox, max_kernels=kernels) as (slack, url, core):
        events = [slack.mention(f"C{i % 7}", f"go {i}") for i in range(threads)]
        started = time.perf_counter()
        outcomes = await asyncio.gather(*(_turn(slack, url, e, 600) for e in events), return_exceptions=True)
        wall = time.perf_counter() - started
        stats = core.pool.queue_stats()
    errors = sum(1 for o in outcomes if not isinstance(o, tuple) or not o[1])
    turns = [o[0] for o in outcomes if isinstance(o, tuple)]
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
