"""Slack agent sessions: each thread the bot works in is a session Slack shows as such.

While a turn runs its thread's session is ``processing`` (titled with the question when the
session is new), with Slack's own Stop button, whose ``agent_session_stopped`` event stops the
turn as our Stop button does; when the turn ends it is ``active`` again. An app Slack does not
know as an agent gets an error from ``agents.sessions.setStatus``: that is logged once, and
from then on no session is asked for (the status message and its Stop button work as before).
Any other failure (rate limit, timeout, Slack's own error, a bad argument for one thread) costs
only that one call: the next turn asks again.
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
#: Slack's answers that hold for every call of this app, not one: the method is unknown to the
#: workspace, the token is not an agent's bot token, or the app lacks the scope or the feature
#: (``agents.sessions.*`` need an app declared as an agent, which adds ``assistant:write``).
#: ``invalid_arguments`` is not here: it is about one call's channel or thread.
APP_REFUSALS = frozenset(
    {
        "not_allowed_token_type",
        "missing_scope",
        "unknown_method",
        "method_deprecated",
        "no_permission",
        "not_allowed",
        "feature_not_enabled",
        "team_not_allowed",
    }
)


class AgentSessions:
    """Sets the session status of threads, until Slack says the app has no sessions (a failed call alone does not)."""

    def __init__(self, client: AsyncWebClient, *, enabled: bool = True) -> None:
        self._client = client
        self._enabled = enabled

    async def working(self, channel: str, thread_ts: str, question: str) -> bool:
        """Mark the thread's session ``processing`` (a new one titled with ``question``); True when Slack agreed."""
        title = plain(question)
        if len(title) > TITLE_CHARS:
            title = title[: TITLE_CHARS - 1] + "…"
        return await self._set(channel, thread_ts, PROCESSING, title or None)

    async def resume(self, channel: str, thread_ts: str) -> None:
        """Mark the thread's session ``processing`` again, its title kept: a Stop the bot did
        not obey (from someone access keeps out) left the turn running."""
        await self._set(channel, thread_ts, PROCESSING, None)

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
            if result.error in APP_REFUSALS and self._enabled:
                self._enabled = False
                log.info(
                    "Slack refused agent sessions (%s): threads keep the bot's own status and Stop button; "
                    "declare the app as an agent to get Slack's (docs/slack-setup.md)",
                    result.error,
                )
            return False
        return True
