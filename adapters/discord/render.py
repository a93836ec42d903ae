"""The Discord outbound renderer: what a masked link in text the bot posts becomes, and an
answer's tables (pure, no I/O).

Discord renders ``[label](url)`` in a bot's messages as ``label`` opening ``url``. Following
:mod:`adapters.links`, a masked link stays only when its target is http(s) or mailto and its
label does not read as another address. A disguised one becomes its label followed by the bare
target in ``<>`` (shown as written, no embed); one to any other target becomes its label as
text. Code is left untouched as Discord's client reads it, which is not CommonMark's: a block
runs from a ```` ``` ```` to the next one anywhere (``~~~`` opens none, a block never closed is
none), so a line CommonMark would keep inside a block may be prose to Discord
(:func:`_outside_code`). An answer (:func:`answer`) also has its tables made aligned code blocks, in the same
reading. Mentions are kept from notifying by ``allowed_mentions=none`` on the client
(:mod:`adapters.discord.adapter`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from adapters.links import allowed_target, disguised
from adapters.tables import aligned
from bot.events import Table
from bot.tables import blocks

#: An inline code span (left as it is) or a masked link, whichever starts first.
_CODE_OR_LINK = re.compile(
    r"(?P<code>(?P<ticks>`+).+?(?P=ticks))"
    r"|(?P<bang>!?)\[(?P<label>(?:[^\[\]\n]|\[[^\[\]\n]*\])+)\]"
    r"\(\s*(?P<target><[^>\n]*>|\S+?)(?:\s+\"[^\"\n]*\")?\s*\)"
)


def text(markdown: str) -> str:
    """``markdown`` with every masked link outside code made honest (see the module)."""
    return _outside_code(markdown, _honest)


def answer(markdown: str) -> str:
    """An answer as Discord is sent it: its tables as aligned code blocks (Discord draws no
    Markdown table; :mod:`adapters.tables`) and its masked links made honest, in one reading."""
    out: list[str] = []
    for block in blocks(markdown):
        out += aligned(block) if isinstance(block, Table) else block.lines
    return text("\n".join(out))


#: Where Discord's client sees code blocks: from a fence to the next one, wherever they stand.
_DISCORD_FENCE = re.compile(r"```")


def _outside_code(markdown: str, rewrite: Callable[[str], str]) -> str:
    """``markdown`` with ``rewrite`` applied line by line to what Discord does not draw as a
    code block (:data:`_DISCORD_FENCE` pairs; an opening fence never closed opens none)."""
    fences = [m.start() for m in _DISCORD_FENCE.finditer(markdown)]
    out: list[str] = []
    at = 0
    for opening, closing in zip(fences[::2], fences[1::2]):
        out.append("\n".join(rewrite(line) for line in markdown[at:opening].split("\n")))
        out.append(markdown[opening : closing + 3])
        at = closing + 3
    out.append("\n".join(rewrite(line) for line in markdown[at:].split("\n")))
    return "".join(out)


def _honest(line: str) -> str:
    return _CODE_OR_LINK.sub(_span, line)


def _span(match: re.Match[str]) -> str:
    if match.group("code") is not None:
        return match.group(0)
    label, target = match.group("label"), match.group("target").strip("<>").strip()
    if not allowed_target(target):
        return label
    if disguised(label, target):
        return f"{label} <{target}>"
    return match.group(0)
