"""Tables (:class:`~bot.events.Table`) → aligned fixed-width text (pure functions, no I/O).

Discord renders no Markdown tables, and Slack's fallback for a table it does not draw natively
is text; a code block is the one place their columns stay aligned. :func:`align_tables`
replaces every Markdown table outside fenced code blocks with such a block (:func:`aligned`:
a renderer reading :func:`bot.tables.blocks` itself does the same); :func:`render_table` lays
out any table (one the code showed too). What counts as a Markdown table is :mod:`bot.tables`'s
rule; cell text is kept as written (inline Markdown included: a code block shows it literally).

Widths count what a monospace font shows: East Asian wide and fullwidth characters take two
columns, combining marks and zero-width characters none.
"""

from __future__ import annotations

import unicodedata

from bot.events import Align, Number, Table
from bot.tables import blocks, cell_text, split_row

__all__ = ["align_tables", "aligned", "display_width", "render_table", "split_row"]

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


def aligned(table: Table) -> list[str]:
    """``table`` as the lines of an aligned code block, fences included."""
    return ["```", *(_no_fence(row) for row in render_table(table)), "```"]


def align_tables(markdown: str) -> str:
    """Replace each Markdown table outside fenced code blocks with an aligned code block."""
    return "\n".join(
        line for block in blocks(markdown) for line in (aligned(block) if isinstance(block, Table) else block.lines)
    )


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
