"""Answer in one Discord thread: split text, attachments, a live status with a Stop button, reactions,
👍/👎 under an answer.

The Stop button's custom id is the same on every status message (:data:`STOP_ID`): the message's
own view handles it while its turn runs in this process, and the persistent view the adapter
registers at start-up (:class:`StopView` without a message) handles it after a restart, taking the
thread from the channel the message is in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import aiohttp
import discord

from adapters.discord import render
from adapters.discord.layout import LayoutSupport
from adapters.discord.replies import MESSAGE_LIMIT, message_extras, send_reply, send_text
from bot.events import CellProgress, Reply, ThreadKey

log = logging.getLogger(__name__)

__all__ = ["MESSAGE_LIMIT", "STOP_ID", "Conversation", "DiscordOutbox", "DiscordProgress", "StopView"]

STOP_ID = "threadbook:stop"
TYPING_EVERY_S = 8.0  # Discord shows "typing…" for about 10 s per trigger
WORKING, DONE, FAILED, STOPPED = "👀", "✅", "❌", "⏹️"


class StopTurn(Protocol):
    """Interrupts the running turn of a thread for a person whom access admits there; True
    if one was running and was stopped (:meth:`bot.dispatcher.Dispatcher.stop`)."""

    def __call__(self, key: ThreadKey, *, user_id: str) -> Awaitable[bool]: ...


#: The 👍/👎 buttons for the answer to the question with this id.
FeedbackButtons = Callable[[str], discord.ui.View]


@dataclass(frozen=True, slots=True)
class Conversation:
    """Where one message's answers go: the session's channel, the question, the bot, the key."""

    channel: discord.abc.Messageable
    source: discord.PartialMessage  # the question (a Message); a stand-in in DiscordAdapter.outbox_for
    me: discord.abc.Snowflake
    key: ThreadKey
    stop_turn: StopTurn


class StopView(discord.ui.View):
    """The Stop button under the status message (persistent: no timeout, a fixed custom id)."""

    def __init__(self, on_stop: Callable[[discord.Interaction], Awaitable[None]], *, custom_id: str = STOP_ID) -> None:
        super().__init__(timeout=None)
        self._on_stop = on_stop
        button: discord.ui.Button[StopView] = discord.ui.Button(
            label="Stop", style=discord.ButtonStyle.danger, emoji=STOPPED, custom_id=custom_id
        )
        button.callback = self._pressed  # type: ignore[method-assign]
        self.add_item(button)

    async def _pressed(self, interaction: discord.Interaction) -> None:
        await self._on_stop(interaction)


class DiscordProgress:
    """👀 on the question, "typing…", and one status message edited in place (throttled)."""

    def __init__(self, conversation: Conversation, *, interval_s: float) -> None:
        self._to = conversation
        self._interval_s = interval_s
        self._message: discord.Message | None = None
        self._view: StopView | None = None
        self._typing: asyncio.Task[None] | None = None
        self._pending: asyncio.Task[None] | None = None
        self._latest = ""
        self._last_edit = 0.0
        self._stopped = False

    async def start(self, status: str) -> None:
        """React 👀, start typing, post the status with its Stop button."""
        await _quietly(self._to.source.add_reaction(WORKING), "add 👀")
        self._typing = asyncio.create_task(self._keep_typing())
        self._view = StopView(self._on_stop)
        self._latest = status
        try:
            self._message = await self._to.channel.send(f"⏳ {render.text(status)}", view=self._view)
        except discord.HTTPException as exc:
            log.warning("could not post the status message in %s: %s", self._to.key, exc)
        self._last_edit = time.monotonic()

    async def update(self, status: str) -> None:
        """Show ``status``; at most one edit per interval, the latest status wins."""
        self._latest = status
        if self._stopped or (self._pending is not None and not self._pending.done()):
            return
        delay = max(0.0, self._last_edit + self._interval_s - time.monotonic())
        self._pending = asyncio.create_task(self._edit_after(delay))

    async def cell(self, cell: CellProgress) -> None:
        """Show the running cell (its step, time and latest lines): an edit like any status."""
        if cell.for_status:
            await self.update(cell.markdown())

    async def finish(self, ok: bool) -> None:
        """Stop typing, close the status (button removed) and swap 👀 for ✅, ❌ or ⏹️."""
        for task in (self._typing, self._pending):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._view is not None:
            self._view.stop()
        outcome = STOPPED if self._stopped else DONE if ok else FAILED
        text = {STOPPED: "Stopped.", DONE: "Done.", FAILED: "Failed."}[outcome]
        if self._message is not None:
            await _quietly(self._message.edit(content=f"{outcome} {text}", view=None), "close the status")
        await _quietly(self._to.source.remove_reaction(WORKING, self._to.me), "remove 👀")
        await _quietly(self._to.source.add_reaction(outcome), f"add {outcome}")

    shows_drafts = False

    async def draft(self, text: str) -> None:
        """Discord gets the answer once it is whole (an edited message per second would cost
        more than it shows)."""

    async def drop_draft(self) -> None:
        """Nothing was shown."""

    async def _on_stop(self, interaction: discord.Interaction) -> None:
        await _quietly(interaction.response.defer(), "acknowledge Stop")
        if self._stopped:
            return
        self._stopped = await self._to.stop_turn(self._to.key, user_id=str(interaction.user.id))
        log.info("Stop pressed by %s in %s (turn running: %s)", interaction.user.id, self._to.key, self._stopped)
        if self._stopped and self._message is not None:
            if self._pending is not None:
                self._pending.cancel()
            await _quietly(self._message.edit(content=f"{STOPPED} Stopping…", view=None), "show Stopping")

    async def _edit_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        if self._message is None or self._stopped:
            return
        self._last_edit = time.monotonic()
        await _quietly(self._message.edit(content=f"⏳ {render.text(self._latest)}"), "edit the status")

    async def _keep_typing(self) -> None:
        while True:
            await _quietly(self._to.channel.typing(), "trigger typing")
            await asyncio.sleep(TYPING_EVERY_S)


class DiscordOutbox:
    """Where the core's answers to one Discord message go: the session's thread (or DM)."""

    def __init__(
        self,
        conversation: Conversation,
        *,
        upload_limit: int,
        status_interval_s: float = 1.5,
        turn_id: str | None = None,
        feedback: FeedbackButtons | None = None,
        layout: LayoutSupport | None = None,
    ) -> None:
        """``turn_id``: the question's id, which 👍/👎 clicks refer to; ``feedback`` makes those
        buttons (either None: no buttons); ``layout``: whether components v2 may lay answers out
        (the adapter's, shared by its outboxes; None: never)."""
        self._to = conversation
        self._upload_limit = upload_limit
        self._status_interval_s = status_interval_s
        self._turn_id = turn_id
        self._feedback = feedback
        self._layout = layout

    async def notify(self, text: str) -> None:
        """Post a short notice into the thread."""
        await send_text(self._send, text)

    async def post(self, reply: Reply) -> None:
        """Post the reply: text in 2,000-character chunks, the last one carrying the images and
        files (further ones follow in upload-sized batches) and, under an answer, 👍/👎."""
        view = None
        if reply.rateable and self._turn_id is not None and self._feedback is not None:
            view = self._feedback(self._turn_id)
        await send_reply(
            self._send, reply, upload_limit=self._upload_limit, view=view, where=self._to.key, layout=self._layout
        )

    def progress(self) -> DiscordProgress:
        """A progress handle for this turn."""
        return DiscordProgress(self._to, interval_s=self._status_interval_s)

    async def _send(
        self, text: str | None, files: list[discord.File], view: discord.ui.View | discord.ui.LayoutView | None
    ) -> None:
        await self._to.channel.send(text, **message_extras(files, view))


async def _quietly(action: Awaitable[object], what: str) -> None:
    """Run a cosmetic REST call; a failure (no permission, rate limit) is logged, never raised."""
    try:
        await action
    except discord.HTTPException as exc:
        log.warning("could not %s: %s %s", what, exc.status, exc.text)
    except (aiohttp.ClientError, OSError) as exc:  # discord.py re-raises these once its own retries give up
        log.warning("could not %s: %r", what, exc)
