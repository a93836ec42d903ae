"""A chart's data and a shown table, read inside the kernel (kernel-side ``threadbook_kernel``):
Plotly figures, Vega-Lite specs and ``show_chart`` gain Threadbook's chart bundle beside their
PNG; ``display_dataframe_to_user`` writes the whole frame as CSV and shows its beginning; and
what the kernel makes is exactly what the bot reads (``bot/displays.py``)."""

from __future__ import annotations

import base64
import struct
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from bot.displays import CHART_MIME, TABLE_MIME, chart_from, table_from
from bot.events import Number
from kernels import KernelPool, KernelSession, build_pool
from tests.kernels.conftest import kernel_settings

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "kernels" / "runtime"))

from threadbook_kernel.chartdata import bundle, from_plotly, from_vegalite

in_module_loop = pytest.mark.asyncio(loop_scope="module")


def typed(values: list[float]) -> dict[str, Any]:
    """A Plotly typed array, as plotly ≥ 6 writes numpy data into a figure's JSON."""
    return {"dtype": "f8", "bdata": base64.b64encode(struct.pack(f"<{len(values)}d", *values)).decode()}


def test_a_plotly_bar_figure_with_two_series_is_read_as_a_bar_chart() -> None:
    figure = {
        "data": [
            {"type": "bar", "name": "2024", "x": ["N", "S"], "y": typed([1.5, 2.0])},
            {"type": "bar", "name": "2025", "x": ["N", "E"], "y": [3, 4]},
        ],
        "layout": {"title": {"text": "Revenue"}, "xaxis": {"title": {"text": "region"}}},
    }
    chart = from_plotly(figure)
    assert chart == {
        "version": 1,
        "kind": "bar",
        "title": "Revenue",
        "categories": ["N", "S", "E"],
        "series": [{"name": "2024", "values": [1.5, 2.0, 0]}, {"name": "2025", "values": [3.0, 0, 4.0]}],
        "x_label": "region",
        "y_label": "",
    }
    parsed = chart_from({CHART_MIME: chart})  # what the kernel makes, the bot reads
    assert parsed is not None and parsed.series[1].values == (3.0, 0.0, 4.0)


@pytest.mark.parametrize(
    "trace",
    [
        {"type": "scatter", "mode": "markers", "x": [1, 2], "y": [3, 4]},  # a scatter of points
        {"type": "heatmap", "z": [[1, 2], [3, 4]]},
        {"type": "histogram", "x": [1, 2, 2]},
        {"type": "scatter", "mode": "lines", "x": ["a", "b"], "y": [1, None]},  # a gap
        {"type": "bar", "x": ["a", "a"], "y": [1, 2]},  # two bars in one place
        {"type": "pie", "labels": ["a", "b"], "values": [1, -1]},
        {"type": "scatter", "mode": "lines", "x": [1, 2, 10], "y": [1, 2, 3]},  # numbers at uneven steps
    ],
)
def test_a_figure_without_a_native_form_gets_no_chart_data(trace: dict[str, Any]) -> None:
    assert from_plotly({"data": [trace], "layout": {}}) is None


def test_line_area_and_pie_figures() -> None:
    line = from_plotly({"data": [{"type": "scatter", "mode": "lines", "x": ["a", "b"], "y": [1, 2]}], "layout": {}})
    area = from_plotly({"data": [{"type": "scatter", "stackgroup": "1", "x": ["a"], "y": [1]}], "layout": {}})
    pie = from_plotly({"data": [{"type": "pie", "labels": ["a", "b"], "values": [1, 3]}], "layout": {}})
    assert (
        (line or {}).get("kind") == "line" and (area or {}).get("kind") == "area" and (pie or {}).get("kind") == "pie"
    )


def test_vega_lite_specs_are_read_from_their_inline_rows() -> None:
    rows = [{"m": "Jan", "v": 1, "k": "a"}, {"m": "Feb", "v": 2, "k": "a"}, {"m": "Jan", "v": 5, "k": "b"}]
    spec = {
        "data": {"name": "d1"},
        "datasets": {"d1": rows},
        "mark": {"type": "line"},
        "encoding": {"x": {"field": "m", "type": "ordinal"}, "y": {"field": "v", "type": "quantitative"}},
    }
    assert from_vegalite(spec) is None  # two rows for January in one series
    grouped = {**spec, "encoding": {**spec["encoding"], "color": {"field": "k", "type": "nominal"}}}
    assert from_vegalite(grouped) is None  # series b has no February: a line with a gap
    bars = {**grouped, "mark": "bar"}
    chart = from_vegalite(bars)
    assert chart is not None and chart["series"] == [
        {"name": "a", "values": [1.0, 2.0]},
        {"name": "b", "values": [5.0, 0]},
    ]
    summed = {**spec, "encoding": {**spec["encoding"], "y": {"aggregate": "sum", "field": "v"}}}
    assert from_vegalite(summed) is None  # the renderer would compute it


def test_bundles_stay_within_the_bounds_the_bot_reads() -> None:
    assert bundle("bar", [str(n) for n in range(201)], [("s", [1] * 201)]) is None
    assert bundle("bar", ["a", "b"], [("s", [1, float("nan")])]) is None
    long = bundle("bar", ["x" * 500], [("y" * 500, [1])], title="t" * 900)
    assert long is not None and chart_from({CHART_MIME: long}) is not None


def test_a_frames_csv_defuses_formulas_in_its_header_and_in_every_column_of_text() -> None:
    import io

    import pandas as pd

    from threadbook_kernel.frames import _defused

    frame = pd.DataFrame(
        {
            '=HYPERLINK("http://x")': ["a"],
            "kind": pd.Series(["=cmd|' /c calc'!A1"]).astype("category"),
            "note": pd.Series(["@SUM(1)"], dtype="string"),
            "n": [-1],
        }
    )
    out = io.StringIO()
    _defused(frame).to_csv(out, index=False)
    header, row = out.getvalue().splitlines()
    assert header.startswith("\"'=HYPERLINK(") and row == "a,'=cmd|' /c calc'!A1,'@SUM(1),-1"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[KernelPool]:
    started = build_pool(kernel_settings(tmp_path_factory.mktemp("chart-data"), exec_timeout_s=120))
    await started.start()
    yield started
    await started.shutdown_all()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def session(pool: KernelPool) -> KernelSession:
    return await pool.get_or_start("slack:C1:chart-data")


def bundle_of(result: Any, mime: str) -> dict[str, Any]:
    assert result.ok, result.error
    [found] = [out.data[mime] for out in [*result.displays, result.result_data] if out is not None and mime in out.data]
    return found  # type: ignore[no-any-return]


@in_module_loop
async def test_a_plotly_figure_shown_carries_its_chart_data_beside_its_png(session: KernelSession) -> None:
    result = await session.execute("import plotly.express as px\npx.bar(x=['a', 'b'], y=[3, 1], title='Sales').show()")
    chart = bundle_of(result, CHART_MIME)
    assert chart["kind"] == "bar" and chart["categories"] == ["a", "b"] and chart["series"][0]["values"] == [3.0, 1.0]
    assert any(out.png() for out in result.displays)


@in_module_loop
async def test_show_chart_draws_a_png_and_carries_the_data(session: KernelSession) -> None:
    result = await session.execute(
        "show_chart({'month': ['Jan', 'Feb'], 'sold': [3, 5], 'kept': [1, 2]}, x='month', kind='line', title='Stock')"
    )
    chart = chart_from({CHART_MIME: bundle_of(result, CHART_MIME)})
    assert chart is not None and chart.kind == "line" and [s.name for s in chart.series] == ["sold", "kept"]
    assert [out.png() for out in result.displays][0].startswith(b"\x89PNG")  # type: ignore[union-attr]


@in_module_loop
async def test_a_frame_shown_to_the_user_is_saved_whole_and_shown_in_part(session: KernelSession) -> None:
    result = await session.execute(
        "import pandas as pd\n"
        "frame = pd.DataFrame({'who': ['=HYPERLINK(\"x\")'] + [f'p{n}' for n in range(149)], 'n': range(150)})\n"
        "display_dataframe_to_user('People & counts', frame)"
    )
    table = table_from({TABLE_MIME: bundle_of(result, TABLE_MIME)})
    assert table is not None and table.caption == "People & counts (150 rows × 2 columns)"
    assert len(table.rows) == 100 and table.rows[1] == ("p0", Number(1.0, "1")) and table.file == "People-counts.csv"
    assert result.changed_files == ["tables/People-counts.csv"]
    lines = (session.workspace.path / "tables" / "People-counts.csv").read_text().splitlines()
    assert lines[:2] == ["who,n", '"\'=HYPERLINK(""x"")",0'] and len(lines) == 151  # the formula defused
    assert "shown to the user: 150 rows × 2 columns" in str(result.displays[0].data["text/plain"])


@in_module_loop
async def test_the_helpers_are_hidden_names_no_snapshot_keeps(session: KernelSession) -> None:
    result = await session.execute("'show_chart' in dir(), 'show_chart' in get_ipython().user_ns_hidden")
    assert result.result == "(True, True)"
