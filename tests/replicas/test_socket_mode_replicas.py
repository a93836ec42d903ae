"""Two replicas in Socket Mode, one connection each, on one PostgreSQL: Slack hands each event
to one of the app's connections, so either replica may get any message of a thread, and a
Stop click may reach the replica that is not running the turn."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from adapters.slack import SlackAdapter
from bot.app import Core
from tests.conftest import make_settings
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call
from tests.fakes.slack_server import FakeSlack

DONE = frozenset({"white_check_mark", "x"})


def model(request: dict[str, Any]) -> Any:
    """Run code for ``count``/``sleep``, report what it printed, otherwise answer plainly."""
    messages = request["messages"]
    asked = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    if messages[-1]["role"] == "tool":
        return answer(f"printed {str(messages[-1]['content']).split()[-1]}")
    if "sleep" in asked:
        return tool_call("import time\ntime.sleep(60)")
    if "count" in asked:
        return tool_call("n = globals().get('n', 0) + 1\nprint(n)")
    return answer("plain")


@dataclass
class Replicas:
    slack: FakeSlack
    cores: list[Core]

    async def finished(self, event: dict[str, Any], timeout: float = 30.0) -> set[str]:
        """The turn's final mark (✅ or ❌), once it is there."""
        key = (event["channel"], event["ts"])
        return set(await self.slack.wait_for(lambda: DONE & self.slack.reactions.get(key, set()), timeout))

    def answers(self, channel: str, thread_ts: str) -> list[str]:
        return [
            m.text
            for m in self.slack.bot_messages(channel, thread_ts)
            if m.text.startswith(("printed", "plain")) and m.stream_state != "streaming"  # finished answers
        ]


@pytest_asyncio.fixture
async def replicas(tmp_path: Path, pg_url: str) -> AsyncIterator[Replicas]:
    async with FakeSlack() as slack, ScriptedOpenAI() as llm, AsyncExitStack() as stack:
        llm.script(*[model] * 200)
        slack_settings = {"bot_token": slack.bot_token, "app_token": slack.app_token, "api_url": slack.api_url}
        cores = []
        for name in ("a", "b"):
            settings = make_settings(
                tmp_path / name,
                llm_url=llm.base_url,
                slack=slack_settings,
                storage={"url": pg_url, "replica_timeout_s": 3},
                kernels={"workspace_root": str(tmp_path / "workspaces")},
            )
            core = await stack.enter_async_context(Core.open(settings))
            adapter = SlackAdapter(settings.slack, core.dispatcher)
            await adapter.start()
            stack.push_async_callback(adapter.stop)
            cores.append(core)
        await slack.wait_for(lambda: slack.socket_connects == 2)
        yield Replicas(slack, cores)


@pytest.mark.timeout(90)
async def test_each_connection_gets_some_events_and_the_thread_stays_one(replicas: Replicas) -> None:
    slack = replicas.slack
    root = slack.mention("C_SOCK", "count please")
    await slack.socket_send("events_api", slack.event_callback(root), connection=0)
    assert await replicas.finished(root) == {"white_check_mark"}
    for i in range(4):  # alternate: replica b, a, b, a
        event = slack.message_event("C_SOCK", "count again", thread_ts=root["ts"])
        await slack.socket_send("events_api", slack.event_callback(event), connection=(i + 1) % 2)
        assert await replicas.finished(event) == {"white_check_mark"}
    # The kernel's counter went 1..5 although the turns alternated between two processes.
    assert replicas.answers("C_SOCK", root["ts"]) == [f"printed {n}" for n in range(1, 6)]


@pytest.mark.timeout(90)
async def test_stop_clicked_on_the_other_replica_stops_the_turn(replicas: Replicas) -> None:
    slack = replicas.slack
    event = slack.mention("C_STOP", "sleep please")
    await slack.socket_send("events_api", slack.event_callback(event), connection=0)
    key = f"slack:T1:C_STOP:{event['ts']}"
    running = replicas.cores[0].pool  # replica a got the event, so a runs the turn
    await slack.wait_for(lambda: (s := running.get(key)) is not None and s.busy, 30)
    status = await slack.wait_for(lambda: next((m for m in slack.messages if m.channel == "C_STOP" and m.blocks), None))
    await slack.socket_send("interactive", slack.block_action(status, "threadbook_stop", key), connection=1)
    assert await replicas.finished(event, timeout=15) == {"x"}
    assert replicas.cores[1].pool.get(key) is None  # b never ran it
    await asyncio.sleep(0)
