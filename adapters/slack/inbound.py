"""Slack event payloads → :class:`~bot.events.InboundMessage` (pure, no I/O)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from bot.events import Attachment, FetchBytes, InboundMessage, ThreadKey

#: Message subtypes that carry something a person said; every other subtype
#: (message_changed, message_deleted, channel_join, ...) is ignored.
USER_SUBTYPES = frozenset({None, "file_share", "thread_broadcast", "me_message", "bot_message"})

#: Builds the lazy download for one Slack file object.
Fetcher = Callable[[Mapping[str, Any]], FetchBytes]


def to_inbound(event: Mapping[str, Any], *, team_id: str, bot_user_id: str, fetcher: Fetcher) -> InboundMessage | None:
    """Normalise an ``app_mention`` or ``message`` event; ``None`` for events that are not messages."""
    if event.get("subtype") not in USER_SUBTYPES or "channel" not in event or "ts" not in event:
        return None
    channel, ts = str(event["channel"]), str(event["ts"])
    text = str(event.get("text") or "")
    mention = re.compile(rf"<@{re.escape(bot_user_id)}(?:\|[^>]*)?>")
    profile = event.get("user_profile") or {}
    user_id = str(event.get("user") or event.get("bot_id") or "")
    return InboundMessage(
        key=ThreadKey("slack", team_id, channel, str(event.get("thread_ts") or ts)),
        message_id=f"{channel}:{ts}",
        user_id=user_id,
        user_name=str(profile.get("display_name") or profile.get("real_name") or user_id),
        text=_unescape(mention.sub("", text)).strip(),
        attachments=tuple(_attachment(f, fetcher) for f in event.get("files") or () if f.get("mode") != "tombstone"),
        mentioned=event.get("type") == "app_mention" or bool(mention.search(text)),
        is_dm=event.get("channel_type") == "im",
        is_bot=bool(event.get("bot_id") or event.get("bot_profile")) or event.get("subtype") == "bot_message",
    )


def _attachment(file: Mapping[str, Any], fetcher: Fetcher) -> Attachment:
    size = file.get("size")
    return Attachment(
        name=str(file.get("name") or file.get("title") or file.get("id") or "file"),
        size=int(size) if isinstance(size, int) else None,
        mime=file.get("mimetype"),
        fetch=fetcher(file),
    )


def _unescape(text: str) -> str:
    """Undo Slack's escaping of its three control characters (and nothing else)."""
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
