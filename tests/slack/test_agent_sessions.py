"""Agent sessions against the fake Slack (real slack_sdk client): only Slack's answers that
hold for the whole app switch sessions off; a failed call for any other reason costs that call."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from adapters.slack.api import make_client
from adapters.slack.sessions import AgentSessions
from tests.fakes.slack_server import FakeSlack

SET_STATUS = "agents.sessions.setStatus"


@pytest_asyncio.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as running:
        yield running


def sessions_for(slack: FakeSlack) -> AgentSessions:
    return AgentSessions(make_client(slack.bot_token, slack.api_url))


@pytest.mark.parametrize("error", ["internal_error", "fatal_error", "service_unavailable", "invalid_arguments"])
async def test_a_failed_call_costs_only_that_call(slack: FakeSlack, error: str) -> None:
    sessions = sessions_for(slack)
    slack.fail(SET_STATUS, error)
    assert not await sessions.working("C1", "1.1", "first question")
    await sessions.done("C1", "1.1")  # the turn's end still reaches Slack
    assert await sessions.working("C1", "2.2", "second question")
    await sessions.done("C1", "2.2")
    assert slack.sessions == {("C1", "1.1"): ["active"], ("C1", "2.2"): ["processing", "active"]}


async def test_a_failed_done_and_an_exhausted_rate_limit_do_not_switch_sessions_off(slack: FakeSlack) -> None:
    sessions = sessions_for(slack)
    assert await sessions.working("C1", "1.1", "question")
    slack.fail(SET_STATUS, "ratelimited", times=4)  # the client retries 3 times on 429, then gives up
    await sessions.done("C1", "1.1")
    assert len(slack.calls_to(SET_STATUS)) == 1 + 4
    assert await sessions.working("C1", "2.2", "next question")
    assert slack.sessions == {("C1", "1.1"): ["processing"], ("C1", "2.2"): ["processing"]}


@pytest.mark.parametrize("error", ["not_allowed_token_type", "missing_scope", "unknown_method"])
async def test_an_app_slack_gives_no_sessions_is_asked_once_and_told_once(
    slack: FakeSlack, error: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="threadbook.slack")
    sessions = sessions_for(slack)
    slack.fail(SET_STATUS, error)
    assert not await sessions.working("C1", "1.1", "question")
    await sessions.done("C1", "1.1")
    assert not await sessions.working("C1", "2.2", "question")
    assert len(slack.calls_to(SET_STATUS)) == 1
    assert slack.sessions == {}
    assert len([r for r in caplog.records if "refused agent sessions" in r.getMessage()]) == 1
