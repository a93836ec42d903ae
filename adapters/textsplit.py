"""Split Markdown-like text into chunks a chat platform accepts, without breaking code fences.

Slack (~4,000 characters in practice) and Discord (2,000) both cap one message. A chunk ends
at a paragraph break where possible, else at a line break, else inside an over-long line. A
code block that must be cut is closed at the end of one chunk and reopened (same fence line,
so the language tag survives) at the start of the next, so every chunk renders on its own.
Which lines are code is read once, by :mod:`bot.markdown`. The last chunk may have a smaller
limit of its own (Slack's section block, under the buttons): the text is still split once.
"""

from __future__ import annotations

from bot.markdown import Line, lines

_CLOSE_RESERVE = 5  # "\n" + a closing fence of up to four characters


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
    read = list(lines(text))
    chunks, tail = ([text], read) if len(text) <= limit else _cut(read, limit)
    if len(chunks[-1]) > final:
        # The last chunk, cut again for its own limit from where it starts (the lines as read).
        chunks[-1:], _ = _cut(tail, final)
    return chunks


def _cut(read: list[Line], limit: int) -> tuple[list[str], list[Line]]:
    """The chunks of the lines ``read`` for ``limit``, and the lines the last chunk was made of."""
    fence_width = max((len(line.text.strip()) for line in read if line.kind == "open"), default=3)
    chunks: list[str] = []
    lines: list[Line] = []  # the chunk being built
    size = 0  # len("\n".join(lines))
    opening: Line | None = None  # the fence line of the code block we are inside, as reopened
    last_break = -1  # index in ``lines`` of the last blank line outside a code block

    def flush(upto: int | None = None) -> None:
        """Emit ``lines[:upto]`` as a chunk and keep the rest as the start of the next one."""
        nonlocal lines, size, last_break
        head, rest = (lines, []) if upto is None else (lines[:upto], lines[upto + 1 :])
        body = "\n".join(line.text for line in head).strip("\n")
        if opening is not None and opening.fence is not None and upto is None:
            body += "\n" + opening.fence.marker
        if body.strip():
            chunks.append(body)
        if upto is None and opening is not None:
            rest = [opening]
        lines, last_break = rest, -1
        size = len("\n".join(line.text for line in lines))

    for line in _hard_wrap(read, limit - _CLOSE_RESERVE - 1, fence_width=fence_width):
        reserve = _CLOSE_RESERVE if line.kind != "prose" else 0
        added = len(line.text) + (1 if lines else 0)
        if lines and size + added + reserve > limit:
            # Prefer a paragraph break in the second half of the chunk over a bare line break.
            if opening is None and last_break > 0 and len("\n".join(x.text for x in lines[:last_break])) > limit // 2:
                flush(last_break)
            if lines and size + added + reserve > limit:  # what the paragraph break left still does not fit
                flush()
            added = len(line.text) + (1 if lines else 0)
        lines.append(line)
        size += added
        if line.kind == "open":
            opening = line._replace(text=line.text.strip())
        elif line.kind == "close":
            opening = None
        elif line.kind == "prose" and not line.text.strip():
            last_break = len(lines) - 1
    tail = _trimmed(lines)
    flush()
    return chunks, tail


def _trimmed(lines: list[Line]) -> list[Line]:
    """``lines`` without the empty ones they start and end with (a chunk drops them)."""
    start, end = 0, len(lines)
    while start < end and not lines[start].text:
        start += 1
    while end > start and not lines[end - 1].text:
        end -= 1
    return lines[start:end]


def _hard_wrap(read: list[Line], width: int, *, fence_width: int) -> list[Line]:
    """Cut lines longer than ``width`` (minus room for a reopened fence) at a space if possible;
    a fence line's first part opens its block (its last part closes it), the others are code."""
    width = max(20, width - fence_width - 1)
    out: list[Line] = []
    for line in read:
        text = line.text
        if len(text) <= width:
            out.append(line)
            continue
        parts: list[str] = []
        while len(text) > width:
            cut = text.rfind(" ", width // 2, width)
            cut = width if cut <= 0 else cut + 1
            parts.append(text[:cut])
            text = text[cut:]
        parts.append(text)
        last = len(parts) - 1
        for number, part in enumerate(parts):
            kind = line.kind
            if (kind == "open" and number > 0) or (kind == "close" and number < last):
                kind = "code"
            out.append(line._replace(text=part, kind=kind))
    return out
