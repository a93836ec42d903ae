"""Tables (:class:`~bot.events.Table`) → aligned fixed-width text (pure functions, no I/O).

Discord renders no Markdown tables, and Slack's fallback for a table it does not draw natively
is text; a code block is the one place their columns stay aligned. :func:`align_tables`
replaces every Markdown table outside fenced code blocks with such a block; :func:`table_at`
is the piece a converter with its own line loop uses (Slack's); :func:`render_table` lays out
any table (one the code showed too). What counts as a Markdown table is :mod:`bot.tables`'s
rule; cell text is kept as written (inline Markdown included: a code block shows it literally).

Widths count what a monospace font shows: East Asian wide and fullwidth characters take two
columns, combining marks and zero-width characters none.
"""

from __future__ import annotations

import re
import unicodedata

from bot.events import Align, Number, Table
from bot.tables import cell_text, parse_table, split_row

__all__ = ["align_tables", "display_width", "render_table", "split_row", "table_at"]

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_ZERO_WIDTH = {"Mn", "Me", "Cf"}
_SEPARATOR = " | "


def display_width(text: str) -> int:
    """Columns ``text`` takes in a monospace font (wide characters 2, combining marks 0)."""
    if text.isascii() and text.isprintable():
        return len(text)
    width = 0
    for char in text:
        if unicodedata.category(char) in _ZERO_WIDTH:
            continue
        width += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return width


def render_table(table: Table) -> list[str]:
    """The table as aligned lines: header, a dashed line, the rows (no trailing spaces)."""
    columns = table.columns
    aligns: list[Align] = list(table.aligns) + ["left"] * (columns - len(table.aligns))
    if not table.aligns:  # no Markdown said (a DataFrame the code showed): numbers to the right
        aligns = ["right" if _numbers(table, c) else "left" for c in range(columns)]
    rows = [[cell_text(cell) for cell in row] for row in table.rows]
    grid = [_pad_row(list(table.header), columns), *(_pad_row(row, columns) for row in rows)]
    widths = [max(1, *(display_width(row[c]) for row in grid)) for c in range(columns)]
    lines = [
        _SEPARATOR.join(_fit(cell, widths[c], aligns[c]) for c, cell in enumerate(_trimmed(row))).rstrip()
        for row in grid
    ]
    rule = "-+-".join("-" * width for width in widths)
    return [lines[0], rule, *lines[1:]]


def _numbers(table: Table, column: int) -> bool:
    """Whether ``column`` holds numbers only (empty cells aside), at least one."""
    cells = [row[column] for row in table.rows if column < len(row) and cell_text(row[column])]
    return bool(cells) and all(isinstance(cell, Number) for cell in cells)


def table_at(lines: list[str], start: int) -> tuple[list[str], int] | None:
    """The aligned lines of the table starting at ``lines[start]`` and the index after it, or None."""
    parsed = parse_table(lines, start)
    if parsed is None:
        return None
    table, end = parsed
    return render_table(table), end


def align_tables(markdown: str) -> str:
    """Replace each Markdown table outside fenced code blocks with an aligned code block."""
    lines = markdown.split("\n")
    out: list[str] = []
    fence: str | None = None  # the open fence's marker while inside a code block
    i = 0
    while i < len(lines):
        line = lines[i]
        opening = _FENCE.match(line)
        if fence is not None:
            if (
                opening
                and opening.group(1)[0] == fence[0]
                and len(opening.group(1)) >= len(fence)
                and not opening.group(2).strip()
            ):
                fence = None
            out.append(line)
            i += 1
            continue
        if opening:
            fence = opening.group(1)
            out.append(line)
            i += 1
            continue
        found = table_at(lines, i)
        if found is None:
            out.append(line)
            i += 1
            continue
        rendered, i = found
        out.extend(["```", *(_no_fence(row) for row in rendered), "```"])
    return "\n".join(out)


def _pad_row(row: list[str], columns: int) -> list[str]:
    return row + [""] * (columns - len(row))


def _trimmed(row: list[str]) -> list[str]:
    """``row`` without its trailing empty cells (so no line ends in a bare separator)."""
    end = len(row)
    while end > 1 and not row[end - 1]:
        end -= 1
    return row[:end]


def _fit(cell: str, width: int, align: Align) -> str:
    gap = width - display_width(cell)
    if align == "right":
        return " " * gap + cell
    if align == "center":
        return " " * (gap // 2) + cell + " " * (gap - gap // 2)
    return cell + " " * gap


def _no_fence(line: str) -> str:
    """A cell's own triple backticks would close the code block early: break them up."""
    return line.replace("```", "`\u200b`\u200b`")
