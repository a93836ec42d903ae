"""Turn a discord.py message into the core's :class:`InboundMessage` (pure translation, no I/O)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable

import discord

from bot.events import Attachment, InboundMessage, ThreadKey
from bot.safetext import shown

PLATFORM = "discord"
THREAD_NAME_LIMIT = 100  # Discord's maximum thread name length
_DEFAULT_THREAD_NAME = "Threadbook session"
_NAME_NOISE = re.compile(r"[`*_~|>#]+")
_SPACES = re.compile(r"\s+")

#: Streams the bytes at a CDN URL.
Downloader = Callable[[str], AsyncIterator[bytes]]


def strip_mention(text: str, bot_id: int) -> str:
    """Remove the bot's own ``<@id>`` / ``<@!id>`` mentions; other mentions stay."""
    return re.sub(rf"<@!?{bot_id}>", "", text).strip()


def is_mentioned(message: discord.Message, bot_id: int) -> bool:
    """True when the message @-mentions the bot user."""
    return any(user.id == bot_id for user in message.mentions)


def is_bot_author(message: discord.Message) -> bool:
    """True for bots (ourselves included) and webhooks: their messages never start a turn."""
    return message.author.bot or message.webhook_id is not None


def thread_name(question: str, attachment_names: list[str] | None = None) -> str:
    """A thread title from the question's first line or the first attachment's name (at most 100
    characters, cut at a word), control, format and bidi characters shown escaped
    (:func:`bot.safetext.shown`)."""
    line = next((part for part in question.splitlines() if part.strip()), "")
    name = _SPACES.sub(" ", _NAME_NOISE.sub(" ", line)).strip()
    if not name and attachment_names:
        name = attachment_names[0]
    if not name:
        return _DEFAULT_THREAD_NAME
    name = shown(name, max_chars=len(name) * 10)  # escaped whole; cut at a word below
    limit = THREAD_NAME_LIMIT - 1
    if len(name) <= THREAD_NAME_LIMIT:
        return name
    cut = name.rfind(" ", limit // 2, limit)
    return name[: cut if cut > 0 else limit].rstrip() + "…"


def session_key(channel: discord.abc.Messageable) -> ThreadKey:
    """The thread key for a DM channel or a guild thread.

    A DM channel is one session (``discord:dm:<channel>:<channel>``); a thread is keyed by its
    guild, parent channel and own id.
    """
    if isinstance(channel, discord.Thread):
        return ThreadKey(PLATFORM, str(channel.guild.id), str(channel.parent_id), str(channel.id))
    if isinstance(channel, discord.DMChannel):
        return ThreadKey(PLATFORM, "dm", str(channel.id), str(channel.id))
    raise TypeError(f"no session key for {type(channel).__name__}")


def to_inbound(message: discord.Message, *, key: ThreadKey, bot_id: int, download: Downloader) -> InboundMessage:
    """Build the :class:`InboundMessage` for ``message`` in the session ``key``.

    Attachments are not downloaded here: each one's ``fetch`` streams it from the CDN on demand.
    """
    return InboundMessage(
        key=key,
        message_id=str(message.id),
        user_id=str(message.author.id),
        user_name=message.author.display_name,
        text=strip_mention(message.content, bot_id),
        attachments=tuple(attachment_of(item, download) for item in message.attachments),
        mentioned=is_mentioned(message, bot_id),
        is_dm=isinstance(message.channel, discord.DMChannel),
        is_bot=is_bot_author(message),
    )


def forum_question(title: str, body: str) -> str:
    """The question a forum post asks: its title, then its text (the title alone when the text
    adds nothing, e.g. only a mention)."""
    title, body = title.strip(), body.strip()
    if not title or title == _DEFAULT_THREAD_NAME or body.startswith(title):
        return body
    return f"{title}\n\n{body}" if body else title


def is_post_start(message: discord.Message, thread: discord.Thread) -> bool:
    """True for the starter message of a forum post (it has the post's id)."""
    return message.id == thread.id


def attachment_of(item: discord.Attachment, download: Downloader) -> Attachment:
    """The core's :class:`Attachment` for a Discord attachment (fetched from the CDN on demand)."""

    def fetch() -> AsyncIterator[bytes]:
        return download(item.url)

    return Attachment(name=item.filename, size=item.size, mime=item.content_type, fetch=fetch)
