"""Slack's external upload flow, streamed from open files instead of read into memory.

slack_sdk's ``files_upload_v2`` reads every file object whole before sending it, so a reply
with a few large files would hold them all in the bot's memory at once. This module does the
same three steps with the real client, but the bytes go from the reader to the socket in
small chunks, read in a worker thread:

1. ``files.getUploadURLExternal(filename, length)`` per file → an upload URL and a file id;
2. ``POST`` the file's bytes to that URL (``Content-Length`` set, body streamed);
3. one ``files.completeUploadExternal(files=[{id, title}, ...], channel_id, thread_ts)`` shares
   every uploaded file in the thread, as one message.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import aiohttp
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from adapters.slack.api import Failure, call, log
from adapters.slack.layout import BLOCK_REFUSALS
from adapters.slack.render import Mrkdwn
from bot.events import OpenReader

#: Bytes read (in a worker thread) and written per step: memory stays flat whatever the size.
CHUNK_BYTES = 1 << 20
#: Slowest upload rate still waited for; the time limit of one upload grows with its size.
MIN_RATE_BYTES_S = 256 * 1024
_ATTEMPTS = 3  # a dropped connection or a 5xx/429 is retried with a fresh reader
_RETRY_PAUSE_S = 1.0


@dataclass(frozen=True, slots=True)
class UploadItem:
    """One file to share: its name, the title Slack shows (plain text, :func:`~adapters.slack.render.plain`), its size, its bytes."""

    filename: str
    title: str
    size: int
    open_reader: OpenReader


@dataclass(slots=True)
class UploadOutcome:
    """What became of a reply's files that were not shared: unreadable (by name), failed (name → Slack's reason)."""

    unreadable: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    #: Whether a message with the files that arrived was shared in the thread.
    shared: bool = False
    #: Slack's answer when it refused the blocks first given (shared with ``retry_blocks`` instead).
    refused: str | None = None


class _ReadFailed(Exception):
    """The file could not be read to the end (gone, shrunk, or an I/O error)."""


class _SendFailed(Exception):
    """The upload URL refused the bytes or the connection broke; ``retry`` says whether to try again."""

    def __init__(self, reason: str, *, retry: bool) -> None:
        super().__init__(reason)
        self.retry = retry


async def share_files(
    client: AsyncWebClient,
    items: list[UploadItem],
    *,
    channel: str,
    thread_ts: str,
    text: Mrkdwn | None = None,
    blocks: list[dict[str, Any]] | None = None,
    retry_blocks: list[dict[str, Any]] | None = None,
) -> UploadOutcome:
    """Upload ``items`` one after another (each streamed) and share those that arrived in the
    thread, in one message that also carries ``blocks`` (or else ``text``) when given; where
    Slack refuses those blocks (:data:`BLOCK_REFUSALS`), with ``retry_blocks`` instead."""
    outcome = UploadOutcome()
    uploaded: list[tuple[str, UploadItem]] = []
    session, owned = client.session, client.session is None
    if session is None:
        session = aiohttp.ClientSession()
    try:
        for item in items:
            ticket = await call(
                "files.getUploadURLExternal",
                client.files_getUploadURLExternal(filename=item.filename, length=item.size),
            )
            if isinstance(ticket, Failure):
                outcome.failed[item.filename] = ticket.error
                continue
            try:
                await _send(client, session, str(ticket["upload_url"]), item)
            except _ReadFailed as exc:
                log.warning("could not read %s for upload: %s", item.filename, exc)
                outcome.unreadable.append(item.filename)
                continue
            except _SendFailed as exc:
                log.warning("slack upload of %s failed: %s", item.filename, exc)
                outcome.failed[item.filename] = str(exc)
                continue
            uploaded.append((str(ticket["file_id"]), item))
    finally:
        if owned:
            await session.close()
    if not uploaded:
        return outcome
    result = await _complete(client, uploaded, channel, thread_ts, text, blocks)
    if isinstance(result, Failure) and result.error in BLOCK_REFUSALS and retry_blocks is not None:
        outcome.refused = result.error
        result = await _complete(client, uploaded, channel, thread_ts, text, retry_blocks)
    if isinstance(result, Failure):
        outcome.failed.update((item.filename, result.error) for _, item in uploaded)
    else:
        outcome.shared = True
    return outcome


async def _complete(
    client: AsyncWebClient,
    uploaded: list[tuple[str, UploadItem]],
    channel: str,
    thread_ts: str,
    text: Mrkdwn | None,
    blocks: list[dict[str, Any]] | None,
) -> AsyncSlackResponse | Failure:
    """Share the uploaded files in the thread as one message carrying ``blocks`` (or ``text``)."""
    words: dict[str, Any] = {"blocks": json.dumps(blocks)} if blocks else {"initial_comment": text.text} if text else {}
    return await call(
        "files.completeUploadExternal",
        client.files_completeUploadExternal(
            files=[{"id": file_id, "title": item.title} for file_id, item in uploaded],
            channel_id=channel,
            thread_ts=thread_ts,
            **words,
        ),
    )


async def _send(client: AsyncWebClient, session: aiohttp.ClientSession, url: str, item: UploadItem) -> None:
    """POST the item's bytes to its upload URL, retrying a broken connection with a fresh reader."""
    for attempt in range(1, _ATTEMPTS + 1):
        try:
            await _send_once(client, session, url, item)
            return
        except _SendFailed as exc:
            if not exc.retry or attempt == _ATTEMPTS:
                raise
            log.info("retrying the upload of %s (%s)", item.filename, exc)
            await asyncio.sleep(_RETRY_PAUSE_S * attempt)


async def _send_once(client: AsyncWebClient, session: aiohttp.ClientSession, url: str, item: UploadItem) -> None:
    try:
        reader = await asyncio.to_thread(item.open_reader)
    except OSError as exc:
        raise _ReadFailed(str(exc)) from exc
    read_error: list[BaseException] = []
    timeout = aiohttp.ClientTimeout(
        total=client.timeout + item.size / MIN_RATE_BYTES_S, sock_connect=client.timeout, sock_read=client.timeout
    )
    extra: dict[str, Any] = {}
    if client.proxy:
        extra["proxy"] = client.proxy
    if client.ssl is not None:
        extra["ssl"] = client.ssl
    try:
        async with session.post(
            url,
            data=_chunks(reader, item.size, read_error),
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(item.size)},
            timeout=timeout,
            **extra,
        ) as response:
            body = await response.content.read(2048)  # "OK - <size>"; never more than a line
            if response.status != 200:
                retry = response.status >= 500 or response.status == 429
                raise _SendFailed(f"HTTP {response.status} {body[:200].decode(errors='replace')}".strip(), retry=retry)
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        if read_error:
            raise _ReadFailed(str(read_error[0])) from read_error[0]
        raise _SendFailed(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, retry=True) from exc
    finally:
        reader.close()
    if read_error:  # the body ended early yet the server answered 200: do not share a cut file
        raise _ReadFailed(str(read_error[0]))


async def _chunks(reader: BinaryIO, size: int, error: list[BaseException]) -> AsyncIterator[bytes]:
    """Exactly ``size`` bytes of ``reader``, read off the event loop; a short file is an error, not a hang."""
    sent = 0
    while sent < size:
        try:
            chunk = await asyncio.to_thread(reader.read, min(CHUNK_BYTES, size - sent))
        except (OSError, ValueError) as exc:  # ValueError: read from a closed file
            error.append(exc)
            raise
        if not chunk:
            short = _ReadFailed(f"the file ended after {sent} of {size} bytes")
            error.append(short)
            raise short
        sent += len(chunk)
        yield chunk
