"""Slack's agent messaging: the app's Messages tab and the channel a person views.

In the agent experience (``agent_view`` in the manifest) a person talks to the app in its
Messages tab, a direct message whose top-level messages each start a thread. Slack says when
the tab is opened (``app_home_opened`` with ``tab: "messages"``) and which channel, canvas or
message the person looks at (``app_context_changed``, and ``app_context`` on their messages).

- **Suggested prompts** are set for the DM (no ``thread_ts``: an agent app's call with one
  silently fails): the viewed channel's ``suggested_prompts`` where it has them, else
  ``slack.assistant.prompts``; again whenever the viewed channel changes.
- **The channel in view** lends a DM thread its policy only when the person is a member of it
  (``conversations.members``, remembered for :data:`MEMBERSHIP_TTL_S`); the message then carries
  a :class:`~bot.events.ViewedChannel`, and the core decides and says the rest.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Mapping
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack.api import Failure, call
from adapters.slack.lookups import LOOKUP_TIMEOUT_S
from adapters.slack.render import plain
from bot.config import SuggestedPrompt
from bot.events import ViewedChannel

log = logging.getLogger("threadbook.slack")

#: How long a membership (or a channel's name) is taken as Slack last said.
MEMBERSHIP_TTL_S = 60.0
#: People whose viewed channel is remembered, and memberships cached (bounded, oldest dropped).
_MAX_REMEMBERED = 10_000
#: A channel that can lend a policy: public (C) or private (G); never a DM (D).
_CHANNEL_ID = re.compile(r"^[CG][A-Z0-9_]{2,30}$")
_MEMBERS_PAGE = 1000


def viewed_channel_id(context: Any) -> str | None:
    """The most relevant channel in an ``app_context``/``context`` object (its entities are
    ordered by relevance): a ``channel_id`` entity, or the channel of a ``message_context``."""
    entities = context.get("entities") if isinstance(context, Mapping) else None
    if not isinstance(entities, list):
        return None
    for entity in entities:
        if not isinstance(entity, Mapping):
            continue
        value = entity.get("value")
        if entity.get("type") == "slack#/types/channel_id":
            channel = value
        elif entity.get("type") == "slack#/types/message_context" and isinstance(value, Mapping):
            channel = value.get("channel_id")
        else:
            continue
        if isinstance(channel, str) and _CHANNEL_ID.match(channel):
            return channel
    return None


class ChannelsInView:
    """Which channel each person last viewed, whether they are a member of it, and its name."""

    def __init__(self, client: AsyncWebClient, *, clock: Any = time.monotonic) -> None:
        self._client = client
        self._clock = clock
        self._viewing: dict[str, str] = {}
        self._members: dict[tuple[str, str], tuple[bool, float]] = {}
        self._names: dict[str, tuple[str, float]] = {}

    def remember(self, user: str, channel: str | None) -> None:
        """``user`` now views ``channel`` (None: nothing a channel's policy applies to)."""
        self._viewing.pop(user, None)
        if channel is not None:
            self._viewing[user] = channel
            _bound(self._viewing)

    def viewed_by(self, user: str) -> str | None:
        """The channel ``user`` was last seen viewing on this replica."""
        return self._viewing.get(user)

    async def describe(self, channel: str, user: str) -> ViewedChannel | None:
        """``channel`` as the core gets it for ``user``'s message; None when Slack could not
        say whether they are a member (the thread then keeps its own policy)."""
        member = await self._is_member(channel, user)
        if member is None:
            return None
        return ViewedChannel(key=f"slack:{channel}", name=await self._name(channel), member=member)

    async def member(self, channel_key: str, user: str) -> bool | None:
        """Whether ``user`` is a member of the channel of ``channel_key`` (``slack:C…``) now, as
        Slack says (remembered for :data:`MEMBERSHIP_TTL_S`); None when it could not be asked."""
        platform, _, channel = channel_key.partition(":")
        if platform != "slack" or not _CHANNEL_ID.match(channel):
            return False
        return await self._is_member(channel, user)

    async def _is_member(self, channel: str, user: str) -> bool | None:
        now = self._clock()
        known = self._members.get((channel, user))
        if known is not None and known[1] > now:
            return known[0]
        try:
            async with asyncio.timeout(LOOKUP_TIMEOUT_S):
                member = await self._walk_members(channel, user)
        except TimeoutError:
            member = None
        if member is None:
            log.warning("Slack: could not tell whether %s is a member of %s", user, channel)
            return None
        self._members[(channel, user)] = (member, now + MEMBERSHIP_TTL_S)
        _bound(self._members)
        return member

    async def _walk_members(self, channel: str, user: str) -> bool | None:
        cursor = ""
        while True:
            page = await call(
                "conversations.members",
                self._client.conversations_members(channel=channel, limit=_MEMBERS_PAGE, cursor=cursor or None),
                expected=frozenset({"channel_not_found"}),
            )
            if isinstance(page, Failure):
                return False if page.error == "channel_not_found" else None
            if user in (page.get("members") or []):
                return True
            cursor = str((page.get("response_metadata") or {}).get("next_cursor") or "")
            if not cursor:
                return False

    async def _name(self, channel: str) -> str:
        now = self._clock()
        known = self._names.get(channel)
        if known is not None and known[1] > now:
            return known[0]
        try:
            async with asyncio.timeout(LOOKUP_TIMEOUT_S):
                info: Any = await call("conversations.info", self._client.conversations_info(channel=channel))
        except TimeoutError:
            info = Failure("conversations.info", "timeout")
        name = channel
        if not isinstance(info, Failure):
            given = (info.get("channel") or {}).get("name")
            if isinstance(given, str) and given:
                name = plain(given)
        self._names[channel] = (name, now + MEMBERSHIP_TTL_S)
        _bound(self._names)
        return name


async def offer_prompts(client: AsyncWebClient, dm_channel: str, prompts: tuple[SuggestedPrompt, ...]) -> None:
    """Set the DM's suggested prompts (Slack shows them above the composer)."""
    if not prompts:
        return
    await call(
        "assistant.threads.setSuggestedPrompts",
        client.assistant_threads_setSuggestedPrompts(
            channel_id=dm_channel, prompts=[{"title": plain(p.title), "message": p.message} for p in prompts]
        ),
    )


def _bound(mapping: dict[Any, Any]) -> None:
    while len(mapping) > _MAX_REMEMBERED:
        mapping.pop(next(iter(mapping)))
