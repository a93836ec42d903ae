"""Buttons outlive the client that posted them: after a restart (a new discord.py client on the
same fake Discord), Stop on an old status message and 👍/👎 on an old answer still arrive."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from adapters.discord import DiscordAdapter
from bot.app import Core
from tests.conftest import make_settings
from tests.fakes.bot_process import eventually
from tests.fakes.discord_server import CHANNEL_ID, GUILD_ID, USER_ID, FakeDiscord
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call

pytestmark = pytest.mark.timeout(90)


def votes(db: Path) -> list[tuple[str, str, str, int]]:
    with sqlite3.connect(db) as raw:
        rows = raw.execute("SELECT thread, turn_id, user_id, good FROM feedback").fetchall()
    raw.close()
    return [(str(t), str(m), str(u), int(g)) for t, m, u, g in rows]


async def test_stop_and_feedback_work_after_a_restart(tmp_path: Path) -> None:
    async with FakeDiscord() as fake, ScriptedOpenAI() as llm:
        settings = make_settings(
            tmp_path,
            llm_url=llm.base_url,
            discord={"token": fake.token, "api_url": fake.api_url, "gateway_url": fake.gateway_url},
        )
        async with Core.open(settings) as core:
            before = DiscordAdapter(
                settings.discord, core.dispatcher, guild_ready_timeout_s=0.05, status_interval_s=0.05
            )
            await before.start()
            after: DiscordAdapter | None = None
            try:
                llm.script(answer("Answer one."))
                first = await fake.user_message("first question", mention_bot=True)
                first_thread = int((await fake.wait_for_thread(first["id"]))["id"])
                answered = await fake.wait_for_sent(first_thread, lambda s: s.content == "Answer one.")

                llm.script(tool_call("import time\nfor _ in range(600):\n    time.sleep(0.1)\nprint('finished')"))
                second = await fake.user_message("count slowly", mention_bot=True)
                thread_id = int((await fake.wait_for_thread(second["id"]))["id"])
                await fake.wait_until(lambda: any("Running step 1" in s.content for s in fake.sent.get(thread_id, [])))
                status = next(s for s in fake.sent[thread_id] if s.custom_ids)
                assert status.custom_ids == ["threadbook:stop"]  # the same on every status: persistent

                # A new client (as after a restart): the old one gets no more events.
                after = DiscordAdapter(settings.discord, core.dispatcher, guild_ready_timeout_s=0.05)
                await after.start()
                started = time.monotonic()
                stop = await fake.press_button(status.id)
                mid = int(second["id"])
                await fake.wait_until(lambda: any(m == mid and e in "⏹️❌" for (_, m, e) in fake.reactions), 30)
                assert time.monotonic() - started < 15  # the cell alone would run for 60 s
                [ack] = [c for c in fake.callbacks if c.interaction_id == int(stop["id"])]
                assert ack.type == 6 and ack.after_s < 3
                assert "⏹️ Stopping…" in status.edits
                assert not any("finished" in s.content for s in fake.sent[thread_id])

                vote = await fake.press_button(answered.id, f"threadbook:feedback:good:{first['id']}")
                key = f"discord:{GUILD_ID}:{CHANNEL_ID}:{first_thread}"
                db = tmp_path / "data" / "threadbook.db"
                await eventually(lambda: (key, str(first["id"]), str(USER_ID), 1) in votes(db))  # polls the file
                [thanks] = [c for c in fake.callbacks if c.interaction_id == int(vote["id"])]
                assert thanks.type == 4 and thanks.ephemeral and thanks.after_s < 3
            finally:
                if after is not None:
                    await after.stop()
                await before.stop()
        assert fake.unknown_routes == []
