"""New threads wait for a kernel in a fair queue instead of being turned away (issue 12).

The real dispatcher, turn runner, pool and kernels, driven through the in-memory chat, against
the scripted model: each turn runs one cell, then answers.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio

from bot.app import Core
from bot.turn import QUEUE_FULL_NOTICE, QUEUE_LEFT_NOTICE, QUEUE_TIMEOUT_NOTICE
from tests.conftest import make_settings
from tests.fakes.memory import MemoryChat, MemoryOutbox
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call

WAITING = re.compile(r"Waiting for a free kernel \((you are next|(\d+) ahead of you)\)")


def _model(request: dict[str, Any]) -> Any:
    """Run one cell (a slow one when asked), then answer."""
    messages = request["messages"]
    if messages[-1]["role"] == "tool":
        return answer("It printed 1.")
    asked = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    return tool_call("import time; time.sleep(4)" if "slow" in asked else "print(1)")


@pytest_asyncio.fixture
async def llm() -> AsyncIterator[ScriptedOpenAI]:
    async with ScriptedOpenAI() as server:
        server.script(*[_model] * 500)
        yield server


class _SharedLog(list[tuple[str, str]]):
    """A thread's progress log that also appends ``(thread, text)`` to one log all threads share,
    so the order of events across threads is kept."""

    def __init__(self, thread: str, shared: list[tuple[str, str]]) -> None:
        super().__init__()
        self.thread, self.shared = thread, shared

    def append(self, item: tuple[str, str]) -> None:
        super().append(item)
        self.shared.append((self.thread, item[1]))


def _first_place(outbox: MemoryOutbox) -> int | None:
    """How many were ahead when this thread first waited (None: it never waited)."""
    for _, text in outbox.progress_log:
        if match := WAITING.search(text):
            return 0 if match.group(2) is None else int(match.group(2))
    return None


async def test_24_new_threads_against_12_kernels_all_answered_in_arrival_order(
    tmp_path: Path, llm: ScriptedOpenAI
) -> None:
    settings = make_settings(tmp_path, llm_url=llm.base_url, kernels={"fork_server": True, "max_kernels": 12})
    async with Core.open(settings) as core:
        chat = MemoryChat(core.dispatcher)
        shared: list[tuple[str, str]] = []
        outboxes = [MemoryOutbox(progress_log=_SharedLog(f"t{n:02d}", shared)) for n in range(24)]
        tasks = []
        for n, outbox in enumerate(outboxes):  # a Monday morning: everyone at once, in a known order
            message = chat.message("print one please", thread=f"t{n:02d}")
            tasks.append(asyncio.ensure_future(core.dispatcher.handle(message, outbox)))
            await asyncio.sleep(0.005)
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
        stats = core.pool.queue_stats()
    for outbox in outboxes:
        assert [r.text for r in outbox.replies] == ["It printed 1."], (outbox.replies, outbox.notices)
        assert outbox.replies[0].ok and not outbox.notices
    places = [place for outbox in outboxes if (place := _first_place(outbox)) is not None]
    assert places, "nobody had to wait: the test did not fill the pool"
    # A thread is told its place as it joins the queue: each joins behind everyone still
    # waiting, so in the order they joined each has at most one more ahead than the one
    # before (fewer when some were served meanwhile; the pool's own test checks the order
    # of service). Joining order, not arrival order: under load a later message may join first.
    joined = list(dict.fromkeys(thread for thread, text in shared if WAITING.search(text)))
    told = {thread: _first_place(outboxes[int(thread[1:])]) for thread in joined}
    in_order = [told[thread] for thread in joined]
    assert in_order[0] == 0 and all(
        place is not None and earlier is not None and place <= earlier + 1
        for earlier, place in zip(in_order, in_order[1:])
    ), f"a thread did not join the queue at its end: {list(zip(joined, in_order))}"
    assert max(in_order) > 0, "every thread was told it was next: newcomers are not joining behind the others"
    assert stats.waiting == 0 and stats.recent_waits == len(places) and stats.max_wait_s > 0


async def test_queue_timeout_full_queue_and_stop_while_waiting(tmp_path: Path, llm: ScriptedOpenAI) -> None:
    kernels = {"fork_server": True, "max_kernels": 1, "queue_timeout_s": 1.5, "max_queue": 1}
    async with Core.open(make_settings(tmp_path, llm_url=llm.base_url, kernels=kernels)) as core:
        chat = MemoryChat(core.dispatcher)
        busy = asyncio.ensure_future(chat.say("slow please", thread="busy"))
        while not core.pool.sessions() or not core.pool.sessions()[0].busy:
            await asyncio.sleep(0.02)

        timed_out = await chat.say("print one please", thread="late")  # waits 1.5 s, then gives up
        assert [r.text for r in timed_out.replies] == [
            QUEUE_TIMEOUT_NOTICE.format(timeout=1.5, kernels=1)
        ] and not timed_out.replies[0].ok
        assert _first_place(timed_out) == 0

        waiting = asyncio.ensure_future(chat.say("print one please", thread="stopper"))
        while core.pool.queue_stats().waiting < 1:
            await asyncio.sleep(0.02)
        full = await chat.say("print one please", thread="full")  # max_queue 1: refused at once
        assert [r.text for r in full.replies] == [QUEUE_FULL_NOTICE.format(kernels=1, waiting=1)]
        assert await core.dispatcher.stop(chat.key("stopper"), user_id="U1")  # the Stop button while queued
        stopped = await asyncio.wait_for(waiting, 5)
        assert [r.text for r in stopped.replies] == [QUEUE_LEFT_NOTICE]

        first = await asyncio.wait_for(busy, 20)
        assert [r.text for r in first.replies] == ["It printed 1."]
        for thread in ("late", "full", "stopper"):  # nothing half-done: no history, no kernel
            assert await core.store.transcripts.history(chat.key(thread)) == []
            assert core.pool.get(str(chat.key(thread))) is None
