"""Two real ``python -m bot run`` replicas behind a "load balancer" (this test, alternating),
against one fake Slack (Events API), one scripted model and one real PostgreSQL.

What a team would see: every message answered once, whichever replica Slack's retries reach;
each thread's answers in the order of its messages; a thread's variables follow it from one
replica to the other; a replica killed mid-turn costs that one turn (its thread is told), and
the other replica answers the thread's next message; SIGTERM lets a running turn finish.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from bench.gateway import free_port
from bot.line import INTERRUPTED_NOTICE, RESTART_NOTICE
from tests.conftest import kernel_config
from tests.fakes.bot_process import BotProcesses, eventually
from tests.fakes.openai_server import ScriptedOpenAI, answer, delay, tool_call
from tests.fakes.slack_server import FakeSlack, Message

BOT_TOKEN, SIGNING_SECRET, LLM_KEY = (
    "xoxb-replica-bot-secret-4711",
    "replica-signing-secret-4712",
    "sk-replica-llm-4713",
)
TOKEN = re.compile(r"\b([a-z]+\d+-\d+)\b")
TIMEOUT_S = 2.0  # storage.replica_timeout_s: a killed replica's threads move on after this long


def model(request: dict[str, Any]) -> Any:
    """Echo the message's token; ``set``/``get`` run code; ``slow`` hangs, ``wait`` takes 3 s;
    after code, report its output."""
    messages = request["messages"]
    last = messages[-1]
    asked = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    token = TOKEN.search(asked)
    name = token.group(1) if token else "?"
    if last["role"] == "tool":
        return answer(f"echo {name}: {str(last['content']).strip()}")
    if "slow" in asked:
        return delay(60, answer(f"echo {name}: late"))
    if "wait" in asked:
        return delay(3, answer(f"echo {name}"))
    if "set" in asked:
        return tool_call("x = 41")
    if "get" in asked:
        return tool_call("print(x + 1)")
    return answer(f"echo {name}")


@dataclass
class Replica:
    """One bot process and the URL of its Events API endpoint."""

    bots: BotProcesses
    url: str


@dataclass
class World:
    slack: FakeSlack
    llm: ScriptedOpenAI
    replicas: list[Replica]

    async def deliver(self, replica: int, event: dict[str, Any], *, retry_of: dict[str, Any] | None = None) -> None:
        """POST an event to one replica, as Slack through a load balancer would."""
        payload = retry_of if retry_of is not None else self.slack.event_callback(event)
        status, _ = await self.slack.post_event(self.replicas[replica].url, payload, retry_num=1 if retry_of else None)
        assert status == 200

    def answers(self, channel: str, thread_ts: str) -> list[str]:
        """The bot's finished answers in a thread, oldest first (notices, statuses and answers
        still streaming in left out)."""
        return [
            m.text
            for m in self.slack.bot_messages(channel, thread_ts)
            if m.text.startswith("echo ") and m.stream_state != "streaming"
        ]

    def notices(self, channel: str, thread_ts: str, text: str) -> list[Message]:
        return [m for m in self.slack.bot_messages(channel, thread_ts) if text in m.text]


def write_config(folder: Path, shared: Path, *, slack: FakeSlack, llm: ScriptedOpenAI, pg_url: str, port: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "llm": {"base_url": llm.base_url, "api_key": LLM_KEY, "model": "fake-model", "max_retries": 0},
                "slack": {
                    "bot_token": BOT_TOKEN,
                    "signing_secret": SIGNING_SECRET,
                    "api_url": slack.api_url,
                    "http_host": "127.0.0.1",
                    "http_port": port,
                },
                "kernels": kernel_config(shared),  # one workspace root for both, as a shared volume would be
                "storage": {"url": pg_url, "replica_timeout_s": TIMEOUT_S},
                "ops": {"shutdown_grace_s": 10},
            }
        )
    )
    return config


@pytest_asyncio.fixture
async def world(tmp_path: Path, pg_url: str) -> AsyncIterator[World]:
    async with (
        FakeSlack(bot_token=BOT_TOKEN, signing_secret=SIGNING_SECRET) as slack,
        ScriptedOpenAI(api_key=LLM_KEY) as llm,
    ):
        llm.script(*[model] * 1000)
        replicas = []
        for name in ("a", "b"):
            port = free_port()
            config = write_config(tmp_path / name, tmp_path, slack=slack, llm=llm, pg_url=pg_url, port=port)
            replicas.append(Replica(BotProcesses(tmp_path / name, config), f"http://127.0.0.1:{port}/slack/events"))
        try:
            await asyncio.gather(*(r.bots.start() for r in replicas))
            await asyncio.gather(*(r.bots.wait_for_log("Slack: Events API at", 60) for r in replicas))
            yield World(slack, llm, replicas)
        finally:
            for replica in replicas:
                replica.bots.cleanup()


@pytest.mark.timeout(180)
async def test_50_messages_in_10_threads_each_answered_once_in_order(world: World) -> None:
    slack = world.slack
    roots: dict[int, dict[str, Any]] = {}
    sent = 0
    for j in range(5):
        for t in range(10):
            token = f"m{t}-{j}"
            if j == 0:
                event = roots[t] = slack.mention(f"C{t}", f"question {token}")
            else:
                event = slack.message_event(f"C{t}", f"and {token}", thread_ts=roots[t]["ts"])
            payload = slack.event_callback(event)
            status, _ = await slack.post_event(world.replicas[(t + j) % 2].url, payload)
            assert status == 200
            sent += 1
            if sent % 5 == 0:  # Slack retried this one, and the balancer sent it to the other replica
                await world.deliver((t + j + 1) % 2, event, retry_of=payload)
            await asyncio.sleep(0.015)

    def done() -> bool:
        return all(len(world.answers(f"C{t}", roots[t]["ts"])) >= 5 for t in range(10))

    await eventually(done, 120)
    await asyncio.sleep(1.0)  # a duplicate answer would come now
    for t in range(10):
        assert world.answers(f"C{t}", roots[t]["ts"]) == [f"echo m{t}-{j}" for j in range(5)]
    for replica in world.replicas:  # both replicas served turns
        assert "Slack: Events API" in replica.bots.log()
    assert all(BOT_TOKEN not in m.text and LLM_KEY not in m.text for m in slack.messages)


@pytest.mark.timeout(120)
async def test_variables_follow_the_thread_to_the_other_replica(world: World) -> None:
    slack = world.slack
    root = slack.mention("CS", "please set s0-0")
    await world.deliver(0, root)
    await eventually(lambda: world.answers("CS", root["ts"]), 60)
    await world.deliver(1, slack.message_event("CS", "now get s0-1", thread_ts=root["ts"]))
    await eventually(lambda: len(world.answers("CS", root["ts"])) == 2, 60)
    assert world.answers("CS", root["ts"])[1].split() == ["echo", "s0-1:", "stdout:", "42"]
    # And back: replica a's own kernel is older than b's turn, so a restores the saved x.
    await world.deliver(0, slack.message_event("CS", "get again s0-2", thread_ts=root["ts"]))
    await eventually(lambda: len(world.answers("CS", root["ts"])) == 3, 60)
    last = world.answers("CS", root["ts"])[2]
    assert last.startswith("echo s0-2:") and last.split()[-2:] == ["stdout:", "42"], last


@pytest.mark.timeout(120)
async def test_kill_9_mid_turn_then_the_other_replica_answers_the_thread(world: World) -> None:
    slack, llm = world.slack, world.llm
    root = slack.mention("CK", "question k0-0")
    await world.deliver(0, root)
    await eventually(lambda: world.answers("CK", root["ts"]), 30)
    await world.deliver(0, slack.message_event("CK", "slow k0-1", thread_ts=root["ts"]))
    await eventually(lambda: any("k0-1" in str(r["messages"][-1].get("content")) for r in llm.requests), 30)
    await world.replicas[0].bots.kill()

    await world.deliver(1, slack.message_event("CK", "next k0-2", thread_ts=root["ts"]))
    await eventually(lambda: len(world.answers("CK", root["ts"])) == 2, 30)
    assert world.answers("CK", root["ts"]) == ["echo k0-0", "echo k0-2"]  # on replica b
    asked = [r for r in llm.requests if "k0-2" in str(r["messages"][-1].get("content"))][0]["messages"]
    assert any("echo k0-0" in str(m.get("content")) for m in asked)  # with the thread's history
    await eventually(lambda: world.notices("CK", root["ts"], INTERRUPTED_NOTICE), 30)
    await asyncio.sleep(TIMEOUT_S)  # the sweep must not tell the thread a second time
    assert len(world.notices("CK", root["ts"], INTERRUPTED_NOTICE)) == 1


@pytest.mark.timeout(120)
async def test_sigterm_lets_a_running_turn_finish(world: World) -> None:
    slack, llm = world.slack, world.llm
    root = slack.mention("CG", "wait for g0-0")
    await world.deliver(1, root)
    await eventually(lambda: any("g0-0" in str(r["messages"][-1].get("content")) for r in llm.requests), 30)
    assert await world.replicas[1].bots.terminate() == 0
    assert world.answers("CG", root["ts"]) == ["echo g0-0"]  # finished within ops.shutdown_grace_s
    assert not world.notices("CG", root["ts"], RESTART_NOTICE)
