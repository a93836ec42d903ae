"""GitHub-style Markdown tables → aligned fixed-width text (pure functions, no I/O).

Neither Discord nor Slack renders Markdown tables; a code block is the one place their columns
stay aligned. :func:`align_tables` replaces every table outside fenced code blocks with such a
block; :func:`table_at` is the piece a converter with its own line loop uses (Slack's).

What counts as a table (GitHub's rules, loosened where a chat answer is better served):

- a header row and a delimiter row (``---``, ``:---``, ``---:``, ``:---:`` per cell, at least one
  pipe) with the same number of cells; body rows follow until a blank line or a line without a
  pipe;
- cells are split at pipes, except escaped ones (``\\|``, shown as ``|``) and pipes inside code
  spans (``a|b`` in backticks stays one cell);
- a short row is padded with empty cells; a long row keeps its extra cells (nothing is dropped);
- cell text is kept as written (inline Markdown included: a code block shows it literally).

Widths count what a monospace font shows: East Asian wide and fullwidth characters take two
columns, combining marks and zero-width characters none.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Literal

Align = Literal["left", "right", "center"]

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_DELIMITER_CELL = re.compile(r"^\s*(:?)-+(:?)\s*$")
_ZERO_WIDTH = {"Mn", "Me", "Cf"}
_SEPARATOR = " | "


@dataclass(frozen=True, slots=True)
class Table:
    """A parsed table: header cells, one alignment per column, body rows (all as written)."""

    header: list[str]
    aligns: list[Align]
    rows: list[list[str]]


def display_width(text: str) -> int:
    """Columns ``text`` takes in a monospace font (wide characters 2, combining marks 0)."""
    width = 0
    for char in text:
        if unicodedata.category(char) in _ZERO_WIDTH:
            continue
        width += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return width


def split_row(line: str) -> list[str]:
    """The cells of a table row: split at pipes outside code spans and not escaped; outer
    pipes optional; each cell stripped, ``\\|`` shown as ``|``."""
    cells = _cells(line)
    if len(cells) > 1 and not cells[0].strip():
        cells = cells[1:]
    if len(cells) > 1 and not cells[-1].strip():
        cells = cells[:-1]
    return [c.strip() for c in cells]


def _cells(line: str) -> list[str]:
    """``line`` split at its real pipes (not escaped, not inside a code span), unstripped."""
    cells: list[str] = []
    cell: list[str] = []
    i, n = 0, len(line)
    while i < n:
        char = line[i]
        if char == "\\" and i + 1 < n and line[i + 1] == "|":
            cell.append("|")
            i += 2
        elif char == "`":
            run = n - i - len(line[i:].lstrip("`"))
            ticks = line[i : i + run]
            close = _closing_ticks(line, i + run, ticks)
            end = close + run if close >= 0 else i + run  # a code span is copied whole, pipes and all
            cell.append(line[i:end])
            i = end
        elif char == "|":
            cells.append("".join(cell))
            cell = []
            i += 1
        else:
            cell.append(char)
            i += 1
    cells.append("".join(cell))
    return cells


def _closing_ticks(line: str, start: int, ticks: str) -> int:
    """Index of the backtick run equal to ``ticks`` that closes a code span, or -1."""
    i = start
    while True:
        found = line.find(ticks, i)
        if found < 0:
            return -1
        end = found + len(ticks)
        if (found == 0 or line[found - 1] != "`") and (end >= len(line) or line[end] != "`"):
            return found
        i = end + len(line[end:]) - len(line[end:].lstrip("`"))


def _has_pipe(line: str) -> bool:
    return len(_cells(line)) > 1


def _delimiter(line: str) -> list[Align] | None:
    if "|" not in line:
        return None
    aligns: list[Align] = []
    for cell in split_row(line):
        match = _DELIMITER_CELL.match(cell)
        if match is None:
            return None
        left, right = bool(match.group(1)), bool(match.group(2))
        aligns.append("center" if left and right else "right" if right else "left")
    return aligns or None


def parse_table(lines: list[str], start: int) -> tuple[Table, int] | None:
    """The table whose header is ``lines[start]``, and the index of the first line after it;
    None when no table starts there."""
    if start + 1 >= len(lines) or "|" not in lines[start] or not lines[start].strip():
        return None
    aligns = _delimiter(lines[start + 1])
    header = split_row(lines[start])
    if aligns is None or len(header) != len(aligns):
        return None
    rows: list[list[str]] = []
    end = start + 2
    while end < len(lines) and lines[end].strip() and _has_pipe(lines[end]) and not _FENCE.match(lines[end]):
        rows.append(split_row(lines[end]))
        end += 1
    return Table(header, aligns, rows), end


def render_table(table: Table) -> list[str]:
    """The table as aligned lines: header, a dashed line, the rows (no trailing spaces)."""
    columns = max([len(table.header), *(len(row) for row in table.rows)])
    aligns = table.aligns + ["left"] * (columns - len(table.aligns))
    grid = [_pad_row(table.header, columns), *(_pad_row(row, columns) for row in table.rows)]
    widths = [max(1, *(display_width(row[c]) for row in grid)) for c in range(columns)]
    lines = [
        _SEPARATOR.join(_fit(cell, widths[c], aligns[c]) for c, cell in enumerate(_trimmed(row))).rstrip()
        for row in grid
    ]
    rule = "-+-".join("-" * width for width in widths)
    return [lines[0], rule, *lines[1:]]


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
