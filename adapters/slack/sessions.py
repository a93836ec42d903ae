"""Slack agent sessions: each thread the bot works in is a session Slack shows as such.

While a turn runs its thread's session is ``processing`` (titled with the question when the
session is new), with Slack's own Stop button, whose ``agent_session_stopped`` event stops the
turn as our Stop button does; when the turn ends it is ``active`` again. An app Slack does not
know as an agent gets an error from ``agents.sessions.setStatus``: that is logged once, and
from then on no session is asked for (the status message and its Stop button work as before).
"""

from __future__ import annotations

import logging

from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack.api import Failure, call
from adapters.slack.render import plain

log = logging.getLogger("threadbook.slack")

PROCESSING, ACTIVE = "processing", "active"
#: Slack's limit for a session's title.
TITLE_CHARS = 200


class AgentSessions:
    """Sets the session status of threads, until Slack says the app has no sessions."""

    def __init__(self, client: AsyncWebClient, *, enabled: bool = True) -> None:
        self._client = client
        self._enabled = enabled

    async def working(self, channel: str, thread_ts: str, question: str) -> bool:
        """Mark the thread's session ``processing`` (a new one titled with ``question``); True when Slack agreed."""
        title = plain(question)
        if len(title) > TITLE_CHARS:
            title = title[: TITLE_CHARS - 1] + "…"
        return await self._set(channel, thread_ts, PROCESSING, title or None)

    async def done(self, channel: str, thread_ts: str) -> None:
        """Mark the thread's session ``active`` again (the turn ended, or was stopped)."""
        await self._set(channel, thread_ts, ACTIVE, None)

    async def _set(self, channel: str, thread_ts: str, status: str, title: str | None) -> bool:
        if not self._enabled:
            return False
        result = await call(
            "agents.sessions.setStatus",
            self._client.agents_sessions_setStatus(channel_id=channel, thread_ts=thread_ts, status=status, title=title),
        )
        if isinstance(result, Failure):
            if self._enabled:
                self._enabled = False
                log.info(
                    "Slack refused agent sessions (%s): threads keep the bot's own status and Stop button; "
                    "declare the app as an agent to get Slack's (docs/slack-setup.md)",
                    result.error,
                )
            return False
        return True
