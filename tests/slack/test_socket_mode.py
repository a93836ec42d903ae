"""Slack over Socket Mode, end to end: bolt's aiohttp Socket Mode client against the fake's websocket."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from adapters.slack import SlackAdapter, SlackStartError
from bot.app import run_bot
from bot.config import SlackSettings
from tests.conftest import make_settings
from tests.fakes.openai_server import answer, tool_call
from tests.fakes.slack_server import FakeSlack
from tests.slack.conftest import Bot, running_bot

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def bot(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Bot]:
    async with running_bot(tmp_path_factory.mktemp("slack-socket"), socket_mode=True) as running:
        yield running


async def test_round_trip_and_reconnect_after_disconnect(bot: Bot) -> None:
    slack, llm = bot.slack, bot.llm
    assert bot.adapter.port is None  # no HTTP endpoint in Socket Mode
    assert slack.socket_connects == 1
    [opened] = slack.calls_to("apps.connections.open")
    assert opened.token == slack.app_token

    llm.script(tool_call("x = 21 * 2"), answer("Stored x."))
    first = slack.mention("C_SOCK", "set x")
    ack = await slack.socket_send("events_api", slack.event_callback(first))
    assert set(ack) == {"envelope_id"}  # acknowledged at once, with no payload
    assert await bot.finished(first) == {"white_check_mark"}
    assert bot.answers(first) == ["Stored x."]

    await slack.socket_disconnect()
    assert slack.socket_connects == 2
    assert len(slack.calls_to("apps.connections.open")) == 2

    llm.script(tool_call("print(x)"), lambda req: answer("x is " + req["messages"][-1]["content"]))
    follow_up = slack.message_event("C_SOCK", "what is x?", thread_ts=first["ts"])
    await slack.socket_send("events_api", slack.event_callback(follow_up))
    assert await bot.finished(follow_up) == {"white_check_mark"}
    assert "42" in bot.answers(first)[-1]


async def test_stop_button_over_socket_mode(bot: Bot) -> None:
    slack, llm = bot.slack, bot.llm
    requests_before = len(llm.requests)
    llm.script(tool_call("import time\ntime.sleep(60)"))
    event = slack.mention("C_SOCK_STOP", "sleep")
    await slack.socket_send("events_api", slack.event_callback(event))
    key = f"slack:T1:C_SOCK_STOP:{event['ts']}"
    status_msg = await slack.wait_for(
        lambda: next((m for m in slack.messages if m.channel == "C_SOCK_STOP" and m.blocks), None)
    )
    await slack.wait_for(lambda: (s := bot.core.pool.get(key)) is not None and s.busy)
    await asyncio.sleep(0.3)
    ack = await slack.socket_send("interactive", slack.block_action(status_msg, "threadbook_stop", key))
    assert ack["envelope_id"]
    assert await bot.finished(event, timeout=15) == {"x"}
    assert "stop" in bot.answers(event)[-1].lower()
    assert len(llm.requests) == requests_before + 1


@pytest.mark.parametrize(
    ("bad", "named"),
    [({"bot_token": "xoxb-wrong"}, "SLACK_BOT_TOKEN"), ({"app_token": "xapp-wrong"}, "SLACK_APP_TOKEN")],
)
async def test_wrong_tokens_stop_start_up_with_one_clear_line(bot: Bot, bad: dict[str, str], named: str) -> None:
    good = {"bot_token": bot.slack.bot_token, "app_token": bot.slack.app_token, "api_url": bot.slack.api_url}
    adapter = SlackAdapter(SlackSettings.model_validate({**good, **bad}), bot.core.dispatcher)
    with pytest.raises(SlackStartError, match=named) as caught:
        await adapter.start()
    assert "invalid_auth" in str(caught.value) and "\n" not in str(caught.value)


async def test_run_bot_exits_with_the_one_line_when_slack_refuses_the_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with FakeSlack() as slack:
        settings = make_settings(
            tmp_path, slack={"bot_token": "xoxb-wrong", "app_token": slack.app_token, "api_url": slack.api_url}
        )
        with caplog.at_level(logging.ERROR, logger="bot.app"):
            assert await asyncio.wait_for(run_bot(settings), 30) == 2
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == [
        "SlackAdapter could not start: Slack auth.test failed (invalid_auth): check slack.bot_token (SLACK_BOT_TOKEN)"
    ]
    assert errors[0].exc_info is None  # one line, no traceback
