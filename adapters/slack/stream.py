"""An answer written into Slack while the model writes it.

Slack's own text streaming (``chat.startStream`` / ``appendStream`` / ``stopStream``) is used
where Slack allows it. Where it refuses (an app or workspace it will not stream for), the
draft is one posted message edited in place, and the adapter remembers the refusal
(:class:`StreamingSupport`), so later turns go straight to editing.

A Markdown table is not drafted: the draft stops where one starts (:func:`_before_table`), since
the answer shows it as a native table block, which :meth:`AnswerStream.finish` puts under the
streamed text; what follows it is posted after (:mod:`adapters.slack.outbox`).

Calls are buffered by time, not by size: the first once the model has written for
:data:`FIRST_DRAFT_S` (a quick answer is posted whole instead), then at most one call per
:data:`STREAM_INTERVAL_S` per answer (≤ 50 a minute, the floor of Slack's Tier 3 and its
one-message-a-second pace in a channel), each carrying everything written since the last one.

Streamed pieces are :func:`~adapters.slack.render.markdown_text` of the whole text so far,
sent as the difference to what the message already holds: what Slack puts together is always
one rendered text, never pieces that form a mention or link between them. When rendering
the longer text changes what was sent, no more is appended and the final answer replaces the
draft; a link still being written is held back until it closes, so that is rare.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack.api import Failure, call
from adapters.slack.format import MESSAGE_LIMIT
from adapters.slack.render import markdown_text, mrkdwn
from bot.tables import answer_parts

log = logging.getLogger("threadbook.slack")

_LINK = re.compile(r"!?\[[^\]\n]*\]\([^)\n]*\)")

STREAM_INTERVAL_S = 1.2
#: A draft shows once the model has been writing this long: an answer whole by then is posted
#: whole (one call, with its charts in the same message) instead of flashing as a stream.
FIRST_DRAFT_S = 0.5
#: One ``markdown_text`` may hold 12,000 characters; a longer draft waits for the final answer.
_APPEND_LIMIT = 12_000


@dataclass
class StreamingSupport:
    """Whether Slack streams for this app (one per adapter): False once it refused."""

    native: bool = True


class AnswerStream:
    """One answer's draft message in a thread (see the module docstring).

    :meth:`write` takes the whole text so far; :meth:`drop` deletes the draft (the reply was
    code after all); :meth:`finish` makes the message show the final answer, with ``blocks``
    (the feedback buttons) under it.
    """

    def __init__(
        self,
        client: AsyncWebClient,
        *,
        channel: str,
        thread_ts: str,
        team_id: str,
        user_id: str,
        support: StreamingSupport,
        interval_s: float = STREAM_INTERVAL_S,
        first_draft_s: float = FIRST_DRAFT_S,
    ) -> None:
        self._client = client
        self._channel, self._thread_ts = channel, thread_ts
        self._team_id, self._user_id = team_id, user_id
        self._support = support
        self._interval = interval_s
        self._first_draft = first_draft_s
        #: When the reply being drafted began to arrive.
        self._began: float | None = None
        self._native = support.native
        self._ts: str | None = None
        #: What the message shows (native: the rendered Markdown sent so far; edited: the last text).
        self._sent = ""
        #: The text (as the model wrote it) of the last call, and the newest text.
        self._flushed = ""
        self._wanted = ""
        self._last = 0.0
        self._failed = False
        #: Slack's answer when it refused to finish the draft (a block it would not take, say).
        self.refused: str | None = None
        self._lock = asyncio.Lock()
        self._flusher: asyncio.Task[None] | None = None

    async def write(self, text: str) -> None:
        """Show ``text`` (the whole answer so far): now if the last call is old enough, else soon."""
        if self._failed:
            return
        self._wanted = _before_table(text)
        if self._flusher is not None and not self._flusher.done():
            return  # the scheduled call sends the newest text
        now = time.monotonic()
        if self._began is None:
            self._began = now
        wait = max(self._last + self._interval, self._began + self._first_draft) - now
        if wait <= 0:
            await self._flush()
        else:
            self._flusher = asyncio.create_task(self._flush_later(wait))

    async def drop(self) -> None:
        """Delete the draft: what was shown is not the answer."""
        await self._cancel_flusher()
        async with self._lock:
            if self._ts is not None:
                if self._native:
                    await call("chat.stopStream", self._client.chat_stopStream(channel=self._channel, ts=self._ts))
                await call("chat.delete", self._client.chat_delete(channel=self._channel, ts=self._ts))
            self._reset()

    async def finish(self, text: str, blocks: list[dict[str, Any]]) -> bool:
        """Make the draft show ``text`` (the final answer, Markdown) with ``blocks`` under it.
        False when there is no draft to finish or Slack refused: the caller posts the answer."""
        await self._cancel_flusher()
        async with self._lock:
            if self._ts is None or self._failed:
                await self._discard_unfinished()
                return False
            if self._native:
                done = await self._stop_native(text, blocks)
            else:
                done = await self._edit(text, blocks)
            if not done:
                await self._discard_unfinished()
            return done

    async def _stop_native(self, text: str, blocks: list[dict[str, Any]]) -> bool:
        assert self._ts is not None
        rest = _continuation(self._sent, markdown_text(text).text)
        if rest is not None and len(rest) <= _APPEND_LIMIT:
            stopped = await call(
                "chat.stopStream",
                self._client.chat_stopStream(
                    channel=self._channel, ts=self._ts, markdown_text=rest or None, blocks=blocks
                ),
            )
            if isinstance(stopped, Failure):
                self.refused = stopped.error
            return not isinstance(stopped, Failure)
        # The final text is not the draft continued (a cut, a retried request): replace it whole.
        stopped = await call("chat.stopStream", self._client.chat_stopStream(channel=self._channel, ts=self._ts))
        return not isinstance(stopped, Failure) and await self._edit(text, blocks)

    async def _edit(self, text: str, blocks: list[dict[str, Any]]) -> bool:
        assert self._ts is not None
        rendered = mrkdwn(text).text
        if len(rendered) > MESSAGE_LIMIT:
            return False
        section = [{"type": "section", "text": {"type": "mrkdwn", "text": rendered}}] if len(rendered) <= 2900 else []
        updated = await call(
            "chat.update",
            self._client.chat_update(
                channel=self._channel, ts=self._ts, text=rendered, blocks=[*section, *blocks] if section else None
            ),
        )
        if isinstance(updated, Failure):
            self.refused = updated.error
        return not isinstance(updated, Failure)

    async def _discard_unfinished(self) -> None:
        """A draft the final answer does not replace is deleted (the answer is posted anew)."""
        if self._ts is not None:
            await call("chat.delete", self._client.chat_delete(channel=self._channel, ts=self._ts))
        self._reset()

    def _reset(self) -> None:
        self._ts, self._sent, self._flushed, self._wanted = None, "", "", ""
        self._failed, self._began = False, None

    async def _cancel_flusher(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None

    async def _flush_later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        await self._flush()

    async def _flush(self) -> None:
        async with self._lock:
            wanted = self._wanted
            if self._failed or not wanted.strip() or wanted == self._flushed:
                return
            self._last, self._flushed = time.monotonic(), wanted
            if self._ts is not None:
                await (self._append_native if self._native else self._update_edited)(wanted)
                return
            if self._native:
                await self._start_native(wanted)
            if not self._native:  # refused just now, or before
                await self._post_edited(wanted)

    async def _start_native(self, text: str) -> None:
        first = markdown_text(_settled(text)).text[:_APPEND_LIMIT]
        started = await call(
            "chat.startStream",
            self._client.chat_startStream(
                channel=self._channel,
                thread_ts=self._thread_ts,
                markdown_text=first,
                recipient_team_id=self._team_id or None,
                recipient_user_id=self._user_id or None,
            ),
        )
        if isinstance(started, Failure):
            log.info("Slack: no native streaming here (%s); answers are drafted by editing a message", started.error)
            self._native = self._support.native = False
            return
        self._ts, self._sent = str(started["ts"]), first

    async def _append_native(self, text: str) -> None:
        assert self._ts is not None
        rendered = markdown_text(_settled(text)).text
        if not rendered.startswith(self._sent):
            return  # a retried request started over, or a link closed: the final answer replaces the draft
        rest = rendered[len(self._sent) :][:_APPEND_LIMIT]
        if not rest:
            return
        appended = await call(
            "chat.appendStream", self._client.chat_appendStream(channel=self._channel, ts=self._ts, markdown_text=rest)
        )
        if isinstance(appended, Failure):
            self._failed = True
            return
        self._sent += rest

    async def _post_edited(self, text: str) -> None:
        rendered = mrkdwn(text).text
        if len(rendered) > MESSAGE_LIMIT:
            return  # too long for one message already: the final answer is posted in parts
        posted = await call(
            "chat.postMessage",
            self._client.chat_postMessage(
                channel=self._channel, thread_ts=self._thread_ts, text=rendered, unfurl_links=False
            ),
        )
        if isinstance(posted, Failure):
            self._failed = True
            return
        self._ts, self._sent = str(posted["ts"]), text

    async def _update_edited(self, text: str) -> None:
        assert self._ts is not None
        rendered = mrkdwn(text).text
        if len(rendered) > MESSAGE_LIMIT:
            return
        updated = await call("chat.update", self._client.chat_update(channel=self._channel, ts=self._ts, text=rendered))
        if isinstance(updated, Failure):
            self._failed = True
            return
        self._sent = text


def _before_table(text: str) -> str:
    """``text`` up to the first Markdown table in it, or up to a table row still being written
    at its end (a line starting with ``|``: its delimiter row has not come yet); the whole text
    when it has neither."""
    parts = answer_parts(text)
    head = parts[0] if parts and isinstance(parts[0], str) else ""
    if len(parts) > 1 or not parts or not isinstance(parts[0], str):
        return head + "\n" if head else ""
    lines = text.split("\n")
    if len(lines) >= 2 and _row(lines[-2]) and not lines[-1].strip("-|: "):
        return "\n".join(lines[:-2]) + "\n"  # a header, and a delimiter row being written
    if _row(lines[-1]):
        return "\n".join(lines[:-1]) + ("\n" if len(lines) > 1 else "")
    return text


def _row(line: str) -> bool:
    return line.lstrip().startswith("|")


def _settled(text: str) -> str:
    """``text`` without a link still being written at its end (from its ``[`` on): a link is
    streamed once whole, so the rendered stream only grows."""
    start = text.rfind("\n") + 1
    line = text[start:]
    complete = [m.span() for m in _LINK.finditer(line)]
    for at in (i for i, ch in enumerate(line) if ch == "["):
        if not any(a <= at < b for a, b in complete):
            return text[: start + at]
    return text


def _continuation(sent: str, final: str) -> str | None:
    """What ``final`` adds to the ``sent`` draft; None when it is not the draft continued.
    The final answer comes stripped, so whitespace the draft ended with may be gone from it."""
    if final.startswith(sent):
        return final[len(sent) :]
    base = sent.rstrip()
    if not final.startswith(base):
        return None
    rest, trailing = final[len(base) :], sent[len(base) :]
    return rest[len(trailing) :] if rest.startswith(trailing) else rest.lstrip(" \t")
