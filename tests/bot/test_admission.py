"""The admission chain (``bot.admission``): every rule in its order, with a real store, and the
budget rule applied when a queued turn's place comes, through the dispatcher."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio

from bot.admission import Admission
from bot.app import Core
from bot.budgets import Budgets
from bot.chain import Arrival, run_chain
from bot.events import InboundMessage, ThreadKey
from bot.store import Store
from tests.conftest import make_settings
from tests.fakes.memory import MemoryChat, MemoryOutbox
from tests.fakes.openai_server import ScriptedOpenAI, answer
from tests.slack.conftest import running_bot

SLACK_THREAD = ThreadKey("slack", "T1", "C1", "1.0")
DISCORD_THREAD = ThreadKey("discord", "G1", "C2", "99")


def message(key: ThreadKey, message_id: str, **fields: Any) -> InboundMessage:
    return InboundMessage(key=key, message_id=message_id, user_id="U1", user_name="Ana", text="hi", **fields)


async def screened(admission: Admission, message: InboundMessage) -> bool:
    """Whether ``message`` passes the screening rules (author, mention, access, duplicate), run
    as the dispatcher's chain runs them."""
    passed: list[Arrival] = []

    async def handler(arrival: Arrival) -> None:
        passed.append(arrival)

    await run_chain(admission.screening, Arrival(message, MemoryOutbox()), handler)
    return bool(passed)


async def chain(tmp_path: Path, store: Store, **sections: dict[str, Any]) -> Admission:
    settings = make_settings(tmp_path, **sections)
    return Admission(settings, store, Budgets(settings, store.usage))


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with await Store.open(tmp_path / "tb.db") as opened:
        yield opened


async def test_author_mention_access_and_duplicates_in_that_order(tmp_path: Path, store: Store) -> None:
    admission = await chain(tmp_path, store)
    assert not await screened(admission, message(SLACK_THREAD, "m0", is_bot=True))
    # Not for the bot: no mention, no DM, a thread it has no session in.
    assert not await screened(admission, message(SLACK_THREAD, "m1", mentioned=False))
    assert not await screened(admission, message(DISCORD_THREAD, "m1", mentioned=False))
    assert await screened(admission, message(SLACK_THREAD, "m2"))
    assert not await screened(admission, message(SLACK_THREAD, "m2"))  # the platform's retry
    assert await screened(admission, message(DISCORD_THREAD, "m2"))  # another platform's id
    assert await screened(admission, message(DISCORD_THREAD, "m3", is_dm=True, mentioned=False))
    # Once the bot has a session in a thread, it follows the thread without a mention.
    await store.threads.touch(SLACK_THREAD)
    await store.threads.touch(DISCORD_THREAD)
    assert await screened(admission, message(SLACK_THREAD, "m4", mentioned=False))
    assert await screened(admission, message(DISCORD_THREAD, "m4", mentioned=False))


async def test_slack_without_reply_without_mention_needs_a_mention_in_its_threads(tmp_path: Path, store: Store) -> None:
    admission = await chain(tmp_path, store, slack={"reply_without_mention": False})
    await store.threads.touch(SLACK_THREAD)
    await store.threads.touch(DISCORD_THREAD)
    assert not await screened(admission, message(SLACK_THREAD, "m1", mentioned=False))
    assert await screened(admission, message(SLACK_THREAD, "m2"))
    assert await screened(admission, message(DISCORD_THREAD, "m1", mentioned=False))  # Slack's setting only


async def test_the_allow_list_keeps_people_out_before_any_thread_opens(tmp_path: Path, store: Store) -> None:
    admission = await chain(tmp_path, store, access={"allow_channels": ["slack:C1"], "allow_users": ["U1"]})
    assert admission.may_open(platform="slack", channel="C1", user_id="U1")
    assert not admission.may_open(platform="slack", channel="C9", user_id="U1")
    assert not admission.may_open(platform="slack", channel="C1", user_id="U2")
    assert not admission.may_open(platform="slack", channel="C1", user_id="U1", is_bot=True)
    assert not await screened(admission, message(ThreadKey("slack", "T1", "C9", "1.0"), "m1"))
    assert await screened(admission, message(SLACK_THREAD, "m1"))
    assert not await store.processed.claim("slack:m1")  # the admitted message's id was claimed


async def test_the_budget_is_read_when_a_queued_turn_starts(tmp_path: Path, llm: ScriptedOpenAI) -> None:
    settings = make_settings(tmp_path, llm_url=llm.base_url, limits={"turns_per_user_minute": 1})
    async with Core.open(settings) as core:
        chat = MemoryChat(core.dispatcher)
        llm.script(answer("answer to one"))
        # Two questions at once in one thread: both pass the screen, the second queues behind the
        # first, and when its place comes the first one's turn is counted: it is refused.
        one, two = chat.message("one"), chat.message("two")
        first, second = await asyncio.gather(chat.send(one), chat.send(two))
        assert [r.text for r in first.replies] == ["answer to one"]
        [refusal] = second.replies
        assert not refusal.ok and "questions in the last minute" in refusal.text
        assert len(llm.requests) == 1  # the refused turn asked the model nothing


async def test_a_slack_thread_without_reply_without_mention_answers_mentions_only(tmp_path: Path) -> None:
    async with running_bot(tmp_path, socket_mode=False, slack_config={"reply_without_mention": False}) as bot:
        slack, llm = bot.slack, bot.llm
        llm.script(answer("Hello."))
        event = slack.mention("C_QUIET", "hi")
        await slack.post_event(bot.events_url, event)
        assert await bot.finished(event) == {"white_check_mark"}
        requests = len(llm.requests)
        unmentioned = slack.message_event("C_QUIET", "and now?", thread_ts=event["ts"])
        await slack.post_event(bot.events_url, unmentioned)
        await bot.adapter.wait_idle()
        assert len(llm.requests) == requests  # not for the bot: nothing asked, nothing posted
        assert bot.answers(event) == ["Hello."]
