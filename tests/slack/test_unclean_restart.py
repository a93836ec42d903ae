"""kill -9 mid-turn, then a restart: the real bot process tells the Slack thread once, and only once.

The bot runs as ``python -m bot run --config FILE`` against the fake Slack (Socket Mode) and a
scripted model that hangs, so a turn is surely in flight when the process is killed.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import yaml

from bot.line import INTERRUPTED_NOTICE, RESTART_NOTICE
from tests.conftest import kernel_config
from tests.fakes.bot_process import BotProcesses, eventually, in_flight_marks
from tests.fakes.openai_server import ScriptedOpenAI, delay
from tests.fakes.slack_server import FakeSlack, Message

BOT_TOKEN, APP_TOKEN, LLM_KEY = "xoxb-e2e-bot-secret-4711", "xapp-e2e-app-secret-4712", "sk-e2e-llm-secret-4713"
INTERRUPTED, RESTARTED = "working on your message", "working on this message"
assert INTERRUPTED in INTERRUPTED_NOTICE and RESTARTED in RESTART_NOTICE


@pytest_asyncio.fixture
async def world(tmp_path: Path) -> AsyncIterator[tuple[FakeSlack, ScriptedOpenAI, BotProcesses]]:
    async with FakeSlack(bot_token=BOT_TOKEN, app_token=APP_TOKEN) as slack, ScriptedOpenAI(api_key=LLM_KEY) as llm:
        config = tmp_path / "config.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "llm": {"base_url": llm.base_url, "api_key": LLM_KEY, "model": "fake-model", "max_retries": 0},
                    "slack": {"bot_token": BOT_TOKEN, "app_token": APP_TOKEN, "api_url": slack.api_url},
                    "kernels": kernel_config(tmp_path),
                    "storage": {"path": str(tmp_path / "data" / "threadbook.db")},
                    "ops": {"shutdown_grace_s": 1},  # the hanging turn is cut off at once
                }
            )
        )
        bots = BotProcesses(tmp_path, config)
        try:
            yield slack, llm, bots
        finally:
            bots.cleanup()


def texts(slack: FakeSlack, channel: str, thread_ts: str, needle: str) -> list[Message]:
    return [m for m in slack.bot_messages(channel, thread_ts) if needle in m.text]


@pytest.mark.timeout(60)
async def test_kill_9_mid_turn_then_restart_tells_the_thread_once(
    world: tuple[FakeSlack, ScriptedOpenAI, BotProcesses], tmp_path: Path
) -> None:
    slack, llm, bots = world
    db = tmp_path / "data" / "threadbook.db"
    llm.script(delay(120), delay(120))  # the model never answers: each turn stays in flight

    # Run 1: a question, then kill -9 while the model is being asked.
    await bots.start()
    await slack.wait_for(lambda: slack.socket_connects == 1, 20)
    lost = slack.mention("C_LOST", "what is the mean of column a?")
    await slack.socket_send("events_api", slack.event_callback(lost))
    await eventually(lambda: len(llm.requests) == 1)
    assert in_flight_marks(db) == [(f"slack:T1:C_LOST:{lost['ts']}", f"C_LOST:{lost['ts']}")]
    await bots.kill()
    assert texts(slack, "C_LOST", lost["ts"], "restarted") == []  # nobody told: the process just died

    # Run 2: the thread is told once. Then a turn cut off by a graceful stop is told by that stop.
    await bots.start()
    await slack.wait_for(lambda: texts(slack, "C_LOST", lost["ts"], INTERRUPTED), 20)
    await bots.wait_for_log("interrupted turns: notified 1 thread(s)")
    graceful = slack.mention("C_GRACE", "and this one?")
    await slack.socket_send("events_api", slack.event_callback(graceful))
    await eventually(lambda: len(llm.requests) == 2)
    assert await bots.terminate() == 0, bots.log()
    assert len(texts(slack, "C_GRACE", graceful["ts"], RESTARTED)) == 1
    assert in_flight_marks(db) == []  # told by the stop itself, so not again by the next start

    # A leftover for a platform this configuration does not run: kept, and a line to wait for.
    with sqlite3.connect(db) as raw:
        raw.execute(
            "INSERT INTO turns_in_flight (thread, message_id, run, started_at) VALUES ('discord:G1:C9:99', '99', 'dead-run', ?)",
            (time.time(),),
        )
    raw.close()

    # Run 3: nobody is told again.
    await bots.start()
    await bots.wait_for_log("notified 0 thread(s); 1 kept for later")
    assert await bots.terminate() == 0, bots.log()
    assert len(texts(slack, "C_LOST", lost["ts"], INTERRUPTED)) == 1
    assert texts(slack, "C_GRACE", graceful["ts"], INTERRUPTED) == []
    assert len(texts(slack, "C_GRACE", graceful["ts"], RESTARTED)) == 1
    assert in_flight_marks(db) == [("discord:G1:C9:99", "99")]

    posted = [json.dumps([m.text, m.updates, m.blocks]) for m in slack.messages]
    posted += [u.data.decode(errors="replace") + u.filename + u.title for u in slack.uploads]
    for secret in (BOT_TOKEN, APP_TOKEN, LLM_KEY):
        assert not [p for p in posted if secret in p], f"{secret} was posted"
