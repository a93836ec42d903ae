"""Answer a slash command: the core's replies become the interaction's followup messages.

The adapter defers the interaction at once (Discord shows "Threadbook is thinking…"); the first
followup takes that message's place, the rest follow it. :attr:`InteractionReplies.answered`
tells the adapter whether anything was said, so an interaction is never left unanswered.
"""

from __future__ import annotations

import logging
from typing import Any

import discord

from adapters.discord.layout import LayoutSupport
from adapters.discord.replies import message_extras, send_reply, send_text
from bot.events import CellProgress, Reply

log = logging.getLogger(__name__)


class QuietProgress:
    """No live status for a command: its answer comes quickly, as a followup."""

    shows_drafts = False

    async def start(self, status: str) -> None:
        """Nothing to show."""

    async def update(self, status: str) -> None:
        """Nothing to show."""

    async def cell(self, cell: CellProgress) -> None:
        """Nothing to show."""

    async def finish(self, ok: bool) -> None:
        """Nothing to close."""

    async def draft(self, text: str) -> None:
        """Drafts are not shown."""

    async def drop_draft(self) -> None:
        """Nothing was shown."""


class InteractionReplies:
    """An :class:`~bot.events.Outbox` whose posts are followups of one (deferred) interaction."""

    def __init__(
        self, interaction: discord.Interaction[Any], *, upload_limit: int, layout: LayoutSupport | None = None
    ) -> None:
        """``layout``: whether components v2 may lay answers out (None: never)."""
        self._interaction = interaction
        self._upload_limit = upload_limit
        self._layout = layout
        self.answered = False

    async def notify(self, text: str) -> None:
        """Say ``text`` (a notice) as a followup."""
        await send_text(self._send, text)

    async def post(self, reply: Reply) -> None:
        """Post the reply as followups: text, the last chunk carrying its files."""
        await send_reply(
            self._send,
            reply,
            upload_limit=self._upload_limit,
            where=f"interaction {self._interaction.id}",
            layout=self._layout,
        )

    def progress(self) -> QuietProgress:
        """A progress handle that shows nothing."""
        return QuietProgress()

    async def say(self, text: str) -> None:
        """One sentence as the answer; a failure is logged (the interaction may have expired)."""
        try:
            await self.notify(text)
        except discord.HTTPException as exc:
            log.warning("could not answer interaction %s: %s", self._interaction.id, exc)

    async def _send(
        self, text: str | None, files: list[discord.File], view: discord.ui.View | discord.ui.LayoutView | None
    ) -> None:
        extras = message_extras(files, view)
        if text is not None:
            extras["content"] = text
        await self._interaction.followup.send(wait=True, **extras)
        self.answered = True
