"""Lay out one reply as Discord messages: text in 2,000-character chunks, the last chunk carrying
the images and files (up to 10 per message) and the buttons; the same for a thread and for an
interaction's followups.

A chart thus arrives in the same message as the answer it belongs to. Tables become aligned
code blocks first (:mod:`adapters.tables`): Discord renders no Markdown tables.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import discord

from adapters.discord import render
from adapters.discord.uploads import Upload, open_files, plan_uploads, release
from adapters.tables import align_tables
from adapters.textsplit import split_markdown
from bot.events import Reply

log = logging.getLogger(__name__)

MESSAGE_LIMIT = 2000

#: Posts one message: its text (None: none), its files, its buttons (None: none). Raises what
#: discord.py raises.
SendMessage = Callable[[str | None, list[discord.File], discord.ui.View | None], Awaitable[object]]


def message_extras(files: list[discord.File], view: discord.ui.View | None) -> dict[str, Any]:
    """The ``files`` and ``view`` keyword arguments of a discord.py send, only those given."""
    extras: dict[str, Any] = {}
    if files:
        extras["files"] = files
    if view is not None:
        extras["view"] = view
    return extras


def text_chunks(text: str) -> list[str]:
    """``text`` with tables aligned and links made honest (:mod:`adapters.discord.render`),
    split into messages Discord accepts."""
    return split_markdown(render.text(align_tables(text)), MESSAGE_LIMIT)


async def send_text(send: SendMessage, text: str) -> None:
    """Post ``text`` (tables aligned) in as many messages as it needs."""
    for chunk in text_chunks(text):
        await send(chunk, [], None)


async def send_reply(
    send: SendMessage, reply: Reply, *, upload_limit: int, view: discord.ui.View | None = None, where: object = ""
) -> None:
    """Post ``reply``: its text, whose last chunk carries the first batch of files; further
    batches follow; ``view`` (buttons) goes on the last message. Notes about files that cannot
    go (too big, unreadable) end the text; an upload that fails still gets its text through,
    then a note."""
    plan = await plan_uploads(reply.images, reply.files, upload_limit)
    try:
        text = "\n\n".join(part for part in (reply.text.strip("\n"), "\n".join(plan.notes)) if part.strip())
        chunks = text_chunks(text)
        for chunk in chunks[:-1]:
            await send(chunk, [], None)
        last = chunks[-1] if chunks else None
        if not plan.batches:
            if last is not None:
                await send(last, [], view)
            return
        failures: list[str] = []
        for number, batch in enumerate(plan.batches, 1):
            final = number == len(plan.batches)
            failures.extend(
                await _send_batch(send, batch, last if number == 1 else None, view if final else None, where)
            )
        if failures:
            await send_text(send, "\n".join(failures))
    finally:
        await asyncio.to_thread(plan.close)


async def _send_batch(
    send: SendMessage, batch: list[Upload], text: str | None, view: discord.ui.View | None, where: object
) -> list[str]:
    """One message of attachments (streamed from their readers) with ``text`` and ``view``;
    returns notes for the user. What cannot be uploaded leaves the text and buttons to go alone."""
    files, unreadable = await asyncio.to_thread(open_files, batch)
    notes = [f"📄 `{name}` could not be read any more." for name in unreadable]
    if not files:
        if text is not None or view is not None:
            await send(text, [], view)
        return notes
    names = ", ".join(f"`{file.filename}`" for file in files)
    try:
        await send(text, files, view)
        return notes
    except discord.HTTPException as exc:
        log.warning("uploading %s to %s failed: %s", names, where, exc)
        notes.append(f"⚠️ Could not upload {names}: {exc.text or exc.status}.")
    except (aiohttp.ClientError, OSError) as exc:  # a reader that broke mid-upload, a dropped connection
        log.warning("uploading %s to %s failed: %r", names, where, exc)
        notes.append(f"⚠️ Could not upload {names}: the upload broke off.")
    finally:
        await asyncio.to_thread(release, files)
    if text is not None or view is not None:
        await send(text, [], view)
    return notes
