"""Markdown tables in an answer, as data (pure functions, no I/O).

A model writes tables as GitHub-style Markdown. :func:`answer_parts` cuts an answer into its
prose and its tables (:class:`~bot.events.Table`), so each platform can show a table its own
way: Slack as a native table block, Discord and Slack's fallback as an aligned code block
(``adapters/tables.py``), the console with rich. What counts as a table (GitHub's rules,
loosened where a chat answer is better served):

- a header row and a delimiter row (``---``, ``:---``, ``---:``, ``:---:`` per cell, at least one
  pipe) with the same number of cells; body rows follow until a blank line or a line without a
  pipe; nothing inside a fenced code block is a table (:mod:`bot.markdown` reads the fences);
- cells are split at pipes, except escaped ones (``\\|``, shown as ``|``) and pipes inside code
  spans (``a|b`` in backticks stays one cell);
- a short row is padded with empty cells; a long row keeps its extra cells (nothing is dropped);
- cell text is kept as written (inline Markdown included); a cell that reads as a number
  (``1,234.5``, ``-3``, ``12%``, ``$4.50``, emphasis aside) is a :class:`~bot.events.Number`
  whose text is still the cell as written.
"""

from __future__ import annotations

import csv
import io
import math
import re

from bot.events import Align, Cell, Number, Table
from bot.markdown import Code, Prose
from bot.markdown import blocks as markdown_blocks

_DELIMITER_CELL = re.compile(r"^\s*(:?)-+(:?)\s*$")
_NUMBER = re.compile(
    r"^(?P<sign>[+\-\u2212]?)(?P<currency>[$€£¥]?)"
    r"(?P<digits>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|\.\d+)(?P<percent>%?)$"
)
#: Emphasis and code marks a reader does not see: ``**x**``, ``__x__``, ``*x*``, ``_x_``, ``~~x~~``, backticks.
_MARKS = re.compile(
    r"(\*\*|__|~~)(?=\S)(.+?)(?<=\S)\1"
    r"|(?<![\w*])\*(?=\S)([^*]+?)(?<=\S)\*(?![\w*])"
    r"|(?<![\w_])_(?=\S)([^_]+?)(?<=\S)_(?![\w_])"
    r"|`+([^`]+)`+"
)
_LINK = re.compile(r"!?\[([^\[\]]*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_MARK_CHARS = re.compile(r"[*_~`\[]")
_NUMBER_START = frozenset("+-\u2212$€£¥.0123456789")
#: Cells a spreadsheet would read as a formula when the CSV is opened.
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def split_row(line: str) -> list[str]:
    """The cells of a table row: split at pipes outside code spans and not escaped; outer
    pipes optional; each cell stripped, ``\\|`` shown as ``|``."""
    return _outer(_cells(line))


def _outer(cells: list[str]) -> list[str]:
    """Cells split at the pipes without the empty ones outside the outer pipes, stripped."""
    if len(cells) > 1 and not cells[0].strip():
        cells = cells[1:]
    if len(cells) > 1 and not cells[-1].strip():
        cells = cells[:-1]
    return [c.strip() for c in cells]


def _cells(line: str) -> list[str]:
    """``line`` split at its real pipes (not escaped, not inside a code span), unstripped."""
    if "`" not in line and "\\" not in line:
        return line.split("|")  # no code span, no escape: every pipe is one
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


def _table_at(lines: tuple[str, ...], start: int) -> tuple[Table, int] | None:
    """The table whose header is ``lines[start]`` (lines of prose), and the index of the first
    line after it; None when no table starts there."""
    if start + 1 >= len(lines) or "|" not in lines[start] or not lines[start].strip():
        return None
    aligns = _delimiter(lines[start + 1])
    header = split_row(lines[start])
    if aligns is None or len(header) != len(aligns):
        return None
    rows: list[tuple[Cell, ...]] = []
    end = start + 2
    while end < len(lines) and lines[end].strip():
        cells = _cells(lines[end])
        if len(cells) < 2:
            break  # a line without a pipe ends the table
        rows.append(tuple(_cell(text) for text in _outer(cells)))
        end += 1
    return Table(header=tuple(header), rows=tuple(rows), aligns=tuple(aligns)), end


def blocks(markdown: str) -> list[Code | Prose | Table]:
    """``markdown`` as its code blocks (:mod:`bot.markdown`), its prose and the tables in that
    prose, in order."""
    out: list[Code | Prose | Table] = []
    for block in markdown_blocks(markdown):
        if isinstance(block, Code):
            out.append(block)
            continue
        lines, i = block.lines, 0
        prose: list[str] = []
        while i < len(lines):
            found = _table_at(lines, i)
            if found is None:
                prose.append(lines[i])
                i += 1
                continue
            if prose:
                out.append(Prose(tuple(prose)))
                prose = []
            table, i = found
            out.append(table)
        if prose:
            out.append(Prose(tuple(prose)))
    return out


def answer_parts(markdown: str) -> list[str | Table]:
    """``markdown`` cut into its prose (``str``, lines as written, code blocks included) and its
    tables, in order. Tables inside fenced code blocks stay prose; an answer without tables is
    one part."""
    parts: list[str | Table] = []
    prose: list[str] = []
    for block in blocks(markdown.replace("\r\n", "\n")):
        if not isinstance(block, Table):
            prose.extend(block.lines)
            continue
        if prose:
            parts.append("\n".join(prose))
            prose = []
        parts.append(block)
    if prose:
        parts.append("\n".join(prose))
    return parts


def cell_text(cell: Cell) -> str:
    """A cell's text as written."""
    return cell.text if isinstance(cell, Number) else cell


def unmarked(text: str) -> str:
    """``text`` as a reader sees it: emphasis and code marks left out, a link as ``label (target)``.
    For places that show a cell as plain text (a native table), never as markup."""
    if not _MARK_CHARS.search(text):
        return text
    text = _LINK.sub(lambda m: f"{m.group(1)} ({m.group(2)})" if m.group(2) else m.group(1), text)
    previous = None
    while previous != text:  # nested marks (``**`x`**``)
        previous = text
        text = _MARKS.sub(lambda m: next(g for g in m.groups()[1:] if g is not None), text)
    return text


def parse_number(text: str) -> float | None:
    """The value of a cell that reads as a number (``1,234.5``, ``−3``, ``12%``, ``$4.50``), else None."""
    text = text.strip()
    if not text or text[0] not in _NUMBER_START:
        return None
    match = _NUMBER.match(text)
    if match is None:
        return None
    value = float(match.group("digits").replace(",", ""))
    if not math.isfinite(value):
        return None
    return -value if match.group("sign") in ("-", "\u2212") else value


def format_number(value: float) -> str:
    """A number as a table shows it: whole numbers as they are, others to four decimals at most
    (very large or small ones in scientific notation)."""
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if abs(value) >= 1e12 or abs(value) < 1e-4:
        return f"{value:.4g}"
    return f"{value:.4f}".rstrip("0").rstrip(".")


def hidden_note(table: Table, *, rows: int | None = None, columns: int | None = None) -> str:
    """A line saying how much of ``table`` is not shown when ``rows`` body rows and ``columns``
    columns are (default: all it holds; a table the code showed holds only the beginning of its
    frame), and which file holds it whole; empty when everything is shown."""
    total_rows = table.total_rows if table.total_rows is not None else len(table.rows)
    total_columns = table.total_columns if table.total_columns is not None else table.columns
    hidden = (
        (total_rows - (len(table.rows) if rows is None else rows), "row"),
        (total_columns - (table.columns if columns is None else columns), "column"),
    )
    parts = [f"{n:,} more {what}{'s' if n != 1 else ''}" for n, what in hidden if n > 0]
    if not parts:
        return ""
    where = f"; the whole table is in {table.file}" if table.file else ""
    return f"({' and '.join(parts)} not shown{where})"


def to_markdown(table: Table) -> str:
    """``table`` as a Markdown table again (pipes in cells escaped)."""
    columns = table.columns
    aligns = list(table.aligns) + ["left"] * (columns - len(table.aligns))
    marks = {"left": "---", "right": "--:", "center": ":-:"}

    def row(cells: list[str]) -> str:
        padded = cells + [""] * (columns - len(cells))
        return "| " + " | ".join(c.replace("|", "\\|") for c in padded) + " |"

    lines = [row(list(table.header)), "|" + "|".join(marks[a] for a in aligns) + "|"]
    lines += [row([cell_text(c) for c in cells]) for cells in table.rows]
    return "\n".join(lines)


def to_csv(table: Table) -> bytes:
    """``table`` as CSV (UTF-8), cells as a reader sees them; a text cell that would start a
    spreadsheet formula gets a leading ``'``."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    columns = table.columns

    def row(cells: list[Cell]) -> list[str]:
        texts = [_defused(unmarked(cell_text(c)), isinstance(c, Number)) for c in cells]
        return texts + [""] * (columns - len(texts))

    writer.writerow(row(list(table.header)))
    for cells in table.rows:
        writer.writerow(row(list(cells)))
    return out.getvalue().encode()


def _defused(text: str, number: bool) -> str:
    return f"'{text}" if not number and text.startswith(_FORMULA) else text


def _cell(text: str) -> Cell:
    value = parse_number(unmarked(text))
    return text if value is None else Number(value, text)
