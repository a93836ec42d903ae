"""An answer written into Slack while the model writes it.

Slack's own text streaming (``chat.startStream`` / ``appendStream`` / ``stopStream``) is used
where Slack allows it. Where it refuses (an app or workspace it will not stream for), the
draft is one posted message edited in place, and the adapter remembers the refusal
(:class:`StreamingSupport`), so later turns go straight to editing.

A Markdown table is not drafted: the draft stops where one starts (:func:`_before_table`), since
the answer shows it as a native table block, which :meth:`AnswerStream.finish` puts under the
streamed text; what follows it is posted after (:mod:`adapters.slack.outbox`).

Where Slack streams, the turn's code steps are task cards in the same message, before the
answer: each step a ``task_update`` chunk (its id stable for the step, the step's label as
title, ``in_progress`` with its latest printed lines as output while it runs, then ``complete``
or ``error``), under a ``plan_update`` titling the turn (:meth:`AnswerStream.task`). Once a step
has been shown the message is never deleted: a reply drafted before a step (the model saying
what it will do) stays above it, and the answer is appended after the last step.

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
from adapters.slack.render import markdown_text, mrkdwn, plain
from bot.events import CellProgress
from bot.safetext import cut
from bot.tables import answer_parts

log = logging.getLogger("threadbook.slack")

_LINK = re.compile(r"!?\[[^\]\n]*\]\([^)\n]*\)")

STREAM_INTERVAL_S = 1.2
#: A draft shows once the model has been writing this long: an answer whole by then is posted
#: whole (one call, with its charts in the same message) instead of flashing as a stream.
FIRST_DRAFT_S = 0.5
#: One ``markdown_text`` may hold 12,000 characters; a longer draft waits for the final answer.
_APPEND_LIMIT = 12_000
#: A task card's title and output, at most (the output is a step's latest lines).
TASK_TITLE_CHARS = 120
TASK_OUTPUT_CHARS = 1_000
#: A step's state as a card shows it.
_TASK_STATUS = {"running": "in_progress", "complete": "complete", "error": "error"}


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
        #: The plan's title (the question) and each step's card as last shown, by id; the cards
        #: changed since the last call. Text shown before a step stays, ``_kept`` long.
        self._plan = ""
        self._cards: dict[str, dict[str, Any]] = {}
        self._changed: dict[str, dict[str, Any]] = {}
        self._kept = ""

    @property
    def has_cards(self) -> bool:
        """Whether this message shows task cards (it then outlives every draft in it)."""
        return bool(self._cards)

    async def task(self, cell: CellProgress, *, plan: str) -> bool:
        """Show ``cell`` as its step's task card (``plan``: the turn's title, on the first card);
        False where this answer does not stream natively (the caller shows a status instead)."""
        if not self._native or self._failed:
            return False
        card: dict[str, Any] = {
            "type": "task_update",
            "id": f"step-{cell.round}",
            "title": plain(cut(cell.label, TASK_TITLE_CHARS)) or f"Step {cell.round}",
            "status": _TASK_STATUS[cell.state],
        }
        if output := "\n".join(cell.shown_lines()).strip():
            card["output"] = markdown_text(cut(output, TASK_OUTPUT_CHARS)).text
        if self._cards.get(card["id"]) == card:
            return True
        self._plan = self._plan or plain(cut(plan, TASK_TITLE_CHARS)) or "Working on it"
        self._cards[card["id"]] = self._changed[card["id"]] = card
        if self._flusher is None or self._flusher.done():
            now = time.monotonic()
            self._flusher = asyncio.create_task(self._flush_later(max(self._last + self._interval - now, 0.0)))
        return True

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
        """The reply drafted is not the answer: delete the draft, or where steps are shown as
        task cards, keep what it said above the next step (a streamed message only grows)."""
        await self._cancel_flusher()
        async with self._lock:
            if self._cards:
                self._kept += self._sent
                self._sent, self._flushed, self._wanted, self._began = "", "", "", None
                return
            if self._ts is not None:
                if self._native:
                    await call("chat.stopStream", self._client.chat_stopStream(channel=self._channel, ts=self._ts))
                await call("chat.delete", self._client.chat_delete(channel=self._channel, ts=self._ts))
            self._reset()

    async def abandon(self) -> None:
        """The turn ended without an answer: a message with task cards is closed (steps still
        running marked ``error``), any other draft deleted."""
        if not self._cards:
            await self.drop()
            return
        await self._cancel_flusher()
        async with self._lock:
            for card_id, card in self._cards.items():
                if card["status"] == "in_progress":
                    self._changed[card_id] = {**card, "status": "error"}
            if self._ts is not None:
                await call(
                    "chat.stopStream",
                    self._client.chat_stopStream(channel=self._channel, ts=self._ts, chunks=self._take_changed()),
                )
            self._reset()

    async def finish(self, text: str, blocks: list[dict[str, Any]]) -> bool:
        """Make the draft show ``text`` (the final answer, Markdown) with ``blocks`` under it.
        False when there is no draft to finish or Slack refused: the caller posts the answer."""
        await self._cancel_flusher()
        async with self._lock:
            if self._ts is None and self._changed and self._native and not self._failed:
                await self._start_native("")  # only cards so far, never sent: the answer starts it
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
        if rest is not None:
            rest = self._separated(rest)
        if rest is not None and len(rest) <= _APPEND_LIMIT:
            cards = self._take_changed()
            # With cards, the text goes as a chunk after them (never both fields at once).
            chunks = [*cards, *([{"type": "markdown_text", "text": rest}] if rest else [])] if cards else None
            stopped = await call(
                "chat.stopStream",
                self._client.chat_stopStream(
                    channel=self._channel,
                    ts=self._ts,
                    markdown_text=None if cards else rest or None,
                    chunks=chunks,
                    blocks=blocks,
                ),
            )
            if isinstance(stopped, Failure):
                self.refused = stopped.error
                if self._cards:  # the message stays (it shows the steps): stopped as it stands, no step left running
                    await call(
                        "chat.stopStream",
                        self._client.chat_stopStream(
                            channel=self._channel, ts=self._ts, chunks=list(self._cards.values())
                        ),
                    )
            return not isinstance(stopped, Failure)
        # The final text is not the draft continued (a cut, a retried request): replace it whole,
        # unless the message shows steps (stopped as it is; the answer is posted after it).
        stopped = await call(
            "chat.stopStream",
            self._client.chat_stopStream(channel=self._channel, ts=self._ts, chunks=self._take_changed() or None),
        )
        if self._cards:
            return False
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
        """A draft the final answer does not replace is deleted (the answer is posted anew);
        a message showing steps stays."""
        if self._ts is not None and not self._cards:
            await call("chat.delete", self._client.chat_delete(channel=self._channel, ts=self._ts))
        self._reset()

    def _reset(self) -> None:
        self._ts, self._sent, self._flushed, self._wanted = None, "", "", ""
        self._failed, self._began = False, None
        self._cards, self._changed, self._kept, self._plan = {}, {}, "", ""

    def _take_changed(self) -> list[dict[str, Any]]:
        """The cards changed since the last call (the plan's title before the first)."""
        changed = list(self._changed.values())
        self._changed = {}
        return changed

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
            text_due = not self._failed and bool(wanted.strip()) and wanted != self._flushed
            if not text_due and not (self._changed and self._native and not self._failed):
                return
            self._last = time.monotonic()
            if text_due:
                self._flushed = wanted
            if self._ts is not None:
                if self._native:
                    await self._append_native(wanted if text_due else None)
                else:
                    await self._update_edited(wanted)
                return
            if self._native:
                await self._start_native(wanted if text_due else "")
            if not self._native and text_due:  # refused just now, or before
                await self._post_edited(wanted)

    async def _start_native(self, text: str) -> None:
        first = markdown_text(_settled(text)).text[:_APPEND_LIMIT] if text else ""
        chunks = [{"type": "plan_update", "title": self._plan}, *self._take_changed()] if self._changed else []
        if chunks and first:
            chunks.append({"type": "markdown_text", "text": first})
        started = await call(
            "chat.startStream",
            self._client.chat_startStream(
                channel=self._channel,
                thread_ts=self._thread_ts,
                markdown_text=None if chunks else first,
                chunks=chunks or None,
                task_display_mode="timeline" if chunks else None,
                recipient_team_id=self._team_id or None,
                recipient_user_id=self._user_id or None,
            ),
        )
        if isinstance(started, Failure):
            log.info("Slack: no native streaming here (%s); answers are drafted by editing a message", started.error)
            self._native = self._support.native = False
            self._cards, self._changed = {}, {}  # the steps go to the status message instead
            return
        self._ts, self._sent = str(started["ts"]), first

    async def _append_native(self, text: str | None) -> None:
        """Append what changed: the cards, then the text written since (``None``: no new text)."""
        assert self._ts is not None
        rest = ""
        if text is not None:
            rendered = markdown_text(_settled(text)).text
            # A retried request started over, or a link closed: the final answer replaces the draft.
            if rendered.startswith(self._sent):
                rest = rendered[len(self._sent) :][:_APPEND_LIMIT]
        shown = self._separated(rest)
        cards = self._take_changed()
        if not shown and not cards:
            return
        if cards:
            chunks = [*cards, *([{"type": "markdown_text", "text": shown}] if shown else [])]
            appended = await call(
                "chat.appendStream", self._client.chat_appendStream(channel=self._channel, ts=self._ts, chunks=chunks)
            )
        else:
            appended = await call(
                "chat.appendStream",
                self._client.chat_appendStream(channel=self._channel, ts=self._ts, markdown_text=shown),
            )
        if isinstance(appended, Failure):
            self._failed = True
            return
        self._sent += rest

    def _separated(self, rest: str) -> str:
        """``rest`` of the reply being drafted as it is appended: a new reply's first text goes
        under what an earlier one said before a step, a blank line between them."""
        return "\n\n" + rest if rest and self._kept and not self._sent else rest

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
