"""kill -9 mid-turn, then a restart: the real bot process tells the Discord thread once."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import yaml

from bot.line import INTERRUPTED_NOTICE
from tests.conftest import kernel_config
from tests.fakes.bot_process import BotProcesses, eventually, in_flight_marks
from tests.fakes.discord_server import CHANNEL_ID, GUILD_ID, FakeDiscord
from tests.fakes.openai_server import ScriptedOpenAI, delay

TOKEN, LLM_KEY = "discord-e2e-secret-4714", "sk-e2e-llm-secret-4715"


@pytest_asyncio.fixture
async def world(tmp_path: Path) -> AsyncIterator[tuple[FakeDiscord, ScriptedOpenAI, BotProcesses]]:
    async with FakeDiscord(token=TOKEN) as discord, ScriptedOpenAI(api_key=LLM_KEY) as llm:
        config = tmp_path / "config.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "llm": {"base_url": llm.base_url, "api_key": LLM_KEY, "model": "fake-model", "max_retries": 0},
                    "discord": {"token": TOKEN, "api_url": discord.api_url, "gateway_url": discord.gateway_url},
                    "kernels": kernel_config(tmp_path),
                    "storage": {"path": str(tmp_path / "data" / "threadbook.db")},
                    "ops": {"shutdown_grace_s": 1},  # the hanging turn is cut off at once
                }
            )
        )
        bots = BotProcesses(tmp_path, config)
        try:
            yield discord, llm, bots
        finally:
            bots.cleanup()


@pytest.mark.timeout(60)
async def test_kill_9_mid_turn_then_restart_tells_the_discord_thread_once(
    world: tuple[FakeDiscord, ScriptedOpenAI, BotProcesses], tmp_path: Path
) -> None:
    discord, llm, bots = world
    db = tmp_path / "data" / "threadbook.db"
    llm.script(delay(120))  # the model never answers

    await bots.start()
    await discord.wait_until(lambda: discord.identifies == 1, 20)
    await bots.wait_for_log("Threadbook is running")
    question = await discord.user_message("summarise the sales", mention_bot=True)
    thread_id = int((await discord.wait_for_thread(question["id"]))["id"])
    await eventually(lambda: len(llm.requests) == 1)
    assert in_flight_marks(db) == [(f"discord:{GUILD_ID}:{CHANNEL_ID}:{thread_id}", str(question["id"]))]
    await bots.kill()

    def notices() -> list[str]:
        return [s.content for s in discord.sent.get(thread_id, []) if INTERRUPTED_NOTICE in s.content]

    await bots.start()
    await discord.wait_until(notices, 20)
    await bots.wait_for_log("interrupted turns: notified 1 thread(s)")
    assert await bots.terminate() == 0, bots.log()
    assert notices() == [INTERRUPTED_NOTICE]
    assert in_flight_marks(db) == []
    posted = json.dumps([[s.content, s.edits, [f.name for f in s.files]] for s in discord.all_sent()])
    assert TOKEN not in posted and LLM_KEY not in posted
    assert discord.unknown_routes == []
