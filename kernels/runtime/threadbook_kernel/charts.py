"""``show_chart(...)``: a bar, line, area or pie chart that chat platforms can draw themselves.

The model calls it (a global in every kernel) for simple category charts. It draws the chart
with matplotlib (the PNG every platform gets) and adds the chart's data as Threadbook's chart
bundle (:mod:`threadbook_kernel.chartdata`), so Slack can show it as a native chart as well.
Plotly figures and Altair charts get the same bundle when they are shown; matplotlib figures
of the model's own stay pictures.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import Any

from threadbook_kernel.chartdata import CHART_MIME, KINDS, bundle

__all__ = ["show_chart"]


def show_chart(
    data: Any,
    x: str | None = None,
    y: str | Sequence[str] | None = None,
    *,
    kind: str = "bar",
    title: str = "",
    x_label: str | None = None,
    y_label: str | None = None,
) -> None:
    """Show a ``kind`` chart ("bar", "line", "area" or "pie") of ``data`` to the people in the thread.

    ``data`` is a DataFrame (or a dict of columns); ``x`` names the column of categories (default:
    the index), ``y`` the column or columns to plot, one series each (default: every numeric
    column). A pie takes one ``y`` column of positive values. Slack draws charts of at most 20
    categories and 6 series (a pie: 6 slices) natively; bigger ones are sent as the picture.
    """
    import pandas

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    frame = data if isinstance(data, pandas.DataFrame) else pandas.DataFrame(data)
    categories = list(frame.index) if x is None else list(frame[x])
    columns = [y] if isinstance(y, str) else list(y) if y is not None else _numeric(frame, exclude=x)
    if not columns:
        raise ValueError("no numeric column to plot: name it with y=")
    if kind == "pie" and len(columns) != 1:
        raise ValueError("a pie chart takes one y column")
    series = [(str(c), list(frame[c])) for c in columns]
    x_text = x_label if x_label is not None else (x or str(frame.index.name or ""))
    y_text = y_label if y_label is not None else (columns[0] if len(columns) == 1 else "")
    png = _draw(kind, [str(c) for c in categories], series, title, x_text, y_text)
    chart = bundle(kind, categories, series, title=title, x_label=x_text, y_label=y_text)
    shown: dict[str, Any] = {"image/png": base64.b64encode(png).decode("ascii")}
    if chart is not None:
        shown[CHART_MIME] = chart
    words = f"{len(categories)} categories, {len(series)} series"
    shown["text/plain"] = f"<{kind} chart {title!r}: {words}>" if title else f"<{kind} chart: {words}>"
    from IPython.display import display

    display(shown, raw=True)  # type: ignore[no-untyped-call]


def _numeric(frame: Any, *, exclude: str | None) -> list[str]:
    import pandas

    return [c for c in frame.columns if c != exclude and pandas.api.types.is_numeric_dtype(frame[c])]


def _draw(
    kind: str, categories: list[str], series: list[tuple[str, list[Any]]], title: str, x_label: str, y_label: str
) -> bytes:
    """The chart as a PNG (matplotlib, off-screen; the figure is closed, never shown twice)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.5), dpi=100)
    axes = figure.add_subplot()
    if kind == "pie":
        axes.pie(series[0][1], labels=categories, autopct="%1.0f%%")
        axes.axis("equal")
    else:
        positions = list(range(len(categories)))
        width = 0.8 / len(series)
        for number, (name, values) in enumerate(series):
            floats = [float("nan") if v is None else float(v) for v in values]
            if kind == "bar":
                axes.bar([p - 0.4 + width * (number + 0.5) for p in positions], floats, width, label=name)
            elif kind == "line":
                axes.plot(positions, floats, marker="o", label=name)
            else:
                axes.fill_between(positions, floats, alpha=0.4, label=name)
                axes.plot(positions, floats)
        axes.set_xticks(positions, categories, rotation=45 if len(categories) > 8 else 0, ha="right")
        axes.set_xlabel(x_label)
        axes.set_ylabel(y_label)
        if len(series) > 1:
            axes.legend()
    axes.set_title(title)
    figure.tight_layout()
    out = io.BytesIO()
    figure.savefig(out, format="png")
    return out.getvalue()
