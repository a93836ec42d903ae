"""The Discord outbound renderer's link step: what a masked link in text the bot posts becomes
(pure, no I/O).

Discord renders ``[label](url)`` in a bot's messages as ``label`` opening ``url``. Following
:mod:`adapters.links`, a masked link stays only when its target is http(s) or mailto and its
label does not read as another address. A disguised one becomes its label followed by the bare
target in ``<>`` (shown as written, no embed); one to any other target becomes its label as
text. Code blocks and inline code are left untouched. Mentions are kept from notifying by
``allowed_mentions=none`` on the client (:mod:`adapters.discord.adapter`).
"""

from __future__ import annotations

import re

from adapters.links import allowed_target, disguised

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
#: An inline code span (left as it is) or a masked link, whichever starts first.
_CODE_OR_LINK = re.compile(
    r"(?P<code>(?P<ticks>`+).+?(?P=ticks))"
    r"|(?P<bang>!?)\[(?P<label>(?:[^\[\]\n]|\[[^\[\]\n]*\])+)\]"
    r"\(\s*(?P<target><[^>\n]*>|\S+?)(?:\s+\"[^\"\n]*\")?\s*\)"
)


def text(markdown: str) -> str:
    """``markdown`` with every masked link outside code made honest (see the module)."""
    out: list[str] = []
    fence: str | None = None
    for line in markdown.split("\n"):
        opened = _FENCE.match(line)
        if fence is not None:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = None
            out.append(line)
            continue
        if opened:
            fence = opened.group(1)
            out.append(line)
            continue
        out.append(_CODE_OR_LINK.sub(_span, line))
    return "\n".join(out)


def _span(match: re.Match[str]) -> str:
    if match.group("code") is not None:
        return match.group(0)
    label, target = match.group("label"), match.group("target").strip("<>").strip()
    if not allowed_target(target):
        return label
    if disguised(label, target):
        return f"{label} <{target}>"
    return match.group(0)
