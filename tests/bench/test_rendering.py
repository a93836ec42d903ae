"""The ``rendering`` bench measures the real thing: its table and chart become blocks Slack takes
(the fake's reading of Block Kit's limits), and each mode reports its timings."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.slack.layout import NativeSupport, lay_out, pieces
from bench.rendering import MODES, chart_bundle, render_cost, table_answer
from bot.displays import CHART_MIME, chart_from
from bot.events import Reply
from tests.fakes.slack_blocks import check_blocks


def test_the_benched_table_and_chart_are_native_blocks_slack_takes() -> None:
    text = table_answer()
    support = NativeSupport()
    layout, _ = lay_out(pieces(text, support), Reply(text=text), support, [])
    [post] = [p for p in layout.posts if p.native is not None]
    assert post.native == "data_table" and len(post.blocks[-1]["rows"]) == 101
    assert check_blocks(list(post.blocks)) is None
    chart = chart_from({CHART_MIME: chart_bundle()})
    assert chart is not None and len(chart.series) == 6 and len(chart.categories) == 20


@pytest.mark.parametrize("mode", MODES)
async def test_each_mode_reports_its_timings(mode: str, tmp_path: Path) -> None:
    result = await render_cost(mode, tmp_path, 3)
    assert result["n"] == 3 and 0 < result["p50_ms"] <= result["max_ms"] and result["bytes"] > 1000
