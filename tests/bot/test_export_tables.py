"""Tables in the exports: a Markdown table in an answer and a DataFrame the code showed stay
tables in the notebook (``export``) and on the web page (``export html``)."""

from __future__ import annotations

import json

from bot.app import Core
from bot.displays import TABLE_MIME
from tests.bot.test_export_html import assert_self_contained, parse
from tests.fakes.memory import MemoryChat
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call

TABLE_ANSWER = "By region:\n\n| Region | Revenue |\n|---|--:|\n| North | 1,234.50 |\n| South | 987 |\n\nNorth leads."
FRAME = (
    "import pandas as pd\n"
    "display_dataframe_to_user('Orders', pd.DataFrame({'region': ['west', 'east'], 'orders': [12, 7]}))"
)


async def test_both_exports_keep_answer_tables_and_shown_frames_as_tables(llm: ScriptedOpenAI, core: Core) -> None:
    chat = MemoryChat(core.dispatcher)
    llm.script(tool_call(FRAME), answer(TABLE_ANSWER))
    await chat.say("revenue and orders by region")
    notebook = json.loads((await chat.say("export", mentioned=False)).reply.files[0].open_reader().read())
    markdown = ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "markdown"]
    assert any("| North | 1,234.50 |" in m for m in markdown)  # the answer's table, as written
    [shown] = [o for c in notebook["cells"] for o in c.get("outputs", []) if TABLE_MIME in o.get("data", {})]
    assert shown["data"][TABLE_MIME]["rows"] == [["west", 12], ["east", 7]] and "<table" in "".join(
        shown["data"]["text/html"]
    )

    page = parse((await chat.say("export html", mentioned=False)).reply.files[0].open_reader().read())
    assert_self_contained(page)
    cells = [text.strip() for text in page.text if text.strip()]
    assert len(page.named("table")) == 2  # the frame shown, then the answer's table
    for cell in ("Region", "North", "1,234.50", "west", "12"):
        assert cell in cells
