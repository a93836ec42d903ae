"""👍/👎 under an answer: persistent buttons whose custom id names the question they rate.

The custom id is ``threadbook:feedback:good:<turn id>`` (or ``bad``); the thread comes from the
channel the message is in. The buttons are discord.py dynamic items, registered with the client
at start-up, so a click on an answer posted before a restart still arrives.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import discord

TEMPLATE = re.compile(r"threadbook:feedback:(?P<vote>good|bad):(?P<turn>[0-9A-Za-z_.-]{1,64})")
THANKS = "Thanks for the feedback"

#: Handles a click: the interaction, the rated question's id, and whether it was 👍.
OnFeedback = Callable[[discord.Interaction, str, bool], Awaitable[None]]
Button = discord.ui.Button[discord.ui.View]


def custom_id(turn_id: str, good: bool) -> str:
    """The custom id of the 👍 (``good``) or 👎 button for the answer to ``turn_id``."""
    return f"threadbook:feedback:{'good' if good else 'bad'}:{turn_id}"


class FeedbackItem(discord.ui.DynamicItem[Button], template=TEMPLATE):
    """One of the two buttons; :func:`feedback_item` binds a subclass to a click handler."""

    on_feedback: OnFeedback | None = None

    def __init__(self, turn_id: str, good: bool) -> None:
        super().__init__(
            discord.ui.Button(
                emoji="👍" if good else "👎", style=discord.ButtonStyle.secondary, custom_id=custom_id(turn_id, good)
            )
        )
        self.turn_id = turn_id
        self.good = good

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction[Any], item: discord.ui.Item[Any], match: re.Match[str], /
    ) -> FeedbackItem:
        """The button a click arrived for (discord.py calls this)."""
        return cls(match["turn"], match["vote"] == "good")

    async def callback(self, interaction: discord.Interaction[Any]) -> None:
        """Hand the click to the adapter's handler."""
        if self.on_feedback is not None:
            await self.on_feedback(interaction, self.turn_id, self.good)


def feedback_item(on_feedback: OnFeedback) -> type[FeedbackItem]:
    """A :class:`FeedbackItem` class whose clicks go to ``on_feedback`` (one per client)."""
    return type("BoundFeedbackItem", (FeedbackItem,), {"on_feedback": staticmethod(on_feedback)}, template=TEMPLATE)


def feedback_view(item: type[FeedbackItem], turn_id: str) -> discord.ui.View:
    """👍 and 👎 for the answer to ``turn_id``."""
    view = discord.ui.View(timeout=None)
    view.add_item(item(turn_id, True))
    view.add_item(item(turn_id, False))
    return view
