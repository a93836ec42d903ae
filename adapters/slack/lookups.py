"""What the core asks Slack about a thread or a person outside a turn: is the thread still
there, and which time zone has the author set."""

from __future__ import annotations

import asyncio
import logging

from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack.api import Failure, call
from bot.events import ThreadKey

log = logging.getLogger("threadbook.slack")

#: Slack's answers that mean nothing can be posted into the thread any more.
GONE_ERRORS = frozenset({"channel_not_found", "thread_not_found", "is_archived"})
#: A lookup slower than this counts as "could not ask" (a rate-limited call waits for its
#: Retry-After inside the client; conversations.replies allows non-Marketplace apps one call
#: a minute).
LOOKUP_TIMEOUT_S = 10.0
#: People whose time zone is remembered (bounded; a changed zone is seen after a restart).
_MAX_PEOPLE = 10_000


async def thread_open(client: AsyncWebClient, key: ThreadKey) -> bool:
    """False when Slack says ``key``'s channel is gone or archived, or its thread is gone;
    True otherwise, also when Slack could not be asked."""
    try:
        async with asyncio.timeout(LOOKUP_TIMEOUT_S):
            info = await call(
                "conversations.info", client.conversations_info(channel=key.channel), expected=GONE_ERRORS
            )
            if isinstance(info, Failure):
                return info.error not in GONE_ERRORS
            if (info.get("channel") or {}).get("is_archived"):
                return False
            replies = await call(
                "conversations.replies",
                client.conversations_replies(channel=key.channel, ts=key.thread, limit=1),
                expected=GONE_ERRORS,
            )
    except TimeoutError:
        log.warning("Slack: could not tell within %.0f s whether thread %s is open", LOOKUP_TIMEOUT_S, key)
        return True
    if isinstance(replies, Failure):
        return replies.error not in GONE_ERRORS
    # A deleted parent with replies stays as a tombstone, and the thread takes replies still.
    return bool(replies.get("messages"))


class TimezoneBook:
    """The time zone (``users.info``'s ``tz``) of each person asked about, fetched once."""

    def __init__(self, client: AsyncWebClient) -> None:
        self._client = client
        self._known: dict[str, str | None] = {}

    async def of(self, user_id: str) -> str | None:
        """``user_id``'s IANA time zone; None when Slack does not say (a failed call is not remembered)."""
        if user_id in self._known:
            return self._known[user_id]
        info = await call("users.info", self._client.users_info(user=user_id), expected=frozenset({"user_not_found"}))
        if isinstance(info, Failure):
            return None
        tz = (info.get("user") or {}).get("tz")
        zone = tz if isinstance(tz, str) and tz else None
        self._known[user_id] = zone
        while len(self._known) > _MAX_PEOPLE:
            self._known.pop(next(iter(self._known)))
        return zone
