"""Answering one Slack message: notices, the reply (text chunks, uploads, 👍/👎), reactions, live status.

The answer streams in while the model writes it (:mod:`adapters.slack.stream`) and ends with
the feedback buttons; charts and files follow. An answer that did not stream is posted whole,
its last part in one message with its charts and files where there are any. Tables and charts
go out as Slack's native blocks where it draws them (:mod:`adapters.slack.layout`); a message
whose native block Slack refuses is posted again as text and pictures, and the refused kind is
not sent again (:class:`~adapters.slack.layout.NativeSupport`). In an assistant thread (Slack's
AI-app surface) the status goes to Slack's own status line instead of a status message, and
the first question names the thread.
"""

from __future__ import annotations

import asyncio
import functools
import io
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from adapters.slack.api import Failure, call
from adapters.slack.blocks import NativeKind
from adapters.slack.layout import (
    BLOCK_REFUSALS,
    SECTION_LIMIT,
    Layout,
    NativeSupport,
    Post,
    TablePiece,
    lay_out,
    pieces,
    section,
)
from adapters.slack.render import Mention, Mrkdwn, cut, mrkdwn, mrkdwn_chunks, plain
from adapters.slack.sessions import AgentSessions
from adapters.slack.stream import AnswerStream, StreamingSupport
from adapters.slack.uploads import UploadItem, share_files
from bot.attachments import human_size
from bot.events import CellProgress, FileOut, Reply, ThreadKey
from bot.safetext import inline_code

STOP_ACTION_ID = "threadbook_stop"
FEEDBACK_ACTION_ID = "threadbook_feedback"
#: What the status line cycles through while a turn runs in an assistant thread.
LOADING_MESSAGES = [
    "Reading the question…",
    "Writing Python…",
    "Running it in this thread's kernel…",
    "Checking the result…",
]
RECEIVED, DONE, FAILED = "eyes", "white_check_mark", "x"
#: chat.update is rate-limited (~50/min): at most one status edit per 1.2 s, also while a long cell runs.
STATUS_INTERVAL_S = 1.2
#: A turn shows it is running (:eyes:, the message with the Stop button, the agent session, the
#: assistant status line) only once it has run this long: one that ends in a blink would post
#: them, then take them back (six Web API calls for nothing to see; its ✅ says it all).
STATUS_AFTER_S = 1.0
#: Larger result files stay in the workspace (a chat thread is no place for them; uploads stream either way).
MAX_UPLOAD_BYTES = 100 * 2**20
_NO_CHANNEL_ERRORS = frozenset({"not_in_channel", "channel_not_found", "is_archived"})


@dataclass(frozen=True, slots=True)
class AssistantThread:
    """A thread of Slack's AI-app surface: its status line is Slack's, and ``title`` (when
    set) names it as the turn starts."""

    title: str | None = None


class SlackOutbox:
    """The :class:`~bot.events.Outbox` for one inbound Slack message, answering in its thread.

    A notice, or a turn still running after ``status_after_s``, marks the message with :eyes:
    (so messages the core ignores get no reaction); the reply or the end of the turn swaps it
    for :white_check_mark: or :x: (a quick turn's message gets only that).
    """

    def __init__(
        self,
        client: AsyncWebClient,
        *,
        key: ThreadKey,
        message_ts: str,
        user_id: str,
        turn_id: str = "",
        streaming: StreamingSupport | None = None,
        assistant: AssistantThread | None = None,
        sessions: AgentSessions | None = None,
        question: str = "",
        native: NativeSupport | None = None,
        status_after_s: float = STATUS_AFTER_S,
    ) -> None:
        """``turn_id``: the question's message id, which feedback clicks refer to (none: no
        buttons); ``streaming``: stream answers (None: post them whole); ``assistant``: the
        thread is an assistant thread; ``sessions``: the thread is an agent session while the
        turn runs, titled with ``question`` (None: no sessions); ``native``: the native block
        kinds Slack refused so far (the adapter's, shared by its outboxes); ``status_after_s``:
        how long a turn runs before its status shows (:class:`SlackProgress`)."""
        self._client = client
        self.key = key
        self._message_ts = message_ts
        self._user_id = user_id
        self._turn_id = turn_id
        self._streaming = streaming
        self.assistant = assistant
        self.sessions = sessions
        self.question = question
        self._native = native if native is not None else NativeSupport()
        self._stream: AnswerStream | None = None
        #: The last upload's message carried the answer's last part.
        self._shared_text = False
        self._lock = asyncio.Lock()
        self._mark: str | None = None
        self._warned_user = False
        self.status_after_s = status_after_s

    @property
    def client(self) -> AsyncWebClient:
        """The Web API client used for this thread."""
        return self._client

    @property
    def channel(self) -> str:
        """The Slack channel id."""
        return self.key.channel

    @property
    def thread_ts(self) -> str:
        """The ts of the thread's parent message."""
        return self.key.thread

    async def notify(self, text: str) -> None:
        """Post a short notice into the thread."""
        await self.received()
        for chunk in mrkdwn_chunks(text):
            await self.say(chunk)

    async def post(self, reply: Reply) -> None:
        """Post the reply: finish its streamed draft, or post its text (split to fit) with its
        images and files shared in the last part's message; 👍/👎 under an answer."""
        feedback = feedback_blocks(self.key, self._turn_id) if reply.rateable and self._turn_id else []
        if self._stream is None or not await self._finish_stream(self._stream, reply, feedback):
            await self._post_layout(*lay_out(pieces(reply.text, self._native), reply, self._native, feedback), reply)
        self._stream = None
        await self.finished(reply.ok)

    async def _finish_stream(self, stream: AnswerStream, reply: Reply, feedback: list[dict[str, Any]]) -> bool:
        """End the draft with the answer up to its first table Slack draws (that table's block
        closing the streamed message), then post the rest; False when the draft could not be
        finished (deleted: the caller posts the answer whole)."""
        answer = pieces(reply.text, self._native)
        head: list[str] = []
        first: TablePiece | None = None
        while answer:
            piece = answer.pop(0)
            if isinstance(piece, TablePiece):
                first = piece
                break
            head.append(piece)
        layout, left = lay_out(answer, reply, self._native, feedback)
        alone = not layout.posts and layout.last is None  # nothing but files and charts follow
        blocks = [*(_table_blocks(first) if first is not None else []), *(left if alone else [])]
        if not await stream.finish("\n".join(head), blocks):
            if first is not None and stream.refused in BLOCK_REFUSALS:
                self._native.refuse(first.native.kind, stream.refused)
            return False
        if first is not None and first.csv is not None:
            layout.files.insert(0, first.csv)
        await self._post_layout(layout, [] if alone else left, reply)
        return True

    def answer_stream(self) -> AnswerStream | None:
        """The draft of this turn's answer (made on first use); None when answers are not streamed."""
        if self._streaming is None:
            return None
        if self._stream is None:
            self._stream = AnswerStream(
                self._client,
                channel=self.channel,
                thread_ts=self.thread_ts,
                team_id=self.key.workspace,
                user_id=self._user_id,
                support=self._streaming,
            )
        return self._stream

    async def abandon_draft(self) -> None:
        """Delete a draft that no reply finished (the turn failed before its answer); a message
        showing the turn's steps is closed instead, its running step marked ``error``."""
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await stream.abandon()

    async def _post_layout(self, layout: Layout, feedback: list[dict[str, Any]], reply: Reply) -> None:
        """Post the laid-out messages, then the last one: its text, charts and buttons shared
        with the pictures and files in one message where there are any."""
        for post in layout.posts:
            await self._send(post)
        final = layout.last
        charts = bool(layout.charts) and self._native.allows("data_visualization")
        blocks = layout.final_blocks(feedback, charts=charts)
        notes: list[Mrkdwn] = []
        self._shared_text = False
        if reply.images or reply.files or layout.files:
            plain_blocks = layout.final_blocks(feedback, charts=False)
            # Text, charts, buttons and files in one message.
            notes = await self._upload(
                reply, extra=layout.files, text=final, blocks=blocks, without_charts=plain_blocks if charts else None
            )
        if not self._shared_text and (final is not None or (charts and blocks)):
            native: NativeKind | None = "data_visualization" if charts else None
            rich = blocks if (feedback or charts) else []
            await self._send(Post(final or mrkdwn("Charts"), tuple(rich), native, (final,) if final else ()))
        for note in notes:
            await self.say(note)

    async def _send(self, post: Post) -> None:
        """Post one laid-out message: natively while Slack takes its kind, else its fallback
        (the same words and buttons, a table as an aligned code block, charts left to their pictures)."""
        if post.native is None:
            await self.say(post.text, blocks=list(post.blocks) or None)
            return
        if self._native.allows(post.native):
            result = await self._post_message(post.text, list(post.blocks))
            if not isinstance(result, Failure):
                return
            if result.error not in BLOCK_REFUSALS:
                await self._explain(result)
                return
            self._native.refuse(post.native, result.error)
        buttons = [b for b in post.blocks if b.get("type") == "context_actions"]
        last = SECTION_LIMIT if buttons else None  # the last text goes into a section with the buttons
        texts = post.fallback_texts(last=last) if post.fallback or post.native == "data_visualization" else [post.text]
        for number, text in enumerate(texts, 1):
            await self.say(text, blocks=[section(text), *buttons] if buttons and number == len(texts) else None)

    def progress(self) -> SlackProgress:
        """A status message with a Stop button, edited in place, shown once the turn has run
        ``status_after_s``."""
        return SlackProgress(self, show_after_s=self.status_after_s)

    async def say(self, text: Mrkdwn, blocks: list[dict[str, Any]] | None = None) -> str | None:
        """Post one rendered message in the thread; returns its ts (None if Slack refused it)."""
        result = await self._post_message(text, blocks)
        if isinstance(result, Failure):
            await self._explain(result)
            return None
        return str(result["ts"])

    async def _post_message(self, text: Mrkdwn, blocks: list[dict[str, Any]] | None) -> AsyncSlackResponse | Failure:
        return await call(
            "chat.postMessage",
            self._client.chat_postMessage(
                channel=self.channel, thread_ts=self.thread_ts, text=text.text, blocks=blocks, unfurl_links=False
            ),
        )

    async def received(self) -> None:
        """Mark the user's message with :eyes: (once)."""
        async with self._lock:
            if self._mark is None:
                self._mark = RECEIVED
                await self._react("reactions.add", RECEIVED)

    async def finished(self, ok: bool) -> None:
        """Replace the current mark with :white_check_mark: or :x:."""
        wanted = DONE if ok else FAILED
        async with self._lock:
            if self._mark == wanted:
                return
            previous, self._mark = self._mark, wanted
            # Both at once: the done mark should not wait for the removal's round trip.
            await asyncio.gather(
                self._react("reactions.add", wanted),
                *([self._react("reactions.remove", previous)] if previous is not None else []),
            )

    async def _react(self, method: str, name: str) -> None:
        if not self._message_ts:
            return  # an outbox for the thread alone (SlackAdapter.outbox_for): no message to mark
        request = (self._client.reactions_add if method == "reactions.add" else self._client.reactions_remove)(
            channel=self.channel, timestamp=self._message_ts, name=name
        )
        await call(method, request, expected=frozenset({"already_reacted", "no_reaction"}))

    async def _upload(
        self,
        reply: Reply,
        *,
        extra: list[FileOut] | None = None,
        text: Mrkdwn | None = None,
        blocks: list[dict[str, Any]] | None = None,
        without_charts: list[dict[str, Any]] | None = None,
    ) -> list[Mrkdwn]:
        """Stream the reply's images and files (and ``extra`` ones) to Slack and share them in the
        thread as one message, carrying ``text`` and ``blocks`` when given (a message that was not
        shared carries nothing); where Slack refuses the blocks' charts, ``without_charts`` instead.
        Returns the notes to post after it: files kept back or that failed."""
        # Names come with control characters escaped from the core (FileOut, ImageOut); titles are plain text.
        items = [
            UploadItem(image.filename, plain(image.title), len(image.data), functools.partial(io.BytesIO, image.data))
            for image in reply.images
        ]
        notes: list[Mrkdwn] = []
        for file in [*reply.files, *(extra or [])]:
            name = file.name
            if file.size > MAX_UPLOAD_BYTES:
                notes.append(
                    mrkdwn(
                        f":package: {inline_code(name)} is over {human_size(MAX_UPLOAD_BYTES)}, so it stays in "
                        "this thread's workspace; ask me for a smaller extract or a compressed copy."
                    )
                )
                continue
            items.append(UploadItem(name, plain(name), file.size, file.open_reader))
        if not items:
            return notes
        outcome = await share_files(
            self._client,
            items,
            channel=self.channel,
            thread_ts=self.thread_ts,
            text=text,
            blocks=blocks,
            retry_blocks=without_charts,
        )
        if outcome.refused is not None:
            self._native.refuse("data_visualization", outcome.refused)
        self._shared_text = outcome.shared
        notes += [mrkdwn(f":warning: I could not read {inline_code(name)} to send it.") for name in outcome.unreadable]
        by_error: dict[str, list[str]] = {}
        for name, error in outcome.failed.items():
            by_error.setdefault(error, []).append(name)
        for error, failed in by_error.items():
            names = ", ".join(inline_code(name) for name in failed)
            notes.append(mrkdwn(f":warning: I could not upload {names} to Slack ({error})."))
        return notes

    async def _explain(self, failure: Failure) -> None:
        """Tell the user why the thread got no answer when Slack refuses posts there."""
        if failure.error not in _NO_CHANNEL_ERRORS or self._warned_user or not self._user_id:
            return
        self._warned_user = True
        text = mrkdwn(
            "I could not answer in ",
            Mention("channel", self.channel),
            f" ({failure.error}). Invite me to the channel with `/invite @Threadbook` and ask again.",
        )
        await call("chat.postMessage", self._client.chat_postMessage(channel=self._user_id, text=text.text))


class SlackProgress:
    """One status message in the thread, edited in place (throttled) and deleted at the end.

    :eyes:, the message (with its Stop button), the agent session and the assistant status line
    show only once the turn has run ``show_after_s``: a turn that ends sooner leaves nothing to
    take back and gets only its ✅ (an assistant thread still gets its title at once)."""

    def __init__(
        self, outbox: SlackOutbox, *, interval_s: float = STATUS_INTERVAL_S, show_after_s: float = STATUS_AFTER_S
    ) -> None:
        self._outbox = outbox
        self._assistant = outbox.assistant
        self._client = outbox.client
        self._interval = interval_s
        self._show_after = show_after_s
        self._ts: str | None = None
        self._shown: str | None = None
        self._pending: str | None = None
        self._last = 0.0
        self._flusher: asyncio.Task[None] | None = None
        #: The assistant thread's title, at once.
        self._greeting: asyncio.Task[None] | None = None
        #: The status, after the delay; ``_showing`` once the delay is over (no longer cancellable).
        self._posting: asyncio.Task[None] | None = None
        self._showing = False
        #: The newest status asked for before it showed.
        self._wanted = ""
        #: Slack shows the thread as a processing agent session (with its own Stop button).
        self._in_session = False

    @property
    def shows_drafts(self) -> bool:
        """True when answers stream in (``slack.streaming``)."""
        return self._outbox.answer_stream() is not None

    async def draft(self, text: str) -> None:
        """Show the answer so far (buffered: see :mod:`adapters.slack.stream`)."""
        if (stream := self._outbox.answer_stream()) is not None:
            await stream.write(text)

    async def drop_draft(self) -> None:
        """Delete the draft: the model went on to run code."""
        if (stream := self._outbox.answer_stream()) is not None:
            await stream.drop()

    async def start(self, status: str) -> None:
        """Name an assistant thread at once and, if the turn is still running ``show_after_s``
        later, post :eyes:, the status message with its Stop button, the agent session and the
        assistant status line; none of it holds up the turn."""
        self._wanted = status
        self._showing = self._show_after <= 0  # shown at once: finish() waits for it
        if self._assistant is not None and self._assistant.title:
            self._greeting = asyncio.create_task(self._name())
        self._posting = asyncio.create_task(self._post())

    async def _name(self) -> None:
        if self._assistant is not None and self._assistant.title:
            await call(
                "assistant.threads.setTitle",
                self._client.assistant_threads_setTitle(
                    channel_id=self._outbox.channel,
                    thread_ts=self._outbox.thread_ts,
                    title=plain(self._assistant.title),
                ),
            )

    async def _post(self) -> None:
        if self._show_after > 0:
            await asyncio.sleep(self._show_after)  # finish() cancels it here for a quick turn
        self._showing = True
        await self._outbox.received()
        status = self._wanted
        if (sessions := self._outbox.sessions) is not None:
            self._in_session = await sessions.working(
                self._outbox.channel, self._outbox.thread_ts, self._outbox.question
            )
        if self._assistant is not None:
            await self._set_status(status, LOADING_MESSAGES)
        self._ts = await self._outbox.say(mrkdwn(status), blocks=status_blocks(status, self._outbox.key))
        self._shown, self._last = status, time.monotonic()
        if self._wanted != status:  # asked for while it posted
            await self._show(self._wanted)

    async def _set_status(self, status: str, loading: list[str] | None = None) -> bool:
        """Set Slack's status line; False (and the status message is edited from then on) when
        Slack refuses: a reply in a direct message's thread of an app without the AI-app surface."""
        result = await call(
            "assistant.threads.setStatus",
            self._client.assistant_threads_setStatus(
                channel_id=self._outbox.channel,
                thread_ts=self._outbox.thread_ts,
                status=plain(status),
                loading_messages=loading,
            ),
        )
        if isinstance(result, Failure):
            self._assistant = None
            return False
        return True

    async def _posted(self) -> None:
        """Wait for the status message (posted in the background by :meth:`start`)."""
        if self._posting is not None:
            await asyncio.shield(self._posting)

    async def update(self, status: str) -> None:
        """Show ``status``: now if the last edit is a second old, else once the second is up
        (before the status shows, it is what will show)."""
        self._wanted = status
        if not self._showing or (self._posting is not None and not self._posting.done()):
            return  # _post shows the newest wanted status once it has posted
        await self._show(status)

    async def _show(self, status: str) -> None:
        if self._ts is None:
            return
        self._pending = status
        wait = self._last + self._interval - time.monotonic()
        if self._flusher is not None and not self._flusher.done():
            return  # the scheduled edit will show the newest status
        if wait <= 0:
            await self._flush()
        else:
            self._flusher = asyncio.create_task(self._flush_later(wait))

    async def cell(self, cell: CellProgress) -> None:
        """Show the running cell: where the answer streams natively, as the step's task card in
        the answer's message (the status keeps the step's headline); else its step, time and
        latest lines in the status message (one line of them on an assistant thread's status
        line); throttled like any status."""
        stream = self._outbox.answer_stream()
        if stream is not None and await stream.task(cell, plan=self._outbox.question):
            if cell.state == "running":
                await self.update(cell.headline())
            return
        if cell.for_status:
            await self.update(cell.headline() if self._assistant is not None else cell.markdown())

    async def finish(self, ok: bool) -> None:
        """Delete the status message (and a draft no answer finished: the turn failed) and
        mark the user's message as done or failed; a status not shown yet never shows."""
        if self._posting is not None and not self._showing:
            self._posting.cancel()
            self._posting = None
        await self._posted()
        if self._greeting is not None:
            await asyncio.shield(self._greeting)
        await self._outbox.abandon_draft()
        if self._flusher is not None:
            self._flusher.cancel()
            self._flusher = None
        if self._ts is not None:
            result = await call("chat.delete", self._client.chat_delete(channel=self._outbox.channel, ts=self._ts))
            if isinstance(result, Failure):  # leave a finished status rather than a live Stop button
                await call(
                    "chat.update",
                    self._client.chat_update(
                        channel=self._outbox.channel,
                        ts=self._ts,
                        text=mrkdwn("Done." if ok else "Failed.").text,
                        blocks=[],
                    ),
                )
            self._ts = None
        if self._assistant is not None and self._showing:
            await self._set_status("")  # the status line goes (Slack also clears it on our reply)
        if self._in_session and self._outbox.sessions is not None:
            self._in_session = False
            await self._outbox.sessions.done(self._outbox.channel, self._outbox.thread_ts)
        await self._outbox.finished(ok)

    async def _flush_later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        await self._flush()

    async def _flush(self) -> None:
        status, self._pending = self._pending, None
        if status is None or status == self._shown or self._ts is None:
            return
        self._shown, self._last = status, time.monotonic()
        if self._assistant is not None:
            await self._set_status(status)
            return
        await call(
            "chat.update",
            self._client.chat_update(
                channel=self._outbox.channel,
                ts=self._ts,
                text=mrkdwn(status).text,
                blocks=status_blocks(status, self._outbox.key),
            ),
        )


def status_blocks(status: str, key: ThreadKey) -> list[dict[str, Any]]:
    """A status section (``status`` is Markdown) plus a Stop button whose value is the thread key."""
    return [
        section(cut(mrkdwn(":hourglass_flowing_sand: " + status), SECTION_LIMIT)),
        {
            "type": "actions",
            "elements": [
                {
                    "type": "button",
                    "text": {"type": "plain_text", "text": "Stop"},
                    "style": "danger",
                    "action_id": STOP_ACTION_ID,
                    "value": str(key),
                }
            ],
        },
    ]


def _table_blocks(piece: TablePiece) -> list[dict[str, Any]]:
    """A table's block and, when it is cut, the line saying so."""
    return [piece.native.block, *([section(mrkdwn(piece.note))] if piece.note else [])]


def feedback_blocks(key: ThreadKey, turn_id: str) -> list[dict[str, Any]]:
    """👍/👎 under an answer: Slack's feedback buttons, whose values name the thread and the turn."""
    value = f"{key}|{turn_id}"
    return [
        {
            "type": "context_actions",
            "elements": [
                {
                    "type": "feedback_buttons",
                    "action_id": FEEDBACK_ACTION_ID,
                    "positive_button": {
                        "text": {"type": "plain_text", "text": "Good answer"},
                        "accessibility_label": "Mark this answer as good",
                        "value": f"good|{value}",
                    },
                    "negative_button": {
                        "text": {"type": "plain_text", "text": "Bad answer"},
                        "accessibility_label": "Mark this answer as bad",
                        "value": f"bad|{value}",
                    },
                }
            ],
        }
    ]


def parse_feedback(value: str) -> tuple[bool, ThreadKey, str] | None:
    """(good, thread, turn id) from a feedback button's value; None for a value we never made."""
    verdict, _, rest = value.partition("|")
    key_text, _, turn_id = rest.rpartition("|")
    if verdict not in ("good", "bad") or not turn_id:
        return None
    try:
        key = ThreadKey.parse(key_text)
    except ValueError:
        return None
    return verdict == "good", key, turn_id


def stopping_text(payload: Mapping[str, Any]) -> Mrkdwn:
    """The status text shown once Stop was clicked (by whom)."""
    user = str((payload.get("user") or {}).get("id") or "")
    try:
        return mrkdwn(":octagonal_sign: Stopping (requested by ", Mention("user", user), ")…")
    except ValueError:  # no user, or not a Slack id
        return mrkdwn(":octagonal_sign: Stopping…")
