"""The kernel's own display bundles, read as data: a chart's data, a table the code showed.

A kernel adds two display types of Threadbook's own (made by ``threadbook_kernel.chartdata`` and
``threadbook_kernel.frames``): :data:`CHART_MIME` beside a chart's PNG, :data:`TABLE_MIME` for
``display_dataframe_to_user``. They come from code the thread ran, so they are untrusted: each
is read against a strict schema — exactly the documented keys, version 1, every type, count and
size within the bounds below, every number finite — and anything off is refused whole (the
picture alone; no table). Text in them gets its control, format and bidi characters escaped
(:func:`bot.safetext.shown`), so it is one visible line wherever it is shown.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from typing import Any, cast

from bot.events import Cell, Chart, ChartKind, Number, Series, Table
from bot.safetext import shown
from bot.tables import format_number

log = logging.getLogger(__name__)

CHART_MIME = "application/vnd.threadbook.chart+json"
TABLE_MIME = "application/vnd.threadbook.table+json"
VERSION = 1
KINDS: tuple[ChartKind, ...] = ("bar", "line", "area", "pie")
MAX_CATEGORIES = 200
MAX_SERIES = 20
MAX_LABEL_CHARS = 200
MAX_TITLE_CHARS = 300
MAX_TABLE_ROWS = 100
MAX_TABLE_COLUMNS = 20
MAX_CELL_CHARS = 200
MAX_NAME_CHARS = 100
#: Larger than any real table (a frame's row count as the kernel reports it).
MAX_TOTAL = 10**15
_CHART_KEYS = frozenset({"version", "kind", "title", "categories", "series", "x_label", "y_label"})
_TABLE_KEYS = frozenset({"version", "name", "columns", "rows", "total_rows", "total_columns", "file"})
_FILE = re.compile(r"^tables/(?P<name>[A-Za-z0-9._-]{1,64}\.csv)$")


class _Refused(ValueError):
    """The bundle is not what the schema says (the message says where)."""


def chart_from(data: Mapping[str, Any]) -> Chart | None:
    """The chart data in a display bundle (its :data:`CHART_MIME` entry), or None: absent or refused."""
    raw = data.get(CHART_MIME)
    if raw is None:
        return None
    try:
        return _chart(raw)
    except _Refused as exc:
        log.info("chart data refused (the picture is sent alone): %s", exc)
        return None


def table_from(data: Mapping[str, Any]) -> Table | None:
    """The table in a display bundle (its :data:`TABLE_MIME` entry), or None: absent or refused."""
    raw = data.get(TABLE_MIME)
    if raw is None:
        return None
    try:
        return _table(raw)
    except _Refused as exc:
        log.info("table refused: %s", exc)
        return None


def _chart(raw: Any) -> Chart:
    bundle = _object(raw, _CHART_KEYS, "chart")
    _version(bundle)
    kind = bundle["kind"]
    if kind not in KINDS:
        raise _Refused(f"kind {str(kind)[:20]!r}")
    categories = _list(bundle["categories"], "categories", 1, MAX_CATEGORIES)
    labels = tuple(_text(c, "category", MAX_LABEL_CHARS, empty=False) for c in categories)
    if len(set(labels)) != len(labels):
        raise _Refused("a category twice")
    series: list[Series] = []
    for item in _list(bundle["series"], "series", 1, 1 if kind == "pie" else MAX_SERIES):
        entry = _object(item, frozenset({"name", "values"}), "series")
        values = tuple(_number(v) for v in _list(entry["values"], "values", len(labels), len(labels)))
        if kind == "pie" and any(v <= 0 for v in values):
            raise _Refused("a pie slice ≤ 0")
        series.append(Series(_text(entry["name"], "series name", MAX_LABEL_CHARS, empty=False), values))
    if len({s.name for s in series}) != len(series):
        raise _Refused("a series name twice")
    return Chart(
        kind=cast(ChartKind, kind),
        title=_text(bundle["title"], "title", MAX_TITLE_CHARS),
        categories=labels,
        series=tuple(series),
        x_label=_text(bundle["x_label"], "x_label", MAX_LABEL_CHARS),
        y_label=_text(bundle["y_label"], "y_label", MAX_LABEL_CHARS),
    )


def _table(raw: Any) -> Table:
    bundle = _object(raw, _TABLE_KEYS, "table")
    _version(bundle)
    name = _text(bundle["name"], "name", MAX_NAME_CHARS, empty=False)
    header = tuple(
        _text(c, "column", MAX_CELL_CHARS) for c in _list(bundle["columns"], "columns", 1, MAX_TABLE_COLUMNS)
    )
    rows: list[tuple[Cell, ...]] = []
    for row in _list(bundle["rows"], "rows", 0, MAX_TABLE_ROWS):
        rows.append(tuple(_cell(v) for v in _list(row, "row", len(header), len(header))))
    total_rows, total_columns = _count(bundle["total_rows"], len(rows)), _count(bundle["total_columns"], len(header))
    file = bundle["file"]
    match = _FILE.match(file) if isinstance(file, str) else None
    if match is None:
        raise _Refused("file")
    return Table(
        header=header,
        rows=tuple(rows),
        caption=f"{name} ({total_rows:,} rows × {total_columns:,} columns)",
        total_rows=total_rows,
        total_columns=total_columns,
        file=match.group("name"),
    )


def _object(raw: Any, keys: frozenset[str], what: str) -> dict[str, Any]:
    if not isinstance(raw, dict) or set(raw) != keys:
        raise _Refused(f"{what}: not an object with exactly the keys {sorted(keys)}")
    return raw


def _version(bundle: dict[str, Any]) -> None:
    version = bundle["version"]
    if type(version) is not int or version != VERSION:
        raise _Refused(f"version {str(version)[:10]!r}")


def _list(raw: Any, what: str, least: int, most: int) -> list[Any]:
    if not isinstance(raw, list) or not least <= len(raw) <= most:
        raise _Refused(f"{what}: not a list of {least}–{most} items")
    return raw


def _text(raw: Any, what: str, most: int, *, empty: bool = True) -> str:
    if not isinstance(raw, str) or len(raw) > most or (not empty and not raw.strip()):
        raise _Refused(f"{what}: not a text of {0 if empty else 1}–{most} characters")
    return shown(raw, max_chars=most)


def _number(raw: Any) -> float:
    try:
        value = float(raw) if type(raw) in (int, float) else math.nan
    except OverflowError:  # a whole number past what a float holds
        value = math.nan
    if not math.isfinite(value):
        raise _Refused("a value that is not a finite number")
    return value


def _cell(raw: Any) -> Cell:
    if raw is None:
        return ""
    if isinstance(raw, str):
        return _text(raw, "cell", MAX_CELL_CHARS)
    value = _number(raw)
    return Number(value, format_number(value))


def _count(raw: Any, at_least: int) -> int:
    if type(raw) is not int or not at_least <= raw <= MAX_TOTAL:
        raise _Refused("a total that is not a whole number at least the rows shown")
    return raw
