"""Markdown tables in answers as data (bot/tables.py) and the kernel's own bundles read strictly
(bot/displays.py): what each platform is handed to draw natively."""

from __future__ import annotations

import copy
import csv
import io
import math
from typing import Any

import pytest

from bot.displays import CHART_MIME, TABLE_MIME, chart_from, table_from
from bot.events import Number, Table
from bot.tables import answer_parts, hidden_note, parse_number, to_csv, to_markdown, unmarked

ANSWER = """Revenue by region:

| Region | Revenue | Share |
|:--|--:|--:|
| North | 1,234.50 | 12% |
| **South** | $99 | 3% |

```
| not | a table |
|-----|---------|
```
That is all."""


def test_an_answer_is_cut_into_its_prose_and_its_tables_in_order() -> None:
    parts = answer_parts(ANSWER)
    assert [type(p).__name__ for p in parts] == ["str", "Table", "str"]
    before, table, after = parts
    assert before == "Revenue by region:\n"
    assert isinstance(table, Table) and isinstance(after, str)
    assert table.header == ("Region", "Revenue", "Share") and table.aligns == ("left", "right", "right")
    assert table.rows[0] == ("North", Number(1234.5, "1,234.50"), Number(12.0, "12%"))
    assert table.rows[1] == ("**South**", Number(99.0, "$99"), Number(3.0, "3%"))
    assert after.startswith("\n```\n| not | a table |")  # a table in a code block stays prose
    assert answer_parts("no table here") == ["no table here"]


@pytest.mark.parametrize(
    ("text", "value"),
    [("1,234.5", 1234.5), ("-3", -3.0), ("\u22127", -7.0), ("12%", 12.0), ("€4.50", 4.5), (".5", 0.5), ("1e3", 1000.0)],
)
def test_cells_that_read_as_numbers(text: str, value: float) -> None:
    assert parse_number(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1,23", "12 apples", "1.2.3", "--3", "nan", "inf", "1e999"])
def test_cells_that_do_not(text: str) -> None:
    assert parse_number(text) is None


def test_a_cell_reads_without_its_marks_and_a_link_shows_its_target() -> None:
    assert unmarked("**Total** `x|y` _note_") == "Total x|y note"
    assert unmarked("[docs](https://example.com/a)") == "docs (https://example.com/a)"


def test_markdown_again_and_csv_with_formulas_defused() -> None:
    table = Table(header=("a", "b|c"), rows=(("=SUM(A1)", Number(-3.0, "-3")), ("@x", "plain")))
    assert to_markdown(table).splitlines()[0] == "| a | b\\|c |"
    rows = list(csv.reader(io.StringIO(to_csv(table).decode())))
    assert rows == [["a", "b|c"], ["'=SUM(A1)", "-3"], ["'@x", "plain"]]


def test_how_much_is_not_shown() -> None:
    table = Table(header=("a",), rows=(("1",), ("2",)), total_rows=1000, total_columns=3, file="sales.csv")
    assert hidden_note(table) == "(998 more rows and 2 more columns not shown; the whole table is in sales.csv)"
    assert hidden_note(Table(header=("a",), rows=(("1",),))) == ""


# ---- the kernel's bundles -------------------------------------------------------------------

CHART: dict[str, Any] = {
    "version": 1,
    "kind": "bar",
    "title": "Revenue",
    "categories": ["N", "S"],
    "series": [{"name": "2024", "values": [1, 2.5]}, {"name": "2025", "values": [3, 4]}],
    "x_label": "region",
    "y_label": "",
}
FRAME: dict[str, Any] = {
    "version": 1,
    "name": "sales",
    "columns": ["region", "amount"],
    "rows": [["N", 1.5], ["S", None]],
    "total_rows": 1234,
    "total_columns": 2,
    "file": "tables/sales.csv",
}


def test_a_chart_bundle_is_read_as_data() -> None:
    chart = chart_from({CHART_MIME: CHART})
    assert chart is not None and chart.kind == "bar" and chart.categories == ("N", "S")
    assert [(s.name, s.values) for s in chart.series] == [("2024", (1.0, 2.5)), ("2025", (3.0, 4.0))]
    assert chart_from({"image/png": "x"}) is None


def _changed(bundle: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(bundle)
    target: Any = changed
    for step in path[:-1]:
        target = target[step]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return changed


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("version",), 2),
        (("version",), True),
        (("kind",), "scatter"),
        (("extra",), 1),
        (("x_label",), _DELETE),
        (("title",), 7),
        (("title",), "t" * 301),
        (("categories",), []),
        (("categories",), [str(n) for n in range(201)]),
        (("categories",), ["N", "N"]),
        (("series", 0, "values", 0), math.nan),
        (("series", 0, "values", 0), math.inf),
        (("series", 0, "values", 0), True),
        (("series", 0, "values", 0), "1"),
        (("series", 0, "values", 0), 10**400),
        (("series", 0, "values"), [1]),
        (("series", 1, "name"), "2024"),
        (("series", 0, "colour"), "red"),
        (("series",), [{"name": str(n), "values": [1, 2]} for n in range(21)]),
    ],
)
def test_a_chart_bundle_off_the_schema_is_refused_whole(path: tuple[Any, ...], value: Any) -> None:
    assert chart_from({CHART_MIME: _changed(CHART, path, value)}) is None


def test_a_pie_slice_of_zero_is_refused() -> None:
    pie = {**CHART, "kind": "pie", "series": [{"name": "share", "values": [1, 0]}]}
    assert chart_from({CHART_MIME: pie}) is None


def test_a_table_bundle_is_read_as_data_with_its_size_in_the_caption() -> None:
    table = table_from({TABLE_MIME: FRAME})
    assert table is not None
    assert table.header == ("region", "amount") and table.rows == (("N", Number(1.5, "1.5")), ("S", ""))
    assert table.caption == "sales (1,234 rows × 2 columns)" and table.file == "sales.csv"
    assert table.total_rows == 1234


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("file",), "../../etc/passwd"),
        (("file",), "tables/a b.csv"),
        (("rows", 0), ["N"]),
        (("rows",), [["x", 1]] * 101),
        (("columns",), [str(n) for n in range(21)]),
        (("rows", 0, 1), math.nan),
        (("rows", 0, 1), {"x": 1}),
        (("total_rows",), 1),
        (("total_rows",), 1.5),
        (("name",), ""),
        (("rows", 0, 0), "x" * 201),
    ],
)
def test_a_table_bundle_off_the_schema_is_refused_whole(path: tuple[Any, ...], value: Any) -> None:
    assert table_from({TABLE_MIME: _changed(FRAME, path, value)}) is None


def test_control_and_bidi_characters_in_kernel_text_are_shown_escaped() -> None:
    table = table_from({TABLE_MIME: _changed(FRAME, ("rows", 0, 0), "evil\u202etxt\nnext")})
    assert table is not None and table.rows[0][0] == "evil\\u202etxt\\nnext"
