"""Split Markdown-like text into chunks a chat platform accepts, without breaking code fences.

Slack (~4,000 characters in practice) and Discord (2,000) both cap one message. A chunk ends
at a paragraph break where possible, else at a line break, else inside an over-long line. A
code block that must be cut is closed at the end of one chunk and reopened (same fence line,
so the language tag survives) at the start of the next, so every chunk renders on its own.
Which lines are code is read once, by :mod:`bot.markdown`. The last chunk may have a smaller
limit of its own (Slack's section block, under the buttons): the text is still split once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from bot.markdown import lines as markdown_lines

_CLOSE_RESERVE = 5  # "\n" + a closing fence of up to four characters


@dataclass(frozen=True, slots=True)
class _Piece:
    """A line of the text, or a part of an over-long one, and where it stands."""

    text: str
    #: In a code block, its fence lines included: a chunk cut here must close the block.
    code: bool = False
    #: The block's opening fence line (its first part).
    opens: bool = False
    #: The block's closing fence line (its last part).
    closes: bool = False
    #: The block's fence marker (```` ``` ````, ``~~~~``), which closes it; "" outside code.
    marker: str = ""


def split_markdown(text: str, limit: int, *, last: int | None = None) -> list[str]:
    """Split ``text`` into chunks of at most ``limit`` characters, the last one of at most
    ``last`` when given; empty text gives no chunks.

    Fenced code blocks (```` ``` ```` or ``~~~``) that straddle a cut are closed and reopened.
    """
    if limit < 40 or (last is not None and last < 40):
        raise ValueError("limit must be at least 40 characters")
    final = limit if last is None else min(limit, last)
    text = text.strip("\n")
    if not text.strip():
        return []
    if len(text) <= final:
        return [text]
    pieces = _pieces(text)
    chunks, tail = ([text], pieces) if len(text) <= limit else _cut(pieces, limit)
    if len(chunks[-1]) > final:
        # The last chunk, cut again for its own limit from where it starts (the lines as read).
        chunks[-1:], _ = _cut(tail, final)
    return chunks


def _pieces(text: str) -> list[_Piece]:
    """The lines of ``text``, each marked with where it stands."""
    return [
        _Piece(
            line.text, line.in_code, line.kind == "open", line.kind == "close", line.fence.marker if line.fence else ""
        )
        for line in markdown_lines(text)
    ]


def _cut(pieces: list[_Piece], limit: int) -> tuple[list[str], list[_Piece]]:
    """The chunks of ``pieces`` for ``limit``, and the pieces the last chunk was made of."""
    fence_width = max((len(piece.text.strip()) for piece in pieces if piece.opens), default=3)
    chunks: list[str] = []
    lines: list[_Piece] = []  # the chunk being built
    size = 0  # len("\n".join(lines))
    opening: _Piece | None = None  # the fence line of the code block we are inside, as reopened
    last_break = -1  # index in ``lines`` of the last blank line outside a code block

    def flush(upto: int | None = None) -> None:
        """Emit ``lines[:upto]`` as a chunk and keep the rest as the start of the next one."""
        nonlocal lines, size, last_break
        head, rest = (lines, []) if upto is None else (lines[:upto], lines[upto + 1 :])
        body = "\n".join(piece.text for piece in head).strip("\n")
        if opening is not None and upto is None:
            body += "\n" + opening.marker
        if body.strip():
            chunks.append(body)
        if upto is None and opening is not None:
            rest = [opening]
        lines, last_break = rest, -1
        size = len("\n".join(piece.text for piece in lines))

    for piece in _hard_wrap(pieces, limit - _CLOSE_RESERVE - 1, fence_width=fence_width):
        reserve = _CLOSE_RESERVE if piece.code else 0
        added = len(piece.text) + (1 if lines else 0)
        if lines and size + added + reserve > limit:
            # Prefer a paragraph break in the second half of the chunk over a bare line break.
            if opening is None and last_break > 0 and len("\n".join(p.text for p in lines[:last_break])) > limit // 2:
                flush(last_break)
            else:
                flush()
            added = len(piece.text) + (1 if lines else 0)
        lines.append(piece)
        size += added
        if piece.opens:
            opening = replace(piece, text=piece.text.strip())
        elif piece.closes:
            opening = None
        elif not piece.code and not piece.text.strip():
            last_break = len(lines) - 1
    tail = _trimmed(lines)
    flush()
    return chunks, tail


def _trimmed(pieces: list[_Piece]) -> list[_Piece]:
    """``pieces`` without the empty lines they start and end with (a chunk drops them)."""
    start, end = 0, len(pieces)
    while start < end and not pieces[start].text:
        start += 1
    while end > start and not pieces[end - 1].text:
        end -= 1
    return pieces[start:end]


def _hard_wrap(pieces: list[_Piece], width: int, *, fence_width: int) -> list[_Piece]:
    """Cut lines longer than ``width`` (minus room for a reopened fence) at a space if possible;
    the parts of a fence line open (or close) its block with their first (or last) part."""
    width = max(20, width - fence_width - 1)
    out: list[_Piece] = []
    for piece in pieces:
        line = piece.text
        if len(line) <= width:
            out.append(piece)
            continue
        parts: list[str] = []
        while len(line) > width:
            cut = line.rfind(" ", width // 2, width)
            cut = width if cut <= 0 else cut + 1
            parts.append(line[:cut])
            line = line[cut:]
        parts.append(line)
        for number, part in enumerate(parts):
            first, final = number == 0, number == len(parts) - 1
            out.append(replace(piece, text=part, opens=piece.opens and first, closes=piece.closes and final))
    return out
