"""``DiscordAdapter.thread_open``: whether a thread can still be posted into, asked of Discord.

Real discord.py against the fake Discord, the real Core, scripted LLM. Each test opens its own
thread by mentioning the bot, then a moderator deletes, locks or archives it (or Discord fails)
and the adapter is asked. Most changes are made without the gateway event (``announce=False``):
the client's cache is stale, so only a REST lookup can tell.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from adapters.discord import DiscordAdapter
from adapters.discord import adapter as discord_adapter
from bot.app import Core
from bot.events import ThreadKey
from tests.conftest import make_settings
from tests.discord.conftest import running_adapter
from tests.fakes.discord_server import CHANNEL_ID, GUILD_ID, USER_ID, FakeDiscord
from tests.fakes.openai_server import ScriptedOpenAI, answer

pytestmark = pytest.mark.asyncio(loop_scope="module")


@dataclass
class World:
    discord: FakeDiscord
    llm: ScriptedOpenAI
    core: Core
    adapter: DiscordAdapter

    async def thread(self) -> tuple[int, ThreadKey]:
        """A thread opened by a mention in #general, its first turn done; its id and key."""
        self.llm.script(answer("Hi."))
        message = await self.discord.user_message("say hi", mention_bot=True)
        thread_id = int((await self.discord.wait_for_thread(message["id"]))["id"])
        await self.discord.wait_until(
            lambda: any(m == thread_id and e == "✅" for (_, m, e) in self.discord.reactions), 30
        )
        key = ThreadKey("discord", str(GUILD_ID), str(CHANNEL_ID), str(thread_id))
        assert self.adapter.outbox_for(key) is not None  # a key the adapter serves
        return thread_id, key

    def lookups(self, thread_id: int) -> int:
        """How many times the client asked Discord for the channel ``thread_id``."""
        return self.discord.requests.count(f"GET /channels/{thread_id}")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    tmp_path = tmp_path_factory.mktemp("discord-thread-open")
    async with FakeDiscord() as fake, ScriptedOpenAI() as llm:
        settings = make_settings(
            tmp_path,
            llm_url=llm.base_url,
            discord={"token": fake.token, "api_url": fake.api_url, "gateway_url": fake.gateway_url},
            access={"allow_users": [str(USER_ID)]},
        )
        async with running_adapter(settings) as (core, adapter):
            yield World(fake, llm, core, adapter)
        assert fake.unknown_routes == []
        assert llm.remaining == 0


async def test_an_open_thread_is_open_and_discord_is_asked(world: World) -> None:
    thread_id, key = await world.thread()
    before = world.lookups(thread_id)
    assert await world.adapter.thread_open(key) is True
    assert world.lookups(thread_id) == before + 1  # a REST call, not the cache


@pytest.mark.parametrize("announce", [False, True], ids=["missed-event", "announced"])
async def test_a_deleted_thread_is_gone(world: World, announce: bool) -> None:
    thread_id, key = await world.thread()
    await world.discord.delete_channel(thread_id, announce=announce)
    assert await world.adapter.thread_open(key) is False
    assert world.lookups(thread_id) >= 1


async def test_a_locked_thread_is_gone(world: World) -> None:
    thread_id, key = await world.thread()
    await world.discord.set_thread_state(thread_id, locked=True, announce=False)
    assert await world.adapter.thread_open(key) is False


async def test_a_locked_and_archived_thread_is_gone(world: World) -> None:
    thread_id, key = await world.thread()
    await world.discord.set_thread_state(thread_id, archived=True, locked=True)
    assert await world.adapter.thread_open(key) is False


async def test_an_archived_unlocked_thread_is_open(world: World) -> None:
    thread_id, key = await world.thread()
    await world.discord.set_thread_state(thread_id, archived=True)
    assert await world.adapter.thread_open(key) is True
    assert world.lookups(thread_id) >= 1


async def test_a_thread_unlocked_again_is_open(world: World) -> None:
    thread_id, key = await world.thread()
    await world.discord.set_thread_state(thread_id, locked=True)
    assert await world.adapter.thread_open(key) is False
    await world.discord.set_thread_state(thread_id, locked=False, announce=False)
    assert await world.adapter.thread_open(key) is True


async def test_no_access_any_more_is_gone(world: World) -> None:
    thread_id, key = await world.thread()
    world.discord.fail_next("GET", rf"^/channels/{thread_id}$", 403)
    assert await world.adapter.thread_open(key) is False


async def test_a_server_error_is_not_a_gone_thread(world: World, caplog: pytest.LogCaptureFixture) -> None:
    """Discord answers 503 (not retried by discord.py): the thread, deleted meanwhile, still counts as open."""
    thread_id, key = await world.thread()
    await world.discord.delete_channel(thread_id, announce=False)
    world.discord.fail_next("GET", rf"^/channels/{thread_id}$", 503)
    with caplog.at_level(logging.WARNING, logger=discord_adapter.__name__):
        assert await world.adapter.thread_open(key) is True
    assert world.lookups(thread_id) == 1
    assert any(str(thread_id) in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


async def test_a_lasting_500_is_not_a_gone_thread(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """discord.py retries a 500 for about 25 s; the check gives up at its timeout and says open."""
    monkeypatch.setattr(discord_adapter, "THREAD_CHECK_TIMEOUT_S", 0.5)
    thread_id, key = await world.thread()
    await world.discord.delete_channel(thread_id, announce=False)
    world.discord.fail_next("GET", rf"^/channels/{thread_id}$", 500, times=100)
    started = time.monotonic()
    assert await world.adapter.thread_open(key) is True
    assert time.monotonic() - started < 3
    assert world.lookups(thread_id) >= 1


async def test_one_500_is_retried_and_the_answer_counts(world: World) -> None:
    """A single 500 is retried by discord.py within the timeout: the retry sees the thread deleted."""
    thread_id, key = await world.thread()
    await world.discord.delete_channel(thread_id, announce=False)
    world.discord.fail_next("GET", rf"^/channels/{thread_id}$", 500)
    assert await world.adapter.thread_open(key) is False
    assert world.lookups(thread_id) == 2


async def test_a_key_of_another_platform_is_not_asked(world: World) -> None:
    before = len(world.discord.requests)
    assert await world.adapter.thread_open(ThreadKey("slack", "T1", "C1", "1700000000.000100")) is True
    assert len(world.discord.requests) == before
