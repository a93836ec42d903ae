"""An answer with charts or files as one components-v2 message, and tables the code showed as text.

Discord's components v2 (message flag ``IS_COMPONENTS_V2``, ``1 << 15``) lay a message out as
components: here one container holding a text display (the answer's last part), a media gallery
of the charts and a file component per other file, with the 👍/👎 in an action row below it.
Discord's limits for such a message: at most :data:`MAX_COMPONENTS` components (every nested one
counts), :data:`MAX_TEXT` characters of text in all, no ``content``, and attachments are shown
only where a component names them (``attachment://<name>``). :func:`answer_view` builds it, or
says it cannot (too many components, a name a URL cannot carry); the caller then posts the
answer as before (:mod:`adapters.discord.replies`). Where Discord refuses the flag, the
adapter's :class:`LayoutSupport` remembers it and answers go out as before from then on.

:func:`shown_table` lays out a table the code showed (``display_dataframe_to_user``) for a
2,000-character message: its caption, as many rows as fit as an aligned code block, and how
much is not shown (the whole table is one of the answer's files).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

import discord

from adapters.tables import aligned
from bot.events import Table
from bot.safetext import inline_code
from bot.tables import hidden_note

log = logging.getLogger(__name__)

MAX_COMPONENTS = 40
MAX_TEXT = 4000
MAX_GALLERY_ITEMS = 10
#: Names ``attachment://`` can carry as they are.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


@dataclass(slots=True)
class LayoutSupport:
    """Whether Discord takes components-v2 messages here (one per adapter): False once refused."""

    enabled: bool = True

    def refuse(self, error: str) -> None:
        """Remember that Discord refused a components-v2 message (``error``: what it said)."""
        if self.enabled:
            log.warning("Discord refused a components v2 message (%s): answers are laid out as before", error)
            self.enabled = False


def answer_view(
    text: str, images: Sequence[str], files: Sequence[str], buttons: discord.ui.View | None
) -> discord.ui.LayoutView | None:
    """The answer's last part, its charts (``images``: attachment names) and other ``files`` in one
    container, and ``buttons`` (their items move into an action row) under it; None when that
    is past Discord's limits or a name cannot be an ``attachment://`` URL."""
    if not text.strip() or len(text) > MAX_TEXT or len(images) > MAX_GALLERY_ITEMS:
        return None
    if not all(_SAFE_NAME.match(name) for name in [*images, *files]):
        return None
    children: list[discord.ui.Item[discord.ui.LayoutView]] = [discord.ui.TextDisplay(text)]
    if images:
        gallery = [discord.MediaGalleryItem(f"attachment://{name}", description=name) for name in images]
        children.append(discord.ui.MediaGallery(*gallery))
    children += [discord.ui.File(f"attachment://{name}") for name in files]
    items = list(buttons.children) if buttons is not None else []
    count = 1 + len(children) + (1 + len(items) if items else 0)
    if count > MAX_COMPONENTS:
        return None
    view = discord.ui.LayoutView(timeout=None)
    view.add_item(discord.ui.Container(*children))
    if items and buttons is not None:
        buttons.clear_items()  # an item belongs to one view: it moves into the action row
        view.add_item(discord.ui.ActionRow(*items))
    return view


def shown_table(table: Table, limit: int) -> str:
    """A table the code showed as Markdown within ``limit`` characters: its caption, the rows
    that fit as an aligned code block, and a line saying how much is not shown."""
    head = f"📋 {inline_code(table.caption)}"
    lines = aligned(table)[1:-1]
    rows = len(lines) - 2
    while True:
        note = hidden_note(table, rows=rows).replace("`", "ˋ")
        tail = [f"_{note}_"] if note else []
        text = "\n".join([head, "```", *lines[: rows + 2], "```", *tail])
        if len(text) <= limit:
            return text
        if rows <= 0:
            # Not even the header fits: its lines are cut, never the closing fence (a block
            # left open is prose to Discord, and the cells' links would be live).
            room = max(2, (limit - len("\n".join([head, "```", "```", *tail])) - 2) // 2)
            shown = [line if len(line) <= room else line[: room - 1] + "…" for line in lines[:2]]
            return "\n".join([head, "```", *shown, "```", *tail])
        rows -= max(1, rows // 4) if len(text) > 2 * limit else 1
