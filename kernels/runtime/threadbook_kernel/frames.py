"""``display_dataframe_to_user(name, dataframe)``: show a table to the people in the thread.

The model calls it (it is a global in every kernel, like ChatGPT's function of that name) to
put a DataFrame in front of the people in the thread. It writes the whole frame as CSV into the
workspace (``tables/<name>.csv``, which the turn sends like any file it wrote) and displays one
bundle of Threadbook's own type :data:`TABLE_MIME` — the first :data:`MAX_ROWS` rows and
:data:`MAX_COLUMNS` columns as data — beside ``text/html`` (for the notebook export) and
``text/plain`` (what the model reads). The bundle, version :data:`VERSION`::

    {"version": 1, "name": str, "columns": [str, ...], "rows": [[str | number | null, ...], ...],
     "total_rows": int, "total_columns": int, "file": "tables/<name>.csv"}

Text cells are cut to :data:`MAX_CELL_CHARS`; numbers are finite (NaN and infinities are null).
In the CSV, a text cell that starts like a spreadsheet formula (``=``, ``+``, ``-``, ``@``) gets
a leading ``'`` so opening the file runs nothing.
"""

from __future__ import annotations

import datetime
import math
import numbers
import os
import re
from typing import Any

__all__ = ["MAX_COLUMNS", "MAX_ROWS", "TABLE_MIME", "display_dataframe_to_user"]

TABLE_MIME = "application/vnd.threadbook.table+json"
VERSION = 1
MAX_ROWS = 100
MAX_COLUMNS = 20
MAX_CELL_CHARS = 200
MAX_NAME_CHARS = 100
#: The workspace folder the CSV files go to.
FOLDER = "tables"
_FORMULA = ("=", "+", "-", "@", "\t", "\r")
_SLUG = re.compile(r"[^A-Za-z0-9._-]+")


def display_dataframe_to_user(name: str, dataframe: Any) -> None:
    """Show ``dataframe`` to the people in this thread as a table named ``name``.

    Chat platforms show its first 100 rows (Slack as a sortable data table), and the whole frame
    is attached as ``tables/<name>.csv``. Use it for tables people should read or download;
    ``print`` stays for what only you need to see.
    """
    import pandas
    from IPython.display import display

    frame = dataframe if isinstance(dataframe, pandas.DataFrame) else pandas.DataFrame(dataframe)
    title = _one_line(str(name), MAX_NAME_CHARS) or "table"
    if not isinstance(frame.index, pandas.RangeIndex) or frame.index.name is not None:
        frame = frame.reset_index()  # a grouped result: its keys are columns people want to see
    path = _write_csv(frame, title)
    shown = frame.iloc[:MAX_ROWS, :MAX_COLUMNS]
    rows, columns = frame.shape
    table = {
        "version": VERSION,
        "name": title,
        "columns": [_cell_text(c) for c in shown.columns],
        "rows": [[_cell(v) for v in row] for row in shown.itertuples(index=False, name=None)],
        "total_rows": int(rows),
        "total_columns": int(columns),
        "file": path,
    }
    more = "" if rows <= MAX_ROWS else f" (the first {MAX_ROWS} shown)"
    note = f"[Table {title!r} shown to the user: {rows:,} rows × {columns} columns{more}; saved whole as {path}]"
    display(  # type: ignore[no-untyped-call]
        {TABLE_MIME: table, "text/html": shown.to_html(max_rows=MAX_ROWS), "text/plain": note}, raw=True
    )


def _write_csv(frame: Any, title: str) -> str:
    """Write ``frame`` as ``tables/<slug>.csv`` in the workspace (opened from its folder, no
    link followed); returns the workspace-relative path."""
    from threadbook_kernel import workspace_fd

    slug = _SLUG.sub("-", title).strip("-.")[:60] or "table"
    root = workspace_fd()
    try:
        os.mkdir(FOLDER, 0o755, dir_fd=root)
    except FileExistsError:
        pass
    folder = os.open(FOLDER, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root)
    try:
        fd = os.open(
            f"{slug}.csv",
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
            dir_fd=folder,
        )
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as sink:
            _defused(frame).to_csv(sink, index=False)
    finally:
        os.close(folder)
    return f"{FOLDER}/{slug}.csv"


def _defused(frame: Any) -> Any:
    """``frame`` with text that would start a spreadsheet formula prefixed by ``'``: in its
    column names (the CSV's first line) and in every column that can hold text (object,
    string, categorical and the like: any but numbers and datetimes)."""
    from pandas.api.types import is_datetime64_any_dtype, is_numeric_dtype

    names = [_defused_text(name) for name in frame.columns]
    texts = [
        i for i, dtype in enumerate(frame.dtypes) if not is_numeric_dtype(dtype) and not is_datetime64_any_dtype(dtype)
    ]
    if not texts and names == list(frame.columns):
        return frame
    frame = frame.copy()
    frame.columns = range(len(names))  # by position: names may repeat
    for i in texts:
        frame[i] = frame[i].astype(object).map(_defused_text)
    frame.columns = names
    return frame


def _defused_text(value: Any) -> Any:
    return f"'{value}" if isinstance(value, str) and value.startswith(_FORMULA) else value


def _cell(value: Any) -> str | float | int | None:
    """A cell as data: a finite number, text, or None (missing, NaN, infinite)."""
    if value is None or isinstance(value, bool):
        return None if value is None else str(value)
    if isinstance(value, numbers.Integral) and abs(int(value)) < 2**53:
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else None
    if isinstance(value, (datetime.datetime, datetime.date)):
        return _cell_text(value.isoformat().removesuffix("T00:00:00"))
    try:
        import pandas

        if value is pandas.NaT or (not isinstance(value, (str, bytes)) and pandas.isna(value)):
            return None
    except (TypeError, ValueError):
        pass
    return _cell_text(value)


def _cell_text(value: Any) -> str:
    return _one_line(str(value), MAX_CELL_CHARS)


def _one_line(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
