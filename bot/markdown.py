"""Markdown as models write it, read into code blocks and prose (pure, no I/O).

The one place that knows fenced code blocks: splitting (:mod:`adapters.textsplit`), tables
(:mod:`bot.tables`, :mod:`adapters.tables`), links and mentions (the Slack and Discord
renderers) and Slack's mrkdwn build on it, so they agree on what is code. The rules are
CommonMark's:

- a fence is a line of at least three backticks or tildes, indented by three spaces at most,
  its info string (the language tag) after it; a backtick fence's info string holds no
  backtick (```` ```x``` ```` on a line of its own is inline code, not a fence);
- the block ends at a line of the same character, at least as long, indented by three
  spaces at most, with nothing but spaces after it; a block never closed runs to the end.

Lines are split at ``\\n`` only: callers that take ``\\r\\n`` normalise it first.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, NamedTuple

__all__ = ["Code", "Fence", "Line", "Prose", "blocks", "fence", "lines"]

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")


@dataclass(frozen=True, slots=True)
class Fence:
    """The line that opens a code block: as written, its marker (```` ``` ````, ``~~~~``: the
    character and the length written) and its info string (stripped)."""

    line: str
    marker: str
    info: str

    def closes(self, line: str) -> bool:
        """Whether ``line`` ends the block this fence opened."""
        match = _FENCE.match(line)
        return bool(
            match
            and match.group(1)[0] == self.marker[0]
            and len(match.group(1)) >= len(self.marker)
            and not match.group(2).strip()
        )


def fence(line: str) -> Fence | None:
    """The fence ``line`` opens a code block with (read outside one), or None."""
    match = _FENCE.match(line)
    if match is None:
        return None
    marker, info = match.group(1), match.group(2)
    if marker[0] == "`" and "`" in info:
        return None
    return Fence(line, marker, info.strip())


class Line(NamedTuple):
    """One line and where it stands: ``prose``, or in a code block (``open``: its fence line,
    ``code``: its content, ``close``: its closing fence), with that block's :class:`Fence`.
    (A named tuple: one is made for every line read.)"""

    text: str
    kind: Literal["prose", "open", "code", "close"]
    fence: Fence | None = None

    @property
    def in_code(self) -> bool:
        """Part of a code block, its fence lines included."""
        return self.kind != "prose"


def lines(markdown: str) -> Iterator[Line]:
    """The lines of ``markdown``, each with its place (for who works line by line: a stream
    whose rendering only grows, a splitter)."""
    block: Fence | None = None
    for text in markdown.split("\n"):
        if block is None:
            head = text[:4]  # a fence's first backtick or tilde comes within it: most lines end here
            block = fence(text) if "`" in head or "~" in head else None
            yield Line(text, "prose") if block is None else Line(text, "open", block)
        elif block.closes(text):
            yield Line(text, "close", block)
            block = None
        else:
            yield Line(text, "code", block)


@dataclass(frozen=True, slots=True)
class Code:
    """A fenced code block: its fence, its content lines, its closing line as written (None:
    the text ended first)."""

    fence: Fence
    body: tuple[str, ...]
    closing: str | None

    @property
    def lines(self) -> list[str]:
        """The block's lines as written, fences included."""
        return [self.fence.line, *self.body, *([self.closing] if self.closing is not None else [])]


@dataclass(frozen=True, slots=True)
class Prose:
    """Consecutive lines outside code blocks (where tables, links and emphasis are)."""

    lines: tuple[str, ...]


def blocks(markdown: str) -> list[Code | Prose]:
    """``markdown`` as its code blocks and the prose between them, in order; the lines of the
    blocks joined with ``\\n`` give ``markdown`` back."""
    out: list[Code | Prose] = []
    prose: list[str] = []
    body: list[str] = []
    opened: Fence | None = None
    for line in lines(markdown):
        if line.kind == "prose":
            prose.append(line.text)
        elif line.kind == "open":
            if prose:
                out.append(Prose(tuple(prose)))
                prose = []
            opened, body = line.fence, []
        elif line.kind == "code":
            body.append(line.text)
        else:
            assert opened is not None
            out.append(Code(opened, tuple(body), line.text))
            opened = None
    if opened is not None:
        out.append(Code(opened, tuple(body), None))
    if prose:
        out.append(Prose(tuple(prose)))
    return out
