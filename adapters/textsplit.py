"""Split Markdown-like text into chunks a chat platform accepts, without breaking code fences.

Slack (~4,000 characters in practice) and Discord (2,000) both cap one message. A chunk ends
at a paragraph break where possible, else at a line break, else inside an over-long line. A
code block that must be cut is closed at the end of one chunk and reopened (same fence line,
so the language tag survives) at the start of the next, so every chunk renders on its own.
"""

from __future__ import annotations

import re

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_CLOSE_RESERVE = 5  # "\n" + a closing fence of up to four characters


def split_markdown(text: str, limit: int) -> list[str]:
    """Split ``text`` into chunks of at most ``limit`` characters; empty text gives no chunks.

    Fenced code blocks (```` ``` ```` or ``~~~``) that straddle a cut are closed and reopened.
    """
    if limit < 40:
        raise ValueError("limit must be at least 40 characters")
    text = text.strip("\n")
    if not text.strip():
        return []
    if len(text) <= limit:
        return [text]

    chunks: list[str] = []
    lines: list[str] = []  # the chunk being built
    size = 0  # len("\n".join(lines))
    fence: str | None = None  # the opening line of the code block we are inside, if any
    last_break = -1  # index in ``lines`` of the last blank line outside a code block

    def flush(upto: int | None = None) -> None:
        """Emit ``lines[:upto]`` as a chunk and keep the rest as the start of the next one."""
        nonlocal lines, size, last_break
        head, rest = (lines, []) if upto is None else (lines[:upto], lines[upto + 1 :])
        body = "\n".join(head).strip("\n")
        if fence is not None and upto is None:
            body += "\n" + _closing(fence)
        if body.strip():
            chunks.append(body)
        if upto is None and fence is not None:
            rest = [fence]
        lines, last_break = rest, -1
        size = len("\n".join(lines))

    for line in _hard_wrap(text.split("\n"), limit - _CLOSE_RESERVE - 1, fence_width=_longest_fence(text)):
        reserve = _CLOSE_RESERVE if fence is not None or _FENCE.match(line) else 0
        added = len(line) + (1 if lines else 0)
        if lines and size + added + reserve > limit:
            # Prefer a paragraph break in the second half of the chunk over a bare line break.
            if fence is None and last_break > 0 and len("\n".join(lines[:last_break])) > limit // 2:
                flush(last_break)
            else:
                flush()
            added = len(line) + (1 if lines else 0)
        lines.append(line)
        size += added
        match = _FENCE.match(line)
        if match:
            if fence is None:
                fence = line.strip()
            elif line.strip().startswith(_closing(fence)) and not line.strip()[len(_closing(fence)) :].strip():
                fence = None
        elif fence is None and not line.strip():
            last_break = len(lines) - 1
    flush()
    return chunks


def _closing(fence_line: str) -> str:
    """The fence that closes a block opened by ``fence_line`` (```` ```python ```` → ```` ``` ````)."""
    match = _FENCE.match(fence_line)
    assert match is not None
    return match.group(1)


def _longest_fence(text: str) -> int:
    return max((len(line.strip()) for line in text.split("\n") if _FENCE.match(line)), default=3)


def _hard_wrap(lines: list[str], width: int, *, fence_width: int) -> list[str]:
    """Cut lines longer than ``width`` (minus room for a reopened fence) at a space if possible."""
    width = max(20, width - fence_width - 1)
    out: list[str] = []
    for line in lines:
        while len(line) > width:
            cut = line.rfind(" ", width // 2, width)
            cut = width if cut <= 0 else cut + 1
            out.append(line[:cut])
            line = line[cut:]
        out.append(line)
    return out
