"""Slack's native data blocks from tables and charts (adapters/slack/blocks.py), checked by the
fake Slack's reading of Block Kit's limits (tests/fakes/slack_blocks.py): whatever the bot makes
of a table or a chart, Slack takes; what Slack cannot draw is left to the picture."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from adapters.slack.blocks import chart_block, plain_cell, table_block
from adapters.slack.layout import NativeSupport, lay_out
from bot.events import Chart, Number, Reply, Series, Table
from tests.fakes.slack_blocks import check_blocks


def table(rows: int, columns: int, *, cell: str = "x", total_rows: int | None = None) -> Table:
    header = tuple(f"col {c}" for c in range(columns))
    body = tuple(
        tuple(Number(float(r * c), f"{r * c:,}") if c % 2 else f"{cell}{r}" for c in range(columns))
        for r in range(rows)
    )
    return Table(header=header, rows=body, total_rows=total_rows)


def chart(kind: str = "bar", categories: int = 3, series: int = 2, *, title: str = "Revenue") -> Chart:
    names = tuple(f"cat {n}" for n in range(categories))
    return Chart(
        kind=kind,  # type: ignore[arg-type]
        title=title,
        categories=names,
        series=tuple(Series(f"s{s}", tuple(float(n + 1) for n in range(categories))) for s in range(series)),
        x_label="region",
        y_label="amount",
    )


def test_a_small_table_is_a_table_block_with_numbers_as_numbers() -> None:
    native = table_block(table(3, 2))
    assert native.kind == "table" and not native.cut
    header, first, *_ = native.block["rows"]
    assert header == [{"type": "raw_text", "text": "col 0"}, {"type": "raw_text", "text": "col 1"}]
    assert first[1] == {"type": "raw_number", "value": 0.0, "text": "0"}
    assert native.block["column_settings"][1]["align"] == "right"  # a column of numbers
    assert check_blocks([native.block]) is None


def test_a_long_table_is_a_paginated_data_table_cut_at_slacks_limits() -> None:
    native = table_block(table(250, 25))
    assert native.kind == "data_table"
    assert len(native.block["rows"]) == 101 and len(native.block["rows"][0]) == 20
    assert native.block["page_size"] == 10 and native.block["caption"].startswith("Table: col 0")
    assert (native.hidden_rows, native.hidden_columns) == (150, 5)
    assert check_blocks([native.block]) is None


def test_a_table_of_long_cells_is_cut_to_the_characters_slack_takes() -> None:
    native = table_block(table(100, 10, cell="y" * 400))
    assert native.cut and native.hidden_rows > 0
    assert check_blocks([native.block]) is None


@pytest.mark.parametrize(("rows", "columns"), list(itertools.product([0, 1, 10, 11, 99, 100, 101], [1, 2, 20, 21])))
def test_every_table_the_bot_makes_is_one_slack_takes(rows: int, columns: int) -> None:
    native = table_block(table(rows, columns))
    assert check_blocks([native.block]) is None, json.dumps(native.block)[:300]


def test_empty_and_hostile_cells_are_plain_one_line_text() -> None:
    hostile = Table(header=("", "who"), rows=(("<!channel> hi", "<https://evil.example|click> @here"),))
    cells = table_block(hostile).block["rows"]
    assert cells[0][0]["text"] == " "  # Slack wants one character
    text = json.dumps(cells)
    assert "<!channel>" not in text and "<https" not in text and "@here" not in text
    assert plain_cell("a\nb\tc") == "a b c"


def test_a_chart_within_slacks_limits_is_a_data_visualization_block() -> None:
    block = chart_block(chart(title="T" * 80))
    assert block is not None and block["type"] == "data_visualization"
    assert block["title"] == "T" * 49 + "…"  # cut to 50 characters
    assert block["chart"]["type"] == "bar"
    assert block["chart"]["axis_config"] == {
        "categories": ["cat 0", "cat 1", "cat 2"],
        "x_label": "region",
        "y_label": "amount",
    }
    assert block["chart"]["series"][0]["data"][2] == {"label": "cat 2", "value": 3.0}
    assert check_blocks([block]) is None


@pytest.mark.parametrize(
    "made",
    [
        chart(categories=40),
        chart(categories=21),
        chart(series=7),
        chart(series=9),
        chart("pie", categories=7, series=1),
        Chart("bar", "t", ("a" * 25 + "1", "a" * 25 + "2"), (Series("s", (1.0, 2.0)),)),  # apart only past 20
        Chart("pie", "t", ("a", "b"), (Series("s", (1.0, -2.0)),)),
    ],
)
def test_a_chart_past_slacks_limits_is_left_to_its_picture(made: Chart) -> None:
    assert chart_block(made) is None


@pytest.mark.parametrize(
    ("kind", "categories", "series"),
    [("pie", 1, 1), ("pie", 6, 1), ("line", 20, 6), ("area", 1, 1), ("bar", 20, 1)],
)
def test_every_chart_the_bot_makes_is_one_slack_takes(kind: str, categories: int, series: int) -> None:
    block = chart_block(chart(kind, categories, series))
    assert block is not None and check_blocks([block]) is None


def test_the_fake_refuses_what_slack_refuses() -> None:
    good: dict[str, Any] = table_block(table(2, 2)).block
    assert check_blocks([good, good]) is not None  # one table a message
    assert check_blocks([{**good, "rows": [[{"type": "raw_number", "value": float("nan")}]]}]) is not None
    block = chart_block(chart())
    assert block is not None
    assert check_blocks([block, block, block]) is not None  # two charts a message
    assert check_blocks([{**block, "title": "x" * 51}]) is not None


def test_a_shown_tables_caption_and_fallback_hold_no_live_link_or_mark() -> None:
    # A frame's name and cells come from the kernel: backticks in them must not end the code
    # they are shown in, nor stop the fallback's table from being a code block.
    hostile = Table(
        header=("`x", "y`"),
        rows=(("[click](https://evil.example/b)", "<!channel> *bold*"),),
        caption="x`` [click me](https://evil.example/a) ``y (1 rows × 2 columns)",
        total_rows=1,
        total_columns=2,
        file="x.csv",
    )
    refused = NativeSupport()
    refused.refuse("data_table", "invalid_blocks")
    [native] = lay_out([], Reply(text="", tables=(hostile,)), NativeSupport(), [])[0].posts
    [fallback] = lay_out([], Reply(text="", tables=(hostile,)), refused, [])[0].posts
    for text in [native.text.text, *(t.text for t in fallback.fallback_texts())]:
        assert "<https://evil" not in text and "<!channel>" not in text and "*bold*" not in text.split("```")[0]
    assert "[click](https://evil.example/b) | &lt;!channel&gt; *bold*" in fallback.fallback_texts()[0].text


def test_rows_and_cells_the_block_leaves_out_or_cuts_make_the_table_cut() -> None:
    # Cut means a note and the whole table as CSV: nothing of the answer may go unsaid.
    wide_header = Table(header=tuple(f"{'h' * 499}{n % 10}" for n in range(20)), rows=(("1",) * 20,))
    native = table_block(wide_header)  # the header takes every character: no row fits
    assert native.cut and native.hidden_rows == 1 and check_blocks([native.block]) is None
    long_cell = table_block(Table(header=("a",), rows=(("z" * 900,),)))
    assert long_cell.cut and long_cell.cut_cells == 1 and long_cell.hidden_rows == 0
    assert not table_block(Table(header=("a",), rows=(("z" * 500,),))).cut
