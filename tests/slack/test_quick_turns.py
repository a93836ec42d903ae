"""A turn shows it is running only once it has run ``slack.status_after_s`` (issue 44).

A quick turn leaves no status message, agent session or :eyes: to take back (its ✅ says it
all); a slow one still gets them, and its Stop button still stops it. Real bolt, Core and
kernels; fake Slack and model.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.fakes.openai_server import answer, tool_call
from tests.fakes.slack_server import Message
from tests.slack.conftest import Bot, running_bot

pytestmark = pytest.mark.asyncio(loop_scope="module")

SHOWN = ("chat.delete", "chat.update", "agents.sessions.setStatus", "assistant.threads.setStatus", "reactions.remove")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def bot(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Bot]:
    # The default second: a follow-up's print(1) on a loaded 2-core CI machine stays well under it.
    async with running_bot(
        tmp_path_factory.mktemp("slack-quick"), socket_mode=False, slack_config={"status_after_s": 1.0}
    ) as running:
        yield running


def _status_messages(bot: Bot, channel: str) -> list[Message]:
    return [m for m in bot.slack.messages if m.channel == channel and m.blocks and "threadbook_stop" in str(m.blocks)]


async def test_a_quick_turn_posts_no_status_and_no_eyes_only_its_answer_and_a_check(bot: Bot) -> None:
    slack, llm = bot.slack, bot.llm
    llm.script(tool_call("print(1)"), answer("It printed 1."))
    first = slack.mention("C_QUICK", "print 1")
    await slack.post_event(bot.events_url, first)
    assert await bot.finished(first) == {"white_check_mark"}
    # The first turn starts the thread's kernel and may show its status; the follow-ups must not.
    shown_by_first = len(_status_messages(bot, "C_QUICK"))
    for i in range(3):  # follow-ups: the bench's turn_overhead
        llm.script(tool_call("print(1)"), answer("It printed 1."))
        before = len(slack.calls)
        event = slack.message_event("C_QUICK", f"again {i}", thread_ts=first["ts"])
        await slack.post_event(bot.events_url, event)
        assert await bot.finished(event) == {"white_check_mark"}
        methods = [c.method for c in slack.calls[before:]]
        assert "It printed 1." in bot.answers(event)[-1]
        assert not [m for m in methods if m in SHOWN], methods
        assert [c.args.get("name") for c in slack.calls[before:] if c.method == "reactions.add"] == ["white_check_mark"]
        assert "auth.test" not in methods  # bolt authorises each event from what start-up learnt
    assert len(_status_messages(bot, "C_QUICK")) == shown_by_first
    await asyncio.sleep(1.3)  # past status_after_s: nothing shows late either
    assert len(_status_messages(bot, "C_QUICK")) == shown_by_first
    assert not [
        c
        for c in slack.calls
        if c.method == "reactions.add" and c.args.get("name") == "eyes" and c.args.get("timestamp") != first["ts"]
    ]


async def test_a_quick_turn_in_an_assistant_thread_is_titled_but_sets_no_status_line(bot: Bot) -> None:
    slack, llm = bot.slack, bot.llm
    thread = slack.assistant_thread_started("D_QUICK", user="U1")
    await slack.post_event(bot.events_url, thread)
    thread_ts = thread["assistant_thread"]["thread_ts"]
    await slack.wait_for(lambda: slack.bot_messages("D_QUICK", thread_ts))  # the greeting
    before = len(slack.calls)
    llm.script(answer("Sales grew."))
    event = slack.message_event("D_QUICK", "what grew?", thread_ts=thread_ts, channel_type="im")
    await slack.post_event(bot.events_url, event)
    assert await bot.finished(event) == {"white_check_mark"}
    methods = [c.method for c in slack.calls[before:]]
    assert "assistant.threads.setTitle" in methods  # named at once, however quick the turn
    assert not [m for m in methods if m in SHOWN], methods


async def test_a_slow_turn_shows_eyes_status_and_session_and_its_stop_button_stops_it(bot: Bot) -> None:
    slack, llm = bot.slack, bot.llm
    llm.script(tool_call("import time\ntime.sleep(60)"))
    event = slack.mention("C_SLOW", "sleep a minute")
    await slack.post_event(bot.events_url, event)
    key = f"slack:T1:C_SLOW:{event['ts']}"
    await slack.wait_for(lambda: _status_messages(bot, "C_SLOW"))
    status_msg = _status_messages(bot, "C_SLOW")[0]
    assert "eyes" in slack.reactions[("C_SLOW", event["ts"])]
    assert [c for c in slack.calls_to("agents.sessions.setStatus") if c.args.get("channel_id") == "C_SLOW"]
    await slack.wait_for(lambda: (s := bot.core.pool.get(key)) is not None and s.busy)

    status, _ = await slack.post_interactive(bot.events_url, slack.block_action(status_msg, "threadbook_stop", key))
    assert status == 200
    assert await bot.finished(event, timeout=15) == {"x"}
    assert "stop" in bot.answers(event)[-1].lower()
    assert status_msg.deleted


async def test_a_crowd_of_first_events_is_authorised_from_start_up_without_asking_slack_again(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # Bolt caches auth.test only once its own first call answers: before the adapter handed it
    # the start's answer, every event arriving meanwhile asked again (100 at once, 100 calls).
    async with running_bot(tmp_path_factory.mktemp("slack-crowd"), socket_mode=False) as crowd:
        crowd.llm.script(*[answer("hello")] * 6)
        events = [crowd.slack.mention(f"C_CROWD{i}", f"hi {i}") for i in range(6)]
        await asyncio.gather(*(crowd.slack.post_event(crowd.events_url, e) for e in events))
        for event in events:
            assert await crowd.finished(event) == {"white_check_mark"}
            assert "hello" in crowd.answers(event)[-1]
        assert len(crowd.slack.calls_to("auth.test")) == 1  # the adapter's own, at start
