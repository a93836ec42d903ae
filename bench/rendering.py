"""The ``rendering`` scenario: what drawing a table or a chart natively costs the bot (issue 40).

Pure CPU in the bot's process, no kernel and no network, timed per reply:

- ``slack_table``: an answer holding a 100-row × 5-column Markdown table laid out for Slack
  (prose and table cut apart, numbers read, the ``data_table`` block, the messages as the JSON
  that goes out; the fallback text is made only when Slack refuses the block);
- ``discord_table``: the same answer for Discord (the table as an aligned code block, split into
  messages);
- ``chart``: a 6-series × 20-category chart bundle read from the kernel's display (strict
  schema check) and made into Slack's ``data_visualization`` block, as JSON.

Each mode reports p50 / p90 / max over ``samples`` runs (after a few warm-up runs).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from adapters.discord.replies import text_chunks
from adapters.slack.blocks import chart_block
from adapters.slack.layout import NativeSupport, lay_out, pieces
from bench.kernels import summary
from bot.displays import CHART_MIME, chart_from
from bot.events import Reply

MODES = ("slack_table", "discord_table", "chart")
WARM_UP = 5


def table_answer(rows: int = 100) -> str:
    """An answer with a ``rows``-row table of five columns, prose around it."""
    body = "\n".join(
        f"| 2026-01-{n % 28 + 1:02d} | region {n % 7} | {n * 37 % 1000:,} | {n * 1.25:.2f} | {n % 3 == 0} |"
        for n in range(rows)
    )
    return (
        f"Sales by day:\n\n| Day | Region | Orders | Revenue | Promo |\n|---|---|--:|--:|---|\n{body}\n\nThat is all."
    )


def chart_bundle(series: int = 6, categories: int = 20) -> dict[str, Any]:
    """A chart bundle as the kernel sends it."""
    return {
        "version": 1,
        "kind": "line",
        "title": "Revenue by month and region",
        "categories": [f"2026-{m:02d}" for m in range(1, categories + 1)],
        "series": [
            {"name": f"region {s}", "values": [float(s * 100 + m * 3.5) for m in range(categories)]}
            for s in range(series)
        ],
        "x_label": "month",
        "y_label": "revenue",
    }


def slack_table(text: str) -> int:
    """One reply with a table laid out for Slack; the bytes that would go out."""
    reply = Reply(text=text, rateable=True)
    support = NativeSupport()
    layout, _ = lay_out(pieces(text, support), reply, support, [])
    last = layout.last.text if layout.last is not None else ""
    return len(json.dumps([[post.text.text, post.blocks] for post in layout.posts])) + len(last)


def discord_table(text: str) -> int:
    """One reply with a table laid out for Discord; the characters that would go out."""
    return sum(len(chunk) for chunk in text_chunks(text))


def render_chart(bundle: dict[str, Any]) -> int:
    """One chart read and made into its Slack block; the bytes that would go out."""
    chart = chart_from({CHART_MIME: bundle})
    assert chart is not None
    block = chart_block(chart)
    assert block is not None
    return len(json.dumps(block))


async def render_cost(mode: str, root: Path, samples: int) -> dict[str, Any]:
    """Time ``samples`` renderings of one ``mode`` (``slack_table``, ``discord_table`` or ``chart``)."""
    answer, bundle = table_answer(), chart_bundle()
    modes: dict[str, Callable[[], int]] = {
        "slack_table": lambda: slack_table(answer),
        "discord_table": lambda: discord_table(answer),
        "chart": lambda: render_chart(bundle),
    }
    work = modes[mode]
    for _ in range(WARM_UP):
        work()
    times: list[float] = []
    size = 0
    for _ in range(samples):
        started = time.perf_counter()
        size = work()
        times.append(time.perf_counter() - started)
    return {**summary(times), "bytes": size}
