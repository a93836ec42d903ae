"""Slack's native data blocks from the core's tables and charts (pure functions, no I/O).

- :func:`table_block`: a :class:`~bot.events.Table` as a ``table`` block (up to
  :data:`SMALL_TABLE_ROWS` body rows: read at a glance) or a ``data_table`` block (sortable,
  filterable, paginated; up to :data:`DATA_TABLE_ROWS` body rows). The header is the first row,
  numbers are ``raw_number`` cells (value and the text written), the rest ``raw_text``. A table
  past Slack's limits (rows, :data:`MAX_COLUMNS` columns, :data:`MAX_TABLE_CHARS` characters) is
  cut; :attr:`NativeTable.hidden_rows` / ``hidden_columns`` / ``cut_cells`` say how much is not shown.
- :func:`chart_block`: a :class:`~bot.events.Chart` as a ``data_visualization`` block (bar,
  line, area, pie), or None when it is past Slack's chart limits (:data:`MAX_CATEGORIES`
  categories, :data:`MAX_SERIES` series or pie slices, labels that stay apart in
  :data:`MAX_LABEL_CHARS` characters): that chart is sent as its picture alone.

Limits as Slack's Block Kit reference states them (docs.slack.dev, "Table block", "Data table
block", "Data visualization block"): a table holds at most 100 rows of at most 20 cells; a data
table a header and 1–100 rows, all of one length, ``raw_text`` (text of at least one character)
or ``raw_number`` cells, and a caption; a chart's title at most 50 characters, a pie 1–6
segments of value > 0, a bar, line or area chart 1–6 uniquely named series over 1–20 unique
categories with one value for each, labels and names at most 20 characters, axis labels at
most 50; at most two charts a message. The data table's limit on characters across all cells
is cut off in the stored reference, so :data:`MAX_TABLE_CHARS` is our own conservative figure.

Every text here came from the model or a kernel: it goes into plain-text fields only (cells,
caption, title, labels, names), one line, with ``<``/``>`` shown as ``‹``/``›`` and a word
joiner after an ``@`` that starts a word, so nothing in it can mention, link or change the
layout (:func:`plain_cell`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from adapters.slack.links import quiet_mentions
from bot.events import Chart, Number, Table
from bot.tables import cell_text, unmarked

NativeKind = Literal["table", "data_table", "data_visualization"]

#: Body rows a ``table`` block takes; a longer table is a ``data_table``.
SMALL_TABLE_ROWS = 10
#: Rows of a ``table`` block (the header included).
TABLE_ROWS = 100
#: Body rows of a ``data_table`` block (the header comes on top).
DATA_TABLE_ROWS = 100
#: Rows a data table shows a page.
PAGE_SIZE = 10
MAX_COLUMNS = 20
#: Characters across all cells of one table (ours: see the module docstring).
MAX_TABLE_CHARS = 10_000
MAX_CELL_CHARS = 500
MAX_CAPTION_CHARS = 200
MAX_TITLE_CHARS = 50
MAX_AXIS_LABEL_CHARS = 50
MAX_LABEL_CHARS = 20
MAX_CATEGORIES = 20
MAX_SERIES = 6
MAX_PIE_SEGMENTS = 6
#: ``data_visualization`` blocks in one message.
CHARTS_PER_MESSAGE = 2


#: What :func:`plain_cell` changes: brackets, an ``@``, runs of spaces.
_UNPLAIN = re.compile(r"[<>@]|\s\s")


@dataclass(frozen=True, slots=True)
class NativeTable:
    """A table as one Slack block, and how much of the table it leaves out."""

    kind: NativeKind
    block: dict[str, Any]
    hidden_rows: int
    hidden_columns: int
    #: Cells shown only up to :data:`MAX_CELL_CHARS` characters.
    cut_cells: int = 0

    @property
    def cut(self) -> bool:
        """Whether part of the table is not shown."""
        return bool(self.hidden_rows or self.hidden_columns or self.cut_cells)


def plain_cell(text: str, limit: int = MAX_CELL_CHARS) -> str:
    """Untrusted text for a plain-text field: one line, no mention, no link token, at most
    ``limit`` characters (``…`` marks a cut), never empty (Slack wants one character)."""
    if text.isprintable() and not _UNPLAIN.search(text) and text == text.strip():
        flat = text  # most cells: nothing to change
    else:
        flat = quiet_mentions(" ".join(text.replace("<", "‹").replace(">", "›").split()))
    if len(flat) > limit:
        flat = flat[: limit - 1] + "…"
    return flat or " "


def table_block(table: Table, *, caption: str = "", data_table: bool | None = None) -> NativeTable:
    """``table`` as a ``table`` block, or a ``data_table`` block when it is long (or when
    ``data_table`` says so); cut to Slack's limits."""
    body = len(table.rows)
    kind: NativeKind = "data_table" if (data_table if data_table is not None else body > SMALL_TABLE_ROWS) else "table"
    columns = min(table.columns, MAX_COLUMNS)
    most_rows = DATA_TABLE_ROWS if kind == "data_table" else TABLE_ROWS - 1
    header = [_text_cell(h) for h in _padded(list(table.header), columns)]
    budget = MAX_TABLE_CHARS - sum(len(c["text"]) for c in header)
    rows: list[list[dict[str, Any]]] = []
    for row in table.rows[:most_rows]:
        cells = [_cell(c) for c in _padded(list(row), columns)]
        size = sum(len(c["text"]) for c in cells)
        if size > budget:
            break
        budget -= size
        rows.append(cells)
    shown_rows = len(rows)
    cut_cells = sum(_shortened(cell) for row in [header, *rows] for cell in row)
    if not rows:  # Slack wants a header and at least one row
        rows.append([_text_cell("") for _ in range(columns)])
    block: dict[str, Any]
    if kind == "data_table":
        block = {
            "type": "data_table",
            "caption": plain_cell(caption or _caption(table), MAX_CAPTION_CHARS),
            "rows": [header, *rows],
            "page_size": min(PAGE_SIZE, len(rows)),
        }
    else:
        block = {"type": "table", "rows": [header, *rows], "column_settings": _settings(table, columns)}
    hidden_rows = (table.total_rows if table.total_rows is not None else body) - shown_rows
    hidden_columns = (table.total_columns if table.total_columns is not None else table.columns) - columns
    return NativeTable(kind, block, max(0, hidden_rows), max(0, hidden_columns), cut_cells)


def chart_block(chart: Chart) -> dict[str, Any] | None:
    """``chart`` as a ``data_visualization`` block, or None when Slack cannot draw it."""
    categories = [_label(c) for c in chart.categories]
    names = [_label(s.name) for s in chart.series]
    if len(set(categories)) != len(categories) or len(set(names)) != len(names):
        return None  # labels that only differ past 20 characters
    title = plain_cell(chart.title or "Chart", MAX_TITLE_CHARS)
    if chart.kind == "pie":
        if len(chart.series) != 1 or not 1 <= len(categories) <= MAX_PIE_SEGMENTS:
            return None
        values = chart.series[0].values
        if any(v <= 0 for v in values):
            return None
        segments = [{"label": label, "value": value} for label, value in zip(categories, values)]
        return {"type": "data_visualization", "title": title, "chart": {"type": "pie", "segments": segments}}
    if not 1 <= len(categories) <= MAX_CATEGORIES or not 1 <= len(chart.series) <= MAX_SERIES:
        return None
    axis: dict[str, Any] = {"categories": categories}
    if chart.x_label:
        axis["x_label"] = plain_cell(chart.x_label, MAX_AXIS_LABEL_CHARS)
    if chart.y_label:
        axis["y_label"] = plain_cell(chart.y_label, MAX_AXIS_LABEL_CHARS)
    series = [
        {"name": name, "data": [{"label": label, "value": value} for label, value in zip(categories, s.values)]}
        for name, s in zip(names, chart.series)
    ]
    return {
        "type": "data_visualization",
        "title": title,
        "chart": {"type": chart.kind, "series": series, "axis_config": axis},
    }


def _shortened(cell: dict[str, Any]) -> bool:
    """Whether :func:`plain_cell` cut the cell's text to :data:`MAX_CELL_CHARS`."""
    text: str = cell["text"]
    return len(text) == MAX_CELL_CHARS and text.endswith("…")


def _label(text: str) -> str:
    return plain_cell(text, MAX_LABEL_CHARS)


def _padded(cells: list[Any], columns: int) -> list[Any]:
    return (cells + [""] * (columns - len(cells)))[:columns]


def _text_cell(text: str) -> dict[str, Any]:
    return {"type": "raw_text", "text": plain_cell(unmarked(text))}


def _cell(cell: str | Number) -> dict[str, Any]:
    if isinstance(cell, Number):
        return {"type": "raw_number", "value": cell.value, "text": plain_cell(unmarked(cell.text))}
    return _text_cell(cell)


def _settings(table: Table, columns: int) -> list[dict[str, Any]]:
    """Each column's alignment: as the Markdown said, else right for a column of numbers."""
    settings: list[dict[str, Any]] = []
    for column in range(columns):
        align = table.aligns[column] if column < len(table.aligns) else "left"
        cells = [row[column] for row in table.rows if column < len(row) and cell_text(row[column]).strip()]
        if align == "left" and cells and all(isinstance(c, Number) for c in cells):
            align = "right"
        settings.append({"align": align, "is_wrapped": True})
    return settings


def _caption(table: Table) -> str:
    """A caption for a table that has none: its columns."""
    names = [unmarked(h) for h in table.header if h.strip()]
    return f"Table: {', '.join(names)}" if names else "Table"
