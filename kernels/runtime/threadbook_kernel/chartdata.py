"""A chart's data, read inside the kernel, as a small bounded bundle the bot can check.

Threadbook's own display type :data:`CHART_MIME` (``application/vnd.threadbook.chart+json``)
sits beside a chart's PNG in its display bundle, so a platform that draws charts itself can
draw this one (Slack's data visualization block); the PNG stays for every other place. The
bundle, version :data:`VERSION`::

    {"version": 1, "kind": "bar" | "line" | "area" | "pie", "title": str,
     "categories": [str, ...], "series": [{"name": str, "values": [number, ...]}, ...],
     "x_label": str, "y_label": str}

Every series has one finite value per category (a pie has one series, its values > 0). It is
made from a Plotly figure (:func:`from_plotly`), a Vega-Lite spec (:func:`from_vegalite`) or the
chart helper (:mod:`threadbook_kernel.charts`); anything else — a scatter, a heatmap, a
histogram, facets, transforms, aggregations the spec leaves to the renderer, gaps — gets no
bundle (the picture alone). Bounds (:data:`MAX_CATEGORIES`, :data:`MAX_SERIES`, text lengths)
are the bot's own (``bot/displays.py``); a platform's tighter limits are the adapter's to apply.
"""

from __future__ import annotations

import base64
import math
import numbers
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["CHART_MIME", "VERSION", "bundle", "from_plotly", "from_vegalite"]

CHART_MIME = "application/vnd.threadbook.chart+json"
VERSION = 1
KINDS = ("bar", "line", "area", "pie")
MAX_CATEGORIES = 200
MAX_SERIES = 20
MAX_LABEL_CHARS = 200
MAX_TITLE_CHARS = 300

#: Plotly's typed arrays (``{"dtype": "f8", "bdata": base64}``, plotly ≥ 6) → struct codes.
_DTYPES = {"f8": "d", "f4": "f", "i1": "b", "u1": "B", "i2": "h", "u2": "H", "i4": "i", "u4": "I", "i8": "q", "u8": "Q"}


def bundle(
    kind: str,
    categories: Sequence[Any],
    series: Sequence[tuple[Any, Sequence[Any]]],
    *,
    title: Any = "",
    x_label: Any = "",
    y_label: Any = "",
) -> dict[str, Any] | None:
    """The chart bundle for these categories and ``(name, values)`` series, or None when it is not
    one (an unknown kind, a gap, a value that is not a finite number, a repeated category, a pie
    slice ≤ 0, more than the bounds)."""
    if kind not in KINDS or not categories or not series:
        return None
    if len(categories) > MAX_CATEGORIES or len(series) > MAX_SERIES or (kind == "pie" and len(series) != 1):
        return None
    labels = [_text(c, MAX_LABEL_CHARS) for c in categories]
    if len(set(labels)) != len(labels) or not all(labels):
        return None
    out: list[dict[str, Any]] = []
    for number, (name, values) in enumerate(series, 1):
        if len(values) != len(labels):
            return None
        numbers = [_finite(v) for v in values]
        if any(v is None for v in numbers) or (kind == "pie" and any(v is not None and v <= 0 for v in numbers)):
            return None
        out.append({"name": _text(name, MAX_LABEL_CHARS) or f"Series {number}", "values": numbers})
    names = [s["name"] for s in out]
    if len(set(names)) != len(names):
        return None
    return {
        "version": VERSION,
        "kind": kind,
        "title": _text(title, MAX_TITLE_CHARS),
        "categories": labels,
        "series": out,
        "x_label": _text(x_label, MAX_LABEL_CHARS),
        "y_label": _text(y_label, MAX_LABEL_CHARS),
    }


def from_plotly(figure: Mapping[str, Any]) -> dict[str, Any] | None:
    """The bundle of a Plotly figure (its JSON) made of bar, line, area or pie traces of one kind."""
    traces = figure.get("data")
    found = figure.get("layout")
    layout: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    if not isinstance(traces, list) or not traces or not all(isinstance(t, Mapping) for t in traces):
        return None
    kinds = {_plotly_kind(t) for t in traces}
    if len(kinds) != 1 or None in kinds:
        return None
    kind = kinds.pop()
    assert kind is not None
    title = _title(layout.get("title"))
    if kind == "pie":
        if len(traces) != 1:
            return None
        labels, values = _array(traces[0].get("labels")), _array(traces[0].get("values"))
        if labels is None or values is None:
            return None
        return bundle("pie", labels, [(traces[0].get("name") or title or "Share", values)], title=title)
    horizontal = all(t.get("orientation") == "h" for t in traces) and kind == "bar"
    category_key, value_key = ("y", "x") if horizontal else ("x", "y")
    x_axis, y_axis = _title(_axis(layout, "xaxis")), _title(_axis(layout, "yaxis"))
    x_label, y_label = (y_axis, x_axis) if horizontal else (x_axis, y_axis)
    categories: list[Any] = []
    columns: list[tuple[Any, dict[Any, Any]]] = []
    for number, trace in enumerate(traces, 1):
        keys, values = _array(trace.get(category_key)), _array(trace.get(value_key))
        if keys is None or values is None or len(keys) != len(values) or len(set(map(_key, keys))) != len(keys):
            return None
        points = {_key(k): v for k, v in zip(keys, values)}
        categories.extend(k for k in keys if _key(k) not in {_key(c) for c in categories})
        name = trace.get("name") or (y_label if len(traces) == 1 else "") or f"Series {number}"
        columns.append((name, points))
    if kind != "bar" and not _evenly_spaced(categories):
        return None  # numbers at uneven steps on the x axis: a category axis would bend the line
    series: list[tuple[Any, list[Any]]] = []
    for name, points in columns:
        # A bar missing from one series is a bar of height 0; a line or area with a gap is not drawn natively.
        values = [points.get(_key(c), 0 if kind == "bar" else None) for c in categories]
        series.append((name, values))
    return bundle(kind, categories, series, title=title, x_label=x_label, y_label=y_label)


def from_vegalite(spec: Mapping[str, Any]) -> dict[str, Any] | None:
    """The bundle of a single-view Vega-Lite spec (bar, line, area, arc) over inline rows, with
    fields used as they are (no aggregate, bin or transform the renderer would compute)."""
    if any(key in spec for key in ("layer", "hconcat", "vconcat", "concat", "facet", "repeat", "transform")):
        return None
    mark = spec.get("mark")
    mark_type = mark.get("type") if isinstance(mark, Mapping) else mark
    kind = {"bar": "bar", "line": "line", "area": "area", "arc": "pie"}.get(str(mark_type))
    encoding = spec.get("encoding")
    rows = _rows(spec)
    if kind is None or not isinstance(encoding, Mapping) or rows is None:
        return None
    channels: dict[str, tuple[str, str]] = {}
    for channel, definition in encoding.items():
        if channel in ("tooltip", "opacity", "size", "href", "order"):
            continue
        if not isinstance(definition, Mapping) or any(k in definition for k in ("aggregate", "bin", "timeUnit")):
            return None
        field = definition.get("field")
        if not isinstance(field, str) or channel not in ("x", "y", "color", "theta"):
            return None
        channels[channel] = (field, str(definition.get("title") or field))
    title = _title(spec.get("title"))
    if kind == "pie":
        if set(channels) != {"theta", "color"}:
            return None
        (value, _), (label, _) = channels["theta"], channels["color"]
        return bundle(
            "pie", [r.get(label) for r in rows], [(title or value, [r.get(value) for r in rows])], title=title
        )
    if "x" not in channels or "y" not in channels or set(channels) - {"x", "y", "color"}:
        return None
    quantitative = {c: _vl_type(encoding[c]) == "quantitative" for c in ("x", "y")}
    if quantitative["x"] == quantitative["y"]:
        return None  # two numbers (a scatter of points) or two categories: nothing to draw as bars or lines
    (category, category_title), (value, value_title) = (
        (channels["y"], channels["x"]) if quantitative["x"] else (channels["x"], channels["y"])
    )
    grouped = channels.get("color")
    categories: list[Any] = []
    by_series: dict[Any, dict[Any, Any]] = {}
    for row in rows:
        key = row.get(category)
        name = row.get(grouped[0]) if grouped else value_title
        points = by_series.setdefault(name, {})
        if _key(key) in points:
            return None  # two rows for one bar: the renderer would add them up
        points[_key(key)] = row.get(value)
        if _key(key) not in {_key(c) for c in categories}:
            categories.append(key)
    series = [
        (name, [points.get(_key(c), 0 if kind == "bar" else None) for c in categories])
        for name, points in by_series.items()
    ]
    return bundle(kind, categories, series, title=title, x_label=category_title, y_label=value_title)


def _evenly_spaced(values: list[Any]) -> bool:
    """True unless ``values`` are all numbers and their steps differ."""
    numbers = [_finite(v) for v in values]
    if any(n is None for n in numbers) or len(numbers) < 3:
        return True
    steps = [b - a for a, b in zip(numbers, numbers[1:])]  # type: ignore[operator]
    return all(math.isclose(step, steps[0], rel_tol=1e-9, abs_tol=1e-12) for step in steps)


def _plotly_kind(trace: Mapping[str, Any]) -> str | None:
    kind = trace.get("type", "scatter")
    if kind == "bar":
        return "bar"
    if kind == "pie":
        return "pie"
    if kind != "scatter":
        return None  # histogram, heatmap, box, scatter3d, …: no native form
    mode = str(trace.get("mode") or "lines")
    if "lines" not in mode:
        return None  # points only: a scatter
    fill = trace.get("fill")
    return "area" if trace.get("stackgroup") or (fill and fill != "none") else "line"


def _array(value: Any) -> list[Any] | None:
    """A Plotly data array as a list: a plain list, or a typed array decoded."""
    if isinstance(value, list):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("bdata"), str) and value.get("dtype") in _DTYPES:
        if "shape" in value and len(str(value["shape"]).split(",")) > 1:
            return None  # a 2-D array (a heatmap's z)
        import struct

        raw = base64.b64decode(value["bdata"], validate=True)
        code = _DTYPES[str(value["dtype"])]
        size = struct.calcsize(code)
        if len(raw) % size or len(raw) // size > MAX_CATEGORIES:
            return None
        return list(struct.unpack(f"<{len(raw) // size}{code}", raw))
    return None


def _rows(spec: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    """A Vega-Lite spec's inline rows (``data.values``, or the named ``datasets`` entry Altair writes)."""
    data = spec.get("data")
    if not isinstance(data, Mapping):
        return None
    rows: Any = data.get("values")
    if rows is None and isinstance(data.get("name"), str) and isinstance(spec.get("datasets"), Mapping):
        rows = spec["datasets"].get(data["name"])
    if not isinstance(rows, list) or len(rows) > MAX_CATEGORIES * MAX_SERIES:
        return None
    return rows if all(isinstance(r, Mapping) for r in rows) else None


def _vl_type(definition: Any) -> str:
    return str(definition.get("type", "")) if isinstance(definition, Mapping) else ""


def _axis(layout: Mapping[str, Any], name: str) -> Any:
    axis = layout.get(name)
    return axis.get("title") if isinstance(axis, Mapping) else None


def _title(value: Any) -> str:
    """A title given as text or as ``{"text": ...}`` (Plotly, Vega-Lite)."""
    if isinstance(value, Mapping):
        value = value.get("text")
    if isinstance(value, list):  # Vega-Lite's multi-line title
        value = " ".join(str(v) for v in value)
    return "" if value is None else str(value)


def _key(value: Any) -> Any:
    """A category as a dictionary key (lists are not hashable; 1 and "1" stay apart)."""
    return (type(value).__name__, str(value))


_SPACE = re.compile(r"\s+")


def _text(value: Any, limit: int) -> str:
    """One line of at most ``limit`` characters (a timestamp's midnight time left out)."""
    text = "" if value is None else str(value)
    if text.endswith("T00:00:00") or text.endswith(" 00:00:00"):
        text = text[:-9]
    text = _SPACE.sub(" ", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite real number (not a bool, not text)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    number = float(value)
    return number if math.isfinite(number) else None
