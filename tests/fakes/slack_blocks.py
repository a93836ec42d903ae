"""Block Kit as the fake Slack checks it: the documented limits of the blocks the bot sends.

:func:`check_blocks` answers what Slack answers ``invalid_blocks`` for (None: accepted), for the
blocks a message carries (``chat.postMessage``, ``chat.update``, ``chat.stopStream``,
``files.completeUploadExternal``). Limits as docs.slack.dev's Block Kit reference states them:

- a message holds at most 50 blocks; a section's text at most 3,000 characters;
- ``table``: ``rows`` 1–100, each of 1–20 cells, all of one length; cells ``raw_text`` (a
  ``text`` of at least one character), ``raw_number`` (a finite ``value``; ``text`` optional,
  at least one character) or ``rich_text``; ``column_settings`` at most 20 (``align``
  left/center/right, ``is_wrapped`` a boolean); one table a message;
- ``data_table``: a ``caption``; ``rows`` 2–101 (a header and 1–100 rows), all of one length of
  1–20 cells, the header without ``rich_text``; ``page_size`` 1–100; ``row_header_column_index``
  a column; at most 10,000 characters across all cells (the reference's own figure is cut off
  in the stored copy: this is the bot's conservative reading, ``adapters/slack/blocks.py``);
- ``data_visualization``: a ``title`` of 1–50 characters and a ``chart``: ``pie`` with 1–6
  ``segments`` (``label`` 1–20 characters, ``value`` > 0), or ``bar``/``line``/``area`` with 1–6
  ``series`` (unique ``name`` 1–20 characters, 1–20 ``data`` points: one per category, each
  ``label`` a category) and ``axis_config`` (1–20 unique ``categories`` of 1–20 characters,
  ``x_label``/``y_label`` at most 50); at most two a message.

Keys a block does not document are refused too, as Slack refuses them.
"""

from __future__ import annotations

import math
from typing import Any

MAX_BLOCKS = 50
SECTION_CHARS = 3000
TABLE_ROWS = 100
DATA_TABLE_ROWS = 101
MAX_COLUMNS = 20
DATA_TABLE_CHARS = 10_000
TITLE_CHARS = 50
LABEL_CHARS = 20
AXIS_LABEL_CHARS = 50
MAX_SERIES = 6
MAX_POINTS = 20
MAX_SEGMENTS = 6
CHARTS_PER_MESSAGE = 2


class Invalid(Exception):
    """A block out of schema; ``str()`` says where."""


def check_blocks(blocks: Any) -> str | None:
    """Why Slack would refuse ``blocks`` (None: it would not)."""
    try:
        _blocks(blocks)
    except Invalid as exc:
        return str(exc)
    return None


def _blocks(blocks: Any) -> None:
    if not isinstance(blocks, list) or len(blocks) > MAX_BLOCKS:
        raise Invalid(f"blocks: a list of at most {MAX_BLOCKS}")
    kinds = [b.get("type") if isinstance(b, dict) else None for b in blocks]
    if kinds.count("table") > 1:
        raise Invalid("only one table a message")
    if kinds.count("data_visualization") > CHARTS_PER_MESSAGE:
        raise Invalid(f"at most {CHARTS_PER_MESSAGE} data_visualization blocks a message")
    for number, block in enumerate(blocks):
        if not isinstance(block, dict):
            raise Invalid(f"blocks[{number}]: not an object")
        check = _CHECKS.get(str(block.get("type")))
        if check is not None:
            try:
                check(block)
            except Invalid as exc:
                raise Invalid(f"blocks[{number}] ({block['type']}): {exc}") from None


def _keys(block: dict[str, Any], required: set[str], optional: set[str]) -> None:
    missing, extra = required - set(block), set(block) - required - optional
    if missing or extra:
        raise Invalid(f"missing {sorted(missing)}, unknown {sorted(extra)}")


def _text(value: Any, least: int, most: int, what: str) -> str:
    if not isinstance(value, str) or not least <= len(value) <= most:
        raise Invalid(f"{what}: a string of {least}–{most} characters")
    return value


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise Invalid(f"{what}: a finite number")
    return float(value)


def _section(block: dict[str, Any]) -> None:
    text = block.get("text")
    if isinstance(text, dict):
        _text(text.get("text"), 1, SECTION_CHARS, "text.text")


def _cell(cell: Any, *, rich: bool = True) -> int:
    """Check one table cell; returns the characters it shows."""
    if not isinstance(cell, dict):
        raise Invalid("a cell that is not an object")
    kind = cell.get("type")
    if kind == "raw_text":
        _keys(cell, {"type", "text"}, set())
        return len(_text(cell["text"], 1, 10**6, "raw_text.text"))
    if kind == "raw_number":
        _keys(cell, {"type", "value"}, {"text"})
        _number(cell["value"], "raw_number.value")
        return len(_text(cell["text"], 1, 10**6, "raw_number.text")) if "text" in cell else len(str(cell["value"]))
    if kind == "rich_text" and rich:
        if not isinstance(cell.get("elements"), list):
            raise Invalid("rich_text: elements")
        return 0
    raise Invalid(f"a cell of type {kind!r}")


def _rows(rows: Any, least: int, most: int) -> list[list[Any]]:
    if not isinstance(rows, list) or not least <= len(rows) <= most:
        raise Invalid(f"rows: {least}–{most}")
    if not all(isinstance(row, list) and 1 <= len(row) <= MAX_COLUMNS for row in rows):
        raise Invalid(f"a row of 1–{MAX_COLUMNS} cells")
    if len({len(row) for row in rows}) != 1:
        raise Invalid("rows of different lengths")
    return rows


def _table(block: dict[str, Any]) -> None:
    _keys(block, {"type", "rows"}, {"block_id", "column_settings"})
    for row in _rows(block["rows"], 1, TABLE_ROWS):
        for cell in row:
            _cell(cell)
    settings = block.get("column_settings", [])
    if not isinstance(settings, list) or len(settings) > MAX_COLUMNS:
        raise Invalid("column_settings: at most 20")
    for setting in settings:
        if setting is None:
            continue
        if not isinstance(setting, dict) or set(setting) - {"align", "is_wrapped"}:
            raise Invalid("column_settings: align, is_wrapped")
        if setting.get("align", "left") not in ("left", "center", "right"):
            raise Invalid("column_settings.align")
        if not isinstance(setting.get("is_wrapped", False), bool):
            raise Invalid("column_settings.is_wrapped")


def _data_table(block: dict[str, Any]) -> None:
    _keys(block, {"type", "rows", "caption"}, {"block_id", "page_size", "row_header_column_index"})
    _text(block["caption"], 1, 3000, "caption")
    rows = _rows(block["rows"], 2, DATA_TABLE_ROWS)
    chars = sum(_cell(cell, rich=False) for cell in rows[0])
    chars += sum(_cell(cell) for row in rows[1:] for cell in row)
    if chars > DATA_TABLE_CHARS:
        raise Invalid(f"{chars} characters across the cells (at most {DATA_TABLE_CHARS})")
    if "page_size" in block and (type(block["page_size"]) is not int or not 1 <= block["page_size"] <= 100):
        raise Invalid("page_size: 1–100")
    index = block.get("row_header_column_index", 0)
    if type(index) is not int or not 0 <= index < len(rows[0]):
        raise Invalid("row_header_column_index")


def _chart(block: dict[str, Any]) -> None:
    _keys(block, {"type", "title", "chart"}, {"block_id"})
    _text(block["title"], 1, TITLE_CHARS, "title")
    chart = block["chart"]
    if not isinstance(chart, dict):
        raise Invalid("chart: an object")
    kind = chart.get("type")
    if kind == "pie":
        _keys(chart, {"type", "segments"}, set())
        segments = chart["segments"]
        if not isinstance(segments, list) or not 1 <= len(segments) <= MAX_SEGMENTS:
            raise Invalid(f"segments: 1–{MAX_SEGMENTS}")
        for segment in segments:
            if not isinstance(segment, dict):
                raise Invalid("a segment that is not an object")
            _keys(segment, {"label", "value"}, set())
            _text(segment["label"], 1, LABEL_CHARS, "segment label")
            if _number(segment["value"], "segment value") <= 0:
                raise Invalid("segment value: > 0")
        return
    if kind not in ("bar", "line", "area"):
        raise Invalid(f"chart type {kind!r}")
    _keys(chart, {"type", "series", "axis_config"}, set())
    axis = chart["axis_config"]
    if not isinstance(axis, dict):
        raise Invalid("axis_config: an object")
    _keys(axis, {"categories"}, {"x_label", "y_label"})
    for label in ("x_label", "y_label"):
        if label in axis:
            _text(axis[label], 0, AXIS_LABEL_CHARS, label)
    categories = axis["categories"]
    if not isinstance(categories, list) or not 1 <= len(categories) <= MAX_POINTS:
        raise Invalid(f"categories: 1–{MAX_POINTS}")
    names = [_text(c, 1, LABEL_CHARS, "category") for c in categories]
    if len(set(names)) != len(names):
        raise Invalid("a category twice")
    series = chart["series"]
    if not isinstance(series, list) or not 1 <= len(series) <= MAX_SERIES:
        raise Invalid(f"series: 1–{MAX_SERIES}")
    seen: set[str] = set()
    for entry in series:
        if not isinstance(entry, dict):
            raise Invalid("a series that is not an object")
        _keys(entry, {"name", "data"}, set())
        name = _text(entry["name"], 1, LABEL_CHARS, "series name")
        if name in seen:
            raise Invalid("a series name twice")
        seen.add(name)
        data = entry["data"]
        if not isinstance(data, list) or not 1 <= len(data) <= MAX_POINTS or len(data) != len(names):
            raise Invalid("data: one point for each category")
        labels = []
        for point in data:
            if not isinstance(point, dict):
                raise Invalid("a data point that is not an object")
            _keys(point, {"label", "value"}, set())
            labels.append(_text(point["label"], 1, LABEL_CHARS, "data label"))
            _number(point["value"], "data value")
        if sorted(labels) != sorted(names):
            raise Invalid("data labels that are not the categories, once each")


_CHECKS = {"section": _section, "table": _table, "data_table": _data_table, "data_visualization": _chart}
