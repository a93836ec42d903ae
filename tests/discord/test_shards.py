"""Discord with replicas: each replica runs its own shards (``discord.shard_count`` /
``discord.shard_ids``), real discord.py against the fake, which routes each guild's events
to the connection of its shard (``(guild_id >> 22) % count``) as Discord does."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from adapters.discord import DiscordAdapter
from bot.app import Core
from bot.config import ConfigError, parse_settings
from bot.events import ThreadKey
from tests.conftest import make_settings
from tests.fakes.discord_server import CHANNEL_ID, GUILD_ID, SECOND_CHANNEL_ID, SECOND_GUILD_ID, FakeDiscord
from tests.fakes.openai_server import ScriptedOpenAI, answer

pytestmark = pytest.mark.timeout(60)


def shard_settings(tmp_path: Path, fake: FakeDiscord, llm: ScriptedOpenAI, **discord: Any) -> Any:
    return make_settings(
        tmp_path,
        llm_url=llm.base_url,
        discord={"token": fake.token, "api_url": fake.api_url, "gateway_url": fake.gateway_url, **discord},
    )


async def answered_in(fake: FakeDiscord, message: dict[str, Any]) -> list[str]:
    """The answers in the thread ``message`` opened, once its turn is done (✅ on the message)."""
    thread = await fake.wait_for_thread(message["id"])
    mid = int(message["id"])
    await fake.wait_until(lambda: any(m == mid and e == "✅" for (_, m, e) in fake.reactions))
    return [s.content for s in fake.sent.get(int(thread["id"]), []) if s.content.startswith("answer")]


async def test_two_replicas_each_answer_the_guilds_of_their_shard(tmp_path: Path) -> None:
    assert (GUILD_ID >> 22) % 2 == 1 and (SECOND_GUILD_ID >> 22) % 2 == 0
    async with FakeDiscord(guilds=2, shards=2) as fake, ScriptedOpenAI() as llm, AsyncExitStack() as stack:
        llm.script(*[lambda request: answer(f"answer to {request['messages'][-1]['content'][-2:]}")] * 10)
        replicas = []
        for shard in (0, 1):
            settings = shard_settings(tmp_path / f"r{shard}", fake, llm, shard_count=2, shard_ids=[shard])
            core = await stack.enter_async_context(Core.open(settings))
            adapter = DiscordAdapter(settings.discord, core.dispatcher, guild_ready_timeout_s=0.05)
            await adapter.start()
            stack.push_async_callback(adapter.stop)
            replicas.append(core)
        assert sorted(s for s in fake.identified_shards if s) == [(0, 2), (1, 2)]

        first = await fake.user_message("hello g1", mention_bot=True, channel_id=CHANNEL_ID)
        second = await fake.user_message("hello g2", mention_bot=True, channel_id=SECOND_CHANNEL_ID)
        assert await answered_in(fake, first) == ["answer to g1"]
        assert await answered_in(fake, second) == ["answer to g2"]
        # Each message reached one replica only: the one whose shard holds its guild.
        asked = [
            await core.store.threads.exists(ThreadKey("discord", str(GUILD_ID), str(CHANNEL_ID), str(first["id"])))
            for core in replicas
        ]
        assert asked == [False, True]
        asked = [
            await core.store.threads.exists(
                ThreadKey("discord", str(SECOND_GUILD_ID), str(SECOND_CHANNEL_ID), str(second["id"]))
            )
            for core in replicas
        ]
        assert asked == [True, False]
        assert len(llm.requests) == 2


async def test_one_replica_with_a_shard_count_runs_every_shard(tmp_path: Path) -> None:
    async with FakeDiscord(guilds=2, shards=2) as fake, ScriptedOpenAI() as llm:
        llm.script(*[lambda request: answer(f"answer to {request['messages'][-1]['content'][-2:]}")] * 10)
        settings = shard_settings(tmp_path, fake, llm, shard_count=2)
        async with Core.open(settings) as core:
            adapter = DiscordAdapter(settings.discord, core.dispatcher, guild_ready_timeout_s=0.05)
            await adapter.start()
            try:
                assert sorted(s for s in fake.identified_shards if s) == [(0, 2), (1, 2)]
                for channel, tag in ((CHANNEL_ID, "g1"), (SECOND_CHANNEL_ID, "g2")):
                    message = await fake.user_message(f"hello {tag}", mention_bot=True, channel_id=channel)
                    assert await answered_in(fake, message) == [f"answer to {tag}"]
            finally:
                await adapter.stop()


@pytest.mark.parametrize(
    ("discord", "expected"),
    [
        ({"shard_ids": [0]}, "config: discord: Value error, shard_ids needs shard_count"),
        ({"shard_count": 2, "shard_ids": [2]}, "config: discord: Value error, shard_ids must be between 0 and"),
        ({"shard_count": 2, "shard_ids": []}, "config: discord: Value error, shard_ids must be between 0 and"),
        ({"shard_count": 0}, "config: discord.shard_count: Input should be greater than or equal to 1"),
    ],
)
def test_bad_shard_settings_are_one_line(discord: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings({"llm": {"api_key": "k"}, "discord": {"token": "t", **discord}}, env={})
    assert str(caught.value).replace("Value error, ", "").startswith(expected.replace("Value error, ", ""))
