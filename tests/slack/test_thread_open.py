"""What the Slack adapter tells the core outside a turn (real slack_sdk against the fake Slack):
whether a thread still takes messages, and the author's time zone, asked only when needed."""

from __future__ import annotations

from pathlib import Path

from bot.events import ThreadKey
from tests.fakes.openai_server import answer
from tests.slack.conftest import running_bot


async def test_a_thread_is_open_until_slack_says_it_is_gone(tmp_path: Path) -> None:
    async with running_bot(tmp_path, socket_mode=False) as bot:
        slack = bot.slack
        threads = {name: slack.message_event(name, "a question") for name in ("C_OPEN", "C_ARCH", "C_DEL", "C_THREAD")}
        key = {name: ThreadKey("slack", "T1", name, event["ts"]) for name, event in threads.items()}
        assert [await bot.adapter.thread_open(k) for k in key.values()] == [True] * 4

        slack.archived_channels.add("C_ARCH")
        slack.deleted_channels.add("C_DEL")
        slack.delete_thread("C_THREAD", threads["C_THREAD"]["ts"])
        assert {name: await bot.adapter.thread_open(k) for name, k in key.items()} == {
            "C_OPEN": True,
            "C_ARCH": False,
            "C_DEL": False,
            "C_THREAD": False,
        }
        # A thread the bot never saw (a wrong ts) is gone too.
        assert not await bot.adapter.thread_open(ThreadKey("slack", "T1", "C_OPEN", "1.000001"))
        # Another platform's thread is not this adapter's to judge.
        assert await bot.adapter.thread_open(ThreadKey("discord", "G", "C_DEL", "1"))


async def test_a_failed_lookup_is_not_a_gone_thread(tmp_path: Path) -> None:
    async with running_bot(tmp_path, socket_mode=False) as bot:
        slack = bot.slack
        event = slack.message_event("C_FLAKY", "a question")
        key = ThreadKey("slack", "T1", "C_FLAKY", event["ts"])
        slack.fail("conversations.info", "internal_error")
        assert await bot.adapter.thread_open(key)
        slack.fail("conversations.replies", "fatal_error")
        assert await bot.adapter.thread_open(key)
        slack.fail("conversations.info", "missing_scope")  # an app installed before the scope was added
        assert await bot.adapter.thread_open(key)


async def test_the_author_time_zone_is_asked_once_and_only_when_needed(tmp_path: Path) -> None:
    async with running_bot(tmp_path, socket_mode=False) as bot:
        slack = bot.slack
        slack.user_timezones["U1"] = "America/New_York"
        bot.llm.script(answer("Hi."))
        event = slack.mention("C_TZ", "hello")
        await slack.post_event(bot.events_url, event)
        await bot.finished(event)
        assert slack.calls_to("users.info") == []  # a plain turn never asks

        for _ in range(2):
            event = slack.mention("C_TZ", "schedule daily 18:30 the day's sales")
            await slack.post_event(bot.events_url, event)
            await bot.finished(event)
            assert "(America/New_York)" in bot.answers(event)[0]
        assert [c.args.get("user") for c in slack.calls_to("users.info")] == ["U1"]  # remembered

        slack.user_timezones["U2"] = "Mars/Olympus"  # not a zone: the default one is used
        event = slack.mention("C_TZ", "schedule daily 18:30 the day's sales", user="U2")
        await slack.post_event(bot.events_url, event)
        await bot.finished(event)
        assert "(UTC)" in bot.answers(event)[0]
