"""The Slack outbound renderer: every text the bot posts to Slack is made here.

The core hands the adapter Markdown (answers, notices, listings, echoes of what people wrote,
file names, display names, errors); what Slack may be sent is only what these functions return:

- :class:`Mrkdwn` (``text`` of ``chat.postMessage`` / ``chat.update``, section blocks, the
  comment of shared files), made by :func:`mrkdwn` / :func:`mrkdwn_chunks` from Markdown
  (:mod:`adapters.slack.format`);
- :class:`SlackMarkdown` (``markdown_text`` of ``chat.startStream`` / ``appendStream`` /
  ``stopStream``), made by :func:`markdown_text`;
- :func:`plain` for Slack's plain-text fields (status line, thread title, file titles).

Mentions never come from text: Slack's ``<!channel>``, ``<@U…>``, ``<#C…>`` and
``<!subteam^…>`` tokens are escaped, links open only http(s) and mailto targets and show their
real target when the label reads as another address (:mod:`adapters.links`), and an ``@``
that starts a word notifies no one. A mention the bot itself means is a :class:`Mention`
passed to :func:`mrkdwn` next to the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from adapters.links import allowed_target, disguised
from adapters.slack.format import INLINE_CODE, MESSAGE_LIMIT, SetAside, no_nul, shown_label, to_chunks, to_mrkdwn
from adapters.slack.links import WORD_JOINER, quiet_mentions
from bot.markdown import lines

_SLACK_ID = re.compile(r"^[A-Z][A-Z0-9_]{1,31}$")
_LINK = re.compile(r"(!?)\[((?:[^\[\]\n]|\[[^\[\]\n]*\])+)\]\(\s*(<[^>\n]*>|\S+?)(\s+\"[^\"\n]*\")?\s*\)")
#: A reference definition (``[x]: target``) would make ``[x]`` a link to any target.
_REFERENCE = re.compile(r"^( {0,3})\[([^\]\n]+)\]:")


@dataclass(frozen=True, slots=True)
class Mention:
    """A mention the bot composes itself: a person (``user``) or a channel (``channel``) by id."""

    kind: Literal["user", "channel"]
    id: str

    def token(self) -> str:
        """Slack's ``<@U…>`` / ``<#C…>``; ValueError for an id that is not a Slack id."""
        if not _SLACK_ID.match(self.id):
            raise ValueError(f"not a Slack id: {self.id!r}")
        return f"<@{self.id}>" if self.kind == "user" else f"<#{self.id}>"


@dataclass(frozen=True, slots=True)
class Mrkdwn:
    """Text in Slack's mrkdwn that is safe to post; made only by this module."""

    text: str


@dataclass(frozen=True, slots=True)
class SlackMarkdown:
    """Markdown safe to send as ``markdown_text``; made only by :func:`markdown_text`."""

    text: str


def mrkdwn(*parts: str | Mention) -> Mrkdwn:
    """Markdown parts (and the bot's own :class:`Mention` s) as one safe mrkdwn text."""
    return Mrkdwn("".join(part.token() if isinstance(part, Mention) else to_mrkdwn(part) for part in parts))


def mrkdwn_chunks(markdown: str, limit: int = MESSAGE_LIMIT, *, last: int | None = None) -> list[Mrkdwn]:
    """Markdown as safe mrkdwn, split into messages Slack accepts; the last one of at most
    ``last`` characters when given (a section block's text)."""
    return [Mrkdwn(chunk) for chunk in to_chunks(markdown, limit, last=last)]


def cut(text: Mrkdwn, limit: int) -> Mrkdwn:
    """``text`` cut to ``limit`` characters (``…`` marks the cut), never inside an escape or link."""
    if len(text.text) <= limit:
        return text
    head = text.text[: limit - 1]
    opened = max(head.rfind("<"), head.rfind("&"))
    if opened > max(head.rfind(">"), head.rfind(";")):
        head = head[:opened]
    return Mrkdwn(head + "…")


def plain(text: str) -> str:
    """Text for Slack's plain-text fields (status line, titles): one line, no markup, no mentions."""
    flat = " ".join(text.replace("`", "").split())
    return quiet_mentions(flat.replace("<", "‹").replace(">", "›"))


def markdown_text(markdown: str) -> SlackMarkdown:
    """Markdown as models write it, made safe for ``markdown_text`` (Slack renders it itself).

    Every ``<`` gets a word joiner after it and a ``|`` inside ``<…>`` is shown as ``∣`` (no
    ``<!channel>``, ``<@U…>`` or ``<url|label>`` token can form, even across the pieces of a
    stream); links are kept only to http(s) and mailto targets, shown as their target when
    disguised; reference definitions are shown as text; an ``@`` starting a word notifies no
    one. Code keeps its text (bar the joiners). The result for a text is a prefix of the
    result for that text continued, except where a link closes, so a stream can send the
    difference (:mod:`adapters.slack.stream` holds an unclosed link back).
    """
    out: list[str] = []
    for line in lines(markdown.replace("\r\n", "\n")):
        text = line.text.replace("<", "<" + WORD_JOINER)
        out.append(text if line.in_code else _markdown_line(_no_angle_links(text)))
    return SlackMarkdown("\n".join(out))


def _no_angle_links(line: str) -> str:
    """A ``|`` after an unclosed ``<`` becomes ``∣``: ``<url|label>`` cannot show one address and
    open another. Decided by what comes before only, so a stream's pieces agree."""
    out: list[str] = []
    opened = False
    for ch in line:
        if ch == "<":
            opened = True
        elif ch == ">":
            opened = False
        elif ch == "|" and opened:
            ch = "∣"
        out.append(ch)
    return "".join(out)


def _markdown_line(line: str) -> str:
    aside = SetAside()
    line = INLINE_CODE.sub(lambda m: aside.keep(m.group(0)), no_nul(line))
    line = _REFERENCE.sub(lambda m: f"{m.group(1)}\\[{m.group(2)}\\]:", line)
    line = _LINK.sub(lambda m: aside.keep(_markdown_link(m.group(1), m.group(2), m.group(3), aside)), line)
    return aside.restore(quiet_mentions(line))


def _markdown_link(bang: str, label: str, target: str, aside: SetAside) -> str:
    """A Markdown link (code in it set aside in ``aside``) kept only to http(s) or mailto, and
    shown as its bare target when the label, as a reader sees it, reads as another address."""
    raw = aside.restore(target).strip("<>").replace(WORD_JOINER, "")
    shown = aside.restore(quiet_mentions(label))  # code in the label keeps its text
    if not allowed_target(raw):
        return shown
    if disguised(shown_label(aside.restore(label)).replace(WORD_JOINER, ""), raw):
        return raw  # the bare address: Slack links it as written
    return f"{bang}[{shown}]({raw.replace(' ', '%20').replace(')', '%29')})"
