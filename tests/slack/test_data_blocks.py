"""Tables and charts as Slack draws them, end to end (real bolt + slack_sdk, Core, kernels; fake
Slack checking Block Kit's limits, scripted model): a Markdown table is a table block with numbers
as numbers, a Plotly bar chart a native chart with its PNG in the same message, a DataFrame the
code showed a data table with its CSV; what Slack cannot draw goes as before, a refused block
costs nothing of the answer and is not sent again, and hostile cells stay text."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.fakes.openai_server import answer, tool_call
from tests.fakes.slack_server import FakeSlack, Message
from tests.slack.conftest import Bot, running_bot

pytestmark = pytest.mark.asyncio(loop_scope="module")

TABLE_ANSWER = """Revenue by region:

| Region | Revenue | Orders |
|---|--:|--:|
| North | 1,234.50 | 12 |
| South | 987 | 7 |

North leads."""
PLOTLY_BAR = """import plotly.express as px
fig = px.bar(x=["North", "South", "East"], y=[1234.5, 987, 40], title="Revenue by region",
             labels={"x": "region", "y": "revenue"})
fig.show()"""
MANY_BARS = """show_chart({"day": [f"d{n:02d}" for n in range(40)], "amount": list(range(40))}, x="day", y="amount",
           title="Amount by day")"""
FRAME = """import pandas as pd
sales = pd.DataFrame({"day": [f"2026-01-{n % 28 + 1:02d}" for n in range(150)], "amount": [n * 1.5 for n in range(150)]})
display_dataframe_to_user("Sales by day", sales)"""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def bot(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Bot]:
    async with running_bot(tmp_path_factory.mktemp("slack-data"), socket_mode=False) as running:
        yield running


async def ask(bot: Bot, channel: str, question: str = "how did revenue do?") -> list[Message]:
    event = bot.slack.mention(channel, question)
    await bot.slack.post_event(bot.events_url, event)
    assert await bot.finished(event) == {"white_check_mark"}
    return bot.slack.bot_messages(channel, event["ts"])


def blocks_of(messages: list[Message], kind: str) -> list[dict[str, Any]]:
    return [b for m in messages for b in m.blocks or [] if b.get("type") == kind]


def cells(block: dict[str, Any]) -> list[list[Any]]:
    """A table's rows as the values its cells carry (numbers as numbers)."""
    return [[c.get("value", c.get("text")) for c in row] for row in block["rows"]]


async def test_a_markdown_table_is_a_table_block_with_numbers_as_numbers_between_its_prose(bot: Bot) -> None:
    bot.llm.script(answer(TABLE_ANSWER))
    messages = await ask(bot, "C_TABLE")
    [table] = blocks_of(messages, "table")
    assert cells(table) == [["Region", "Revenue", "Orders"], ["North", 1234.5, 12.0], ["South", 987.0, 7.0]]
    assert table["rows"][1][1] == {"type": "raw_number", "value": 1234.5, "text": "1,234.50"}
    # The prose before it is in the table's message, above it; the prose after it comes next, with 👍/👎.
    texts = [m.text for m in messages if m.text]
    [with_table] = [m for m in messages if m.blocks and table in m.blocks]
    assert with_table.blocks is not None and with_table.blocks[0]["text"]["text"] == "Revenue by region:"
    assert texts.index("North leads.") > messages.index(with_table)
    assert blocks_of([messages[-1]], "context_actions")
    assert "```" not in json.dumps([m.text for m in messages])  # not a code block as well
    assert bot.slack.refused_blocks == []


async def test_a_plotly_bar_chart_is_a_native_bar_chart_with_its_png_in_the_same_message(bot: Bot) -> None:
    bot.llm.script(tool_call(PLOTLY_BAR), answer("North sells the most."))
    messages = await ask(bot, "C_PLOTLY", "chart revenue by region")
    [chart] = blocks_of(messages, "data_visualization")
    assert chart["title"] == "Revenue by region"
    assert chart["chart"]["type"] == "bar"
    assert chart["chart"]["axis_config"]["categories"] == ["North", "South", "East"]
    assert [p["value"] for p in chart["chart"]["series"][0]["data"]] == [1234.5, 987.0, 40.0]
    [message] = [m for m in messages if m.blocks and chart in m.blocks]
    assert message.text == "North sells the most." and message.files  # the answer, its chart and its picture
    [png] = [u for u in bot.slack.uploads if u.file_id in message.files]
    assert png.data.startswith(b"\x89PNG")
    assert bot.slack.refused_blocks == []


async def test_a_chart_of_40_categories_is_its_picture_alone_and_nothing_is_refused(bot: Bot) -> None:
    bot.llm.script(tool_call(MANY_BARS), answer("Forty days."))
    messages = await ask(bot, "C_MANY", "chart every day")
    assert blocks_of(messages, "data_visualization") == []
    [message] = [m for m in messages if m.text == "Forty days."]
    assert [u for u in bot.slack.uploads if u.file_id in message.files and u.data.startswith(b"\x89PNG")]
    assert bot.slack.refused_blocks == []


async def test_a_dataframe_the_code_shows_is_a_data_table_with_its_whole_csv(bot: Bot) -> None:
    bot.llm.script(tool_call(FRAME), answer("Here are the sales."))
    messages = await ask(bot, "C_FRAME", "show me the sales")
    [table] = blocks_of(messages, "data_table")
    assert table["caption"] == "Sales by day (150 rows × 2 columns)"
    assert len(table["rows"]) == 101 and cells(table)[0] == ["day", "amount"] and cells(table)[2] == ["2026-01-02", 1.5]
    shown = next(m for m in messages if m.blocks and table in m.blocks)
    notes = [b["text"]["text"] for b in shown.blocks or [] if b.get("type") == "section"]
    assert notes == ["_50 more rows not shown; the whole table is attached as `Sales-by-day.csv`._"]
    [csv] = [u for u in bot.slack.uploads if u.filename == "Sales-by-day.csv"]
    assert csv.data.decode().splitlines()[0] == "day,amount" and len(csv.data.decode().splitlines()) == 151
    assert messages.index(shown) < next(i for i, m in enumerate(messages) if m.text == "Here are the sales.")
    assert bot.slack.refused_blocks == []


async def test_a_long_markdown_table_is_cut_with_a_line_and_attached_whole(bot: Bot) -> None:
    rows = "\n".join(f"| day {n:03d} | {n * 3} |" for n in range(150))
    bot.llm.script(answer(f"Every day:\n\n| Day | Amount |\n|---|---|\n{rows}\n\nDone."))
    messages = await ask(bot, "C_LONG", "list every day")
    [table] = blocks_of(messages, "data_table")
    assert len(table["rows"]) == 101 and cells(table)[100] == ["day 099", 297.0]
    assert any(
        "50 more rows not shown; the whole table is attached as `table-1.csv`" in json.dumps(m.blocks) for m in messages
    )
    [csv] = [u for u in bot.slack.uploads if u.filename == "table-1.csv" and u.channel == "C_LONG"]
    assert len(csv.data.decode().splitlines()) == 151


async def test_hostile_cells_are_shown_as_text(bot: Bot) -> None:
    hostile = (
        "| Who | Link |\n|---|---|\n| <!channel> | [click](https://evil.example) |\n| @here | <https://evil.example> |"
    )
    bot.llm.script(answer(hostile))
    messages = await ask(bot, "C_HOSTILE", "who?")
    [table] = blocks_of(messages, "table")
    posted = json.dumps([[m.text, m.blocks] for m in messages], ensure_ascii=False)
    assert "<!channel>" not in posted and "<https://evil" not in posted and "@here" not in posted
    assert cells(table)[1] == ["‹!channel›", "click (https://evil.example)"]
    assert cells(table)[2][0] == "@\u2060here"


async def test_a_refused_block_still_delivers_the_whole_answer_and_is_not_sent_again(tmp_path: Path) -> None:
    async with running_bot(tmp_path, socket_mode=False) as plain:
        slack: FakeSlack = plain.slack
        slack.refuse_blocks = {"table", "data_table"}  # not rolled out in this workspace
        for channel in ("C_NO_TABLE", "C_NO_DATA_TABLE", "C_NO_NATIVE"):
            plain.llm.script(answer(TABLE_ANSWER))
            messages = await ask(plain, channel)
            text = "\n".join(m.text for m in messages)
            assert "Revenue by region:" in text and "North leads." in text
            assert "North  | 1,234.50 |     12" in text and "```" in text  # the table as an aligned code block
            assert blocks_of(messages, "table") == blocks_of(messages, "data_table") == []
            assert blocks_of(messages, "context_actions")
        # Slack refused the table block, then the data table tried in its place; each once, and
        # the third answer tried neither.
        assert [why for _, why in slack.refused_blocks] == [
            "unsupported block type table",
            "unsupported block type data_table",
        ]
        assert slack.schema_errors == []


async def test_where_only_the_table_block_is_refused_small_tables_are_data_tables(tmp_path: Path) -> None:
    async with running_bot(tmp_path, socket_mode=False) as plain:
        plain.slack.refuse_blocks = {"table"}
        for channel in ("C_FIRST", "C_SECOND"):
            plain.llm.script(answer(TABLE_ANSWER))
            messages = await ask(plain, channel)
            assert "North leads." in "\n".join(m.text for m in messages)
        assert blocks_of(messages, "table") == [] and len(blocks_of(messages, "data_table")) == 1
        assert len(plain.slack.refused_blocks) == 1


async def test_a_streamed_answer_ends_with_its_table_block(tmp_path: Path) -> None:
    async with running_bot(tmp_path, socket_mode=False, streaming=True) as streaming:
        slack = streaming.slack
        streaming.llm.script(answer(TABLE_ANSWER, pace_s=0.05))
        messages = await ask(streaming, "C_STREAMED")
        [streamed] = [m for m in messages if m.stream_state == "stopped"]
        assert streamed.text.startswith("Revenue by region:") and "|" not in streamed.text  # the table was not drafted
        [table] = blocks_of([streamed], "table")  # chat.stopStream carried it
        assert cells(table)[1] == ["North", 1234.5, 12.0]
        after = messages[messages.index(streamed) + 1 :]
        assert [m.text for m in after] == ["North leads."] and blocks_of(after, "context_actions")
        assert slack.refused_blocks == []
