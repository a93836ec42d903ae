"""Slack's AI-app features, end to end (real bolt + slack_sdk, Core, kernels; fake Slack and model):
streamed answers and their fallback, 👍/👎 stored, a chart in its answer's message, and the
assistant threads of the side panel (greeting, prompts, status line, title)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from bot.events import ThreadKey
from bot.store import FeedbackCounts
from tests.fakes.openai_server import answer, tool_call
from tests.fakes.slack_server import FakeSlack, Message
from tests.slack.conftest import Bot, running_bot

pytestmark = pytest.mark.asyncio(loop_scope="module")

ANSWER = "Revenue grew **12%** in March. " * 12
PLOT = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"
#: chat.appendStream's pace: one call per 1.2 s at most (adapters/slack/stream.py).
STREAM_INTERVAL_S = 1.2


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def bot(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Bot]:
    channels = {
        "slack:C_SALES": {"suggested_prompts": [{"title": "Revenue by region", "message": "Chart revenue by region."}]}
    }
    async with running_bot(
        tmp_path_factory.mktemp("slack-native"), socket_mode=False, streaming=True, channels=channels
    ) as running:
        yield running


def live(slack: FakeSlack, channel: str, thread_ts: str) -> list[Message]:
    return [m for m in slack.bot_messages(channel, thread_ts) if not m.deleted]


def feedback_of(message: Message) -> list[dict[str, Any]]:
    return [b for b in message.blocks or [] if b.get("type") == "context_actions"]


async def test_an_answer_streams_in_whole_in_order_and_within_the_rate(bot: Bot) -> None:
    slack = bot.slack
    slack.refuse_streaming = None
    bot.llm.script(answer(ANSWER, pace_s=0.06))  # ~50 chunks over ~3 s
    calls_before = len(slack.calls)
    event = slack.mention("C_STREAM", "how did revenue do?")
    started = asyncio.get_running_loop().time()
    await slack.post_event(bot.events_url, event)
    assert await bot.finished(event) == {"white_check_mark"}
    took = asyncio.get_running_loop().time() - started
    [streamed] = [m for m in live(slack, "C_STREAM", event["ts"]) if m.stream_state is not None]
    assert streamed.stream_state == "stopped" and streamed.text.rstrip() == ANSWER.rstrip()
    assert len(streamed.pieces) >= 3  # it arrived in parts while the model wrote
    assert streamed.updates == []  # appended to, never replaced
    stream_calls = [c for c in slack.calls[calls_before:] if c.method.startswith("chat.") and "Stream" in c.method]
    assert [c.method for c in stream_calls][0] == "chat.startStream"
    assert stream_calls[0].args["recipient_user_id"] == "U1" and stream_calls[0].args["recipient_team_id"] == "T1"
    assert len(stream_calls) <= took / STREAM_INTERVAL_S + 2  # buffered: never more than one call per interval
    assert feedback_of(streamed)  # 👍/👎 under the answer
    # The answer is not posted a second time beside its stream.
    assert [m.text for m in live(slack, "C_STREAM", event["ts"]) if m is not streamed and "Revenue" in m.text] == []


async def test_words_before_code_title_its_step_and_the_chart_follows_the_answer(bot: Bot) -> None:
    """Where answers stream, the turn is one message: the plan, the step as a task card titled
    with what the model said it would do (those words never shown as a draft of the answer),
    then the answer; the chart follows in the next message."""
    slack = bot.slack
    slack.refuse_streaming = None
    # The words before the call take 0.6 s to write: long enough to be shown as a draft.
    words = tool_call(PLOT, content="Let me draw that first, one moment.", pace_s=0.1)
    bot.llm.script(words, answer("Here is the curve.", pace_s=0.02))
    event = slack.mention("C_STREAM2", "draw it")
    await slack.post_event(bot.events_url, event)
    assert await bot.finished(event) == {"white_check_mark"}
    messages = live(slack, "C_STREAM2", event["ts"])
    assert not any("Let me draw" in m.text for m in messages)  # no draft of the words as an answer
    [streamed] = [m for m in messages if m.stream_state is not None]
    assert streamed.stream_state == "stopped" and streamed.text.strip() == "Here is the curve."
    assert streamed.chunks[0] == {"type": "plan_update", "title": "draw it"}
    cards = [c for c in streamed.chunks if c["type"] == "task_update"]
    assert {c["id"] for c in cards} == {"step-1"} and cards[-1]["title"] == "Let me draw that first, one moment."
    assert cards[-1]["status"] == "complete"
    assert streamed.chunks[-1] == {"type": "markdown_text", "text": "Here is the curve."}  # after the step
    assert feedback_of(streamed)
    # The chart follows the answer, in a message of its own.
    charts = [u for u in slack.uploads if u.thread_ts == event["ts"] and u.data.startswith(b"\x89PNG")]
    assert len(charts) == 1


async def test_where_slack_refuses_streaming_the_answer_is_an_edited_message(bot: Bot) -> None:
    slack = bot.slack
    slack.refuse_streaming = "feature_not_enabled"
    try:
        for channel in ("C_EDIT", "C_EDIT2"):
            bot.llm.script(answer(ANSWER, pace_s=0.05))
            event = slack.mention(channel, "how did revenue do?")
            await slack.post_event(bot.events_url, event)
            assert await bot.finished(event) == {"white_check_mark"}
            [message] = [m for m in live(slack, channel, event["ts"]) if "Revenue" in m.text]
            assert message.stream_state is None and len(message.updates) >= 2  # drafted, then edited
            assert message.text == ANSWER.strip().replace("**", "*")  # Slack mrkdwn
            assert feedback_of(message)
        # Slack's refusal is remembered: the second answer did not ask again.
        assert len(slack.calls_to("chat.startStream")) == 1 + len(
            [c for c in slack.calls_to("chat.startStream") if c.args.get("channel") not in ("C_EDIT", "C_EDIT2")]
        )
    finally:
        slack.refuse_streaming = None


async def test_a_feedback_click_is_stored_with_its_turn(bot: Bot) -> None:
    slack = bot.slack
    bot.llm.script(answer("Forty-two."))
    event = slack.mention("C_FEEDBACK", "the answer?")
    await slack.post_event(bot.events_url, event)
    assert await bot.finished(event) == {"white_check_mark"}
    [answered] = [m for m in live(slack, "C_FEEDBACK", event["ts"]) if "Forty-two" in m.text]
    key = ThreadKey("slack", "T1", "C_FEEDBACK", event["ts"])
    status, _ = await slack.post_interactive(bot.events_url, slack.feedback_action(answered, positive=True, user="U7"))
    assert status == 200
    status, _ = await slack.post_interactive(bot.events_url, slack.feedback_action(answered, positive=False, user="U8"))
    assert status == 200
    await bot.adapter.wait_idle()
    store = bot.core.store
    assert await store.feedback.counts(key) == FeedbackCounts(good=1, bad=1)
    # A click names its turn: the question's message.
    value = feedback_of(answered)[0]["elements"][0]["positive_button"]["value"]
    assert value.endswith(f"|C_FEEDBACK:{event['ts']}")
    # `status` in the thread counts them.
    ask = slack.message_event("C_FEEDBACK", "status", thread_ts=event["ts"])
    await slack.post_event(bot.events_url, ask)
    assert await bot.finished(ask) == {"white_check_mark"}
    assert any("Feedback on answers:* 👍 1 · 👎 1" in m.text for m in live(slack, "C_FEEDBACK", event["ts"]))


async def test_an_unstreamed_answer_and_its_chart_are_one_message(tmp_path: Path) -> None:
    async with running_bot(tmp_path, socket_mode=False) as plain:
        slack = plain.slack
        plain.llm.script(tool_call(PLOT), answer("The curve peaks at step 2."))
        event = slack.mention("C_ONE", "plot it")
        await slack.post_event(plain.events_url, event)
        assert await plain.finished(event) == {"white_check_mark"}
        [message] = [m for m in live(slack, "C_ONE", event["ts"]) if "peaks" in m.text]
        assert message.files and message.text == "The curve peaks at step 2."
        [chart] = [u for u in slack.uploads if u.file_id in message.files]
        assert chart.data.startswith(b"\x89PNG")
        assert feedback_of(message)


async def test_an_assistant_thread_greets_offers_prompts_shows_status_and_answers(bot: Bot) -> None:
    slack = bot.slack
    started = slack.assistant_thread_started("D_PANEL", context_channel="C_SALES")
    await slack.post_event(bot.events_url, started)
    thread_ts = started["assistant_thread"]["thread_ts"]
    greeting = await slack.wait_for(lambda: live(slack, "D_PANEL", thread_ts))
    assert "Attach a file" in greeting[0].text
    prompts = await slack.wait_for(lambda: slack.suggested_prompts.get(("D_PANEL", thread_ts)))
    assert prompts == [{"title": "Revenue by region", "message": "Chart revenue by region."}]  # the viewed channel's

    other = slack.assistant_thread_started("D_PANEL", context_channel="C_ELSEWHERE")
    await slack.post_event(bot.events_url, other)
    defaults = await slack.wait_for(
        lambda: slack.suggested_prompts.get(("D_PANEL", other["assistant_thread"]["thread_ts"]))
    )
    assert [p["title"] for p in defaults] == ["Summarise a CSV", "Chart a trend", "What can you do?"]

    bot.llm.script(
        tool_call("import time; time.sleep(1.2)\n" + PLOT), answer("Revenue by region is charted.", pace_s=0.02)
    )
    question = slack.message_event("D_PANEL", "Chart revenue by region please", thread_ts=thread_ts, channel_type="im")
    await slack.post_event(bot.events_url, question)
    assert await bot.finished(question) == {"white_check_mark"}
    statuses = slack.statuses[("D_PANEL", thread_ts)]
    assert statuses[0] == "Thinking…" and statuses[-1] == ""  # shown while working, cleared after
    assert any(s.startswith("Running step 1") for s in statuses)
    [first_status] = [c for c in slack.calls_to("assistant.threads.setStatus") if c.args.get("thread_ts") == thread_ts][
        :1
    ]
    assert first_status.args["loading_messages"]
    assert slack.titles[("D_PANEL", thread_ts)] == "Chart revenue by region please"
    messages = live(slack, "D_PANEL", thread_ts)
    assert any(m.text == "Revenue by region is charted." and feedback_of(m) for m in messages)
    assert [u for u in slack.uploads if u.channel == "D_PANEL" and u.thread_ts == thread_ts]

    # Same kernel per thread: the next message in the assistant thread sees the variables.
    bot.llm.script(tool_call("print(plt.gcf() is not None)"), answer("Still here."))
    again = slack.message_event("D_PANEL", "and again", thread_ts=thread_ts, channel_type="im")
    await slack.post_event(bot.events_url, again)
    assert await bot.finished(again) == {"white_check_mark"}
    assert slack.titles[("D_PANEL", thread_ts)] == "Chart revenue by region please"  # named once
    tool_output = next(m["content"] for m in reversed(bot.llm.requests[-1]["messages"]) if m["role"] == "tool")
    assert "True" in tool_output


async def test_a_dm_thread_slack_gives_no_status_line_gets_the_status_message(bot: Bot) -> None:
    # Replies in a direct message's thread reach bolt's Assistant middleware too; an app without
    # the AI-app surface gets no status line there, so the status message shows the steps.
    slack = bot.slack
    slack.fail("assistant.threads.setStatus", "not_allowed_token_type")
    top = slack.message_event("D_PLAIN", "hello", channel_type="im")
    bot.llm.script(tool_call("import time; time.sleep(1.3)\nprint(1)"), answer("Printed 1."))
    reply = slack.message_event("D_PLAIN", "print one", thread_ts=top["ts"], channel_type="im")
    await slack.post_event(bot.events_url, reply)
    assert await bot.finished(reply) == {"white_check_mark"}
    [status] = [m for m in slack.messages if m.channel == "D_PLAIN" and m.deleted and m.blocks]
    assert any(text.startswith("Running step 1") for text in status.updates)
    assert len(slack.calls_to("assistant.threads.setStatus")) >= 1
    assert not [c for c in slack.calls_to("assistant.threads.setStatus") if c.args.get("channel_id") == "D_PLAIN"][1:]
