"""Markdown (as models write it) → Slack mrkdwn, and mrkdwn → message-sized chunks.

Pure functions, no I/O. Code blocks and inline code keep their content (only Slack's three
control characters are escaped there); prose gets bold, italics, strike-through, links,
headings, bullets and tables translated. Since ``<``, ``>`` and ``&`` are escaped everywhere,
no mention (``<!channel>``, ``<@U…>``, ``<#C…>``, ``<!subteam^…>``) can come from the text;
links follow :mod:`adapters.links` (http, https and mailto only, never disguised), and
an ``@`` starting a word is kept from notifying. Slack shows a fence's language tag as text, so it is
dropped; a Markdown table becomes an aligned code block (:mod:`adapters.tables`), the only way
Slack keeps its columns aligned.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from adapters.links import allowed_target, disguised
from adapters.slack.links import quiet_mentions
from adapters.tables import render_table
from adapters.textsplit import split_markdown
from bot.events import Table
from bot.markdown import Code
from bot.tables import blocks

#: Slack rejects or truncates longer messages in practice (KERNELS.md: "~4k").
MESSAGE_LIMIT = 3_800

INLINE_CODE = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"!?\[((?:[^\[\]\n]|\[[^\[\]\n]*\])+)\]\((\S+?)(?:\s+\"[^\"]*\")?\)")
_AUTOLINK = re.compile(r"&lt;(https?://[^\s&|]+)&gt;")
_BOLD = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1")
_ITALIC_STAR = re.compile(r"(?<![\w*])\*(?=\S)([^*\n]+?)(?<=\S)\*(?![\w*])")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.+?)\s*#*\s*$")
_BULLET = re.compile(r"^(\s*)[-*+]\s+(?=\S)")
_HRULE = re.compile(r"^ {0,3}([-*_])(\s*\1){2,}\s*$")
_PLACEHOLDER_RE = re.compile("\x00(\\d+)\x00")


class SetAside:
    """Spans of one line set aside (code, finished links) while the rest is rewritten, then
    put back untouched: no later rewrite can reach into them. A span may hold placeholders of
    spans set aside before it (a link whose label is code); :meth:`restore` puts those back too.
    Lines must hold no NUL of their own (:func:`no_nul`)."""

    def __init__(self) -> None:
        self._kept: list[str] = []

    def keep(self, text: str) -> str:
        """A placeholder standing for ``text``."""
        self._kept.append(text)
        return f"\x00{len(self._kept) - 1}\x00"

    def restore(self, line: str) -> str:
        """``line`` with every placeholder replaced by what it stands for, placeholders inside
        a kept span included (a span only holds those of spans kept before it)."""
        return _PLACEHOLDER_RE.sub(lambda m: self.restore(self._kept[int(m.group(1))]), line)


def no_nul(line: str) -> str:
    """``line`` without NUL characters, which would read as :class:`SetAside` placeholders."""
    return line.replace("\x00", "")


def shown_label(label: str) -> str:
    """A link label as a reader sees it: code shown without its backticks."""
    return label.replace("`", "")


def to_mrkdwn(markdown: str) -> str:
    """Convert Markdown to Slack mrkdwn."""
    out: list[str] = []
    for block in blocks(markdown.replace("\r\n", "\n")):
        if isinstance(block, Code):
            out.append(_code_block(block.body))
        elif isinstance(block, Table):
            out.append(_code_block(render_table(block)))
        else:
            out.extend(_line(line) for line in block.lines)
    return "\n".join(out).strip("\n")


def to_chunks(markdown: str, limit: int = MESSAGE_LIMIT, *, last: int | None = None) -> list[str]:
    """Convert Markdown to mrkdwn and split it into messages Slack accepts (the last one of at
    most ``last`` characters when given)."""
    return split_markdown(to_mrkdwn(markdown), limit, last=last)


def escape(text: str) -> str:
    """Escape Slack's control characters (``&``, ``<``, ``>``)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _code_block(body: Sequence[str]) -> str:
    return "```\n" + escape("\n".join(body)) + "\n```"


def _line(line: str) -> str:
    quote = ""
    stripped = line.lstrip()
    if stripped.startswith(">"):  # a block quote: Slack uses the same marker
        quote, line = "> ", stripped[1:].lstrip()
    if _HRULE.match(line):
        return quote + "―" * 10
    aside = SetAside()
    line = INLINE_CODE.sub(lambda m: aside.keep("`" + escape(m.group(2).strip()) + "`"), no_nul(line))
    line = escape(line)
    line = _LINK.sub(lambda m: aside.keep(_link(m.group(1), m.group(2), aside)), line)
    line = _AUTOLINK.sub(lambda m: aside.keep(f"<{m.group(1)}>"), line)
    heading = _HEADING.match(line)
    if heading:
        line = "*" + _BOLD.sub(r"\2", heading.group(1)) + "*"
    else:
        line = _BULLET.sub(lambda m: m.group(1) + "• ", line)
        # Italics first, so the single stars that bold turns into are left alone.
        line = _ITALIC_STAR.sub(r"_\1_", line)
        line = _BOLD.sub(r"*\2*", line)
        line = _STRIKE.sub(r"~\1~", line)
    return quote + aside.restore(quiet_mentions(line))


def _link(label: str, target: str, aside: SetAside) -> str:
    """A Markdown link (label and target already escaped, code in them set aside in ``aside``)
    as mrkdwn: a link only to http(s) or mailto, showing its real target when the label, as a
    reader sees it (code shown, backticks gone), reads as another address."""
    target = aside.restore(target)
    raw = _unescape(target)
    shown = aside.restore(quiet_mentions(label))  # code in the label keeps its text
    if not allowed_target(raw):
        return shown
    target = target.replace("|", "%7C")
    if disguised(_unescape(shown_label(aside.restore(label))), raw):
        return f"<{target}>"
    return f"<{target}|{shown}>"


def _unescape(text: str) -> str:
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
