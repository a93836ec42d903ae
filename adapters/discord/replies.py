"""Lay out one reply as Discord messages: text in 2,000-character chunks, the last chunk carrying
the images and files (up to 10 per message) and the buttons; the same for a thread and for an
interaction's followups.

A chart thus arrives in the same message as the answer it belongs to. Where Discord takes
components v2 and everything fits one message, that last message is a container instead: the
text, a gallery of the charts, the files (:mod:`adapters.discord.layout`); refused once, never
again in the process. Tables become aligned code blocks first (:mod:`adapters.tables`): Discord
renders no Markdown tables; tables the code showed come first, each with its caption.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import discord

from adapters.discord import render
from adapters.discord.layout import LayoutSupport, answer_view, shown_table
from adapters.discord.uploads import Upload, UploadPlan, open_files, plan_uploads, release
from adapters.textsplit import split_markdown
from bot.events import Reply
from bot.safetext import inline_code

log = logging.getLogger(__name__)

MESSAGE_LIMIT = 2000

#: Posts one message: its text (None: none), its files, its buttons or components-v2 layout
#: (None: none). Raises what discord.py raises.
SendMessage = Callable[
    [str | None, list[discord.File], discord.ui.View | discord.ui.LayoutView | None], Awaitable[object]
]


def message_extras(files: list[discord.File], view: discord.ui.View | discord.ui.LayoutView | None) -> dict[str, Any]:
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
    return split_markdown(render.answer(text), MESSAGE_LIMIT)


async def send_text(send: SendMessage, text: str) -> None:
    """Post ``text`` (tables aligned) in as many messages as it needs."""
    for chunk in text_chunks(text):
        await send(chunk, [], None)


async def send_reply(
    send: SendMessage,
    reply: Reply,
    *,
    upload_limit: int,
    view: discord.ui.View | None = None,
    where: object = "",
    layout: LayoutSupport | None = None,
) -> None:
    """Post ``reply``: the tables the code showed, then its text, whose last chunk carries the
    first batch of files; further batches follow; ``view`` (buttons) goes on the last message.
    Notes about files that cannot go (too big, unreadable) end the text; an upload that fails
    still gets its text through, then a note. With ``layout`` (components v2 allowed) an answer
    with pictures or files whose last part and files fit one message is one container message."""
    for table in reply.tables:
        await send(shown_table(table, MESSAGE_LIMIT), [], None)
    plan = await plan_uploads(reply.images, reply.files, upload_limit)
    try:
        text = "\n\n".join(part for part in (reply.text.strip("\n"), "\n".join(plan.notes)) if part.strip())
        chunks = text_chunks(text)
        if layout is not None and layout.enabled and len(plan.batches) == 1 and chunks:
            if await _send_container(send, chunks, plan, reply, view, layout, where):
                return
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


async def _send_container(
    send: SendMessage,
    chunks: list[str],
    plan: UploadPlan,
    reply: Reply,
    view: discord.ui.View | None,
    layout: LayoutSupport,
    where: object,
) -> bool:
    """The answer's leading chunks, then its last one with the pictures and files as one
    components-v2 message; False when that cannot be (the caller posts as before: nothing of
    the container was posted)."""
    batch = plan.batches[0]
    pictures = {image.filename for image in reply.images}
    images = [u.name for u in batch if u.name in pictures]
    others = [u.name for u in batch if u.name not in pictures]
    container = answer_view(chunks[-1], images, others, view)
    if container is None:
        return False
    files, unreadable = await asyncio.to_thread(open_files, batch)
    try:
        if unreadable:
            return False
        for chunk in chunks[:-1]:
            await send(chunk, [], None)
        chunks[:-1] = []
        await send(None, files, container)
        return True
    except discord.HTTPException as exc:
        log.warning("a components v2 message to %s failed (%s); posting as before", where, exc)
        if exc.status == 400:
            layout.refuse(exc.text or str(exc.status))
        if view is not None and not view.children:
            for item in container.children[1:]:  # the buttons go back for the message posted instead
                for button in getattr(item, "children", []):
                    view.add_item(button)
        return False
    finally:
        await asyncio.to_thread(release, files)


async def _send_batch(
    send: SendMessage, batch: list[Upload], text: str | None, view: discord.ui.View | None, where: object
) -> list[str]:
    """One message of attachments (streamed from their readers) with ``text`` and ``view``;
    returns notes for the user. What cannot be uploaded leaves the text and buttons to go alone."""
    files, unreadable = await asyncio.to_thread(open_files, batch)
    notes = [f"📄 {inline_code(name)} could not be read any more." for name in unreadable]
    if not files:
        if text is not None or view is not None:
            await send(text, [], view)
        return notes
    names = ", ".join(inline_code(file.filename) for file in files)
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
