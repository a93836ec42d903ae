"""Answers laid out with Discord's components v2, and tables the code showed, end to end (real
discord.py against the fake Discord, which checks components-v2 payloads; the real Core and
kernels; scripted model): an answer with a chart and a file is one container message; where
Discord refuses the flag, answers go out as before and v2 is not tried again."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from adapters.discord import DiscordAdapter, render
from adapters.discord.layout import shown_table
from bot.app import Core
from bot.events import Table
from tests.conftest import make_settings
from tests.discord.conftest import running_adapter
from tests.fakes.discord_components import attachments_of
from tests.fakes.discord_server import USER_ID, FakeDiscord, Sent
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call

in_module_loop = pytest.mark.asyncio(loop_scope="module")  # the async tests share the world fixture's loop

CHART_AND_FILE = (
    "import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [3, 1])\nplt.show()\n"
    "open('summary.csv', 'w').write('k,v\\na,3\\nb,1\\n')"
)
FRAME = """import pandas as pd
sales = pd.DataFrame({"day": [f"d{n:03d}" for n in range(150)], "amount": [n * 1.5 for n in range(150)]})
display_dataframe_to_user("Sales by day", sales)"""


@dataclass
class World:
    discord: FakeDiscord
    llm: ScriptedOpenAI
    core: Core
    adapter: DiscordAdapter

    async def ask(self, text: str) -> list[Sent]:
        """Mention the bot; the messages it posted in the thread once the turn is done."""
        message = await self.discord.user_message(text, mention_bot=True)
        thread_id = int((await self.discord.wait_for_thread(message["id"]))["id"])
        mid = int(message["id"])
        await self.discord.wait_until(
            lambda: next((e for (_, m, e) in self.discord.reactions if m == mid and e in "✅❌"), None), 30
        )
        return [s for s in self.discord.sent[thread_id] if not s.content.startswith(("✅", "⏳"))]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    tmp_path: Path = tmp_path_factory.mktemp("discord-v2")
    async with FakeDiscord() as fake, ScriptedOpenAI() as llm:
        settings = make_settings(
            tmp_path,
            llm_url=llm.base_url,
            discord={"token": fake.token, "api_url": fake.api_url, "gateway_url": fake.gateway_url},
            access={"allow_users": [str(USER_ID)]},
        )
        async with running_adapter(settings) as (core, adapter):
            yield World(fake, llm, core, adapter)


def component_types(components: list[dict[str, Any]]) -> list[Any]:
    return [[c["type"], component_types(c.get("components") or [])] for c in components]


@in_module_loop
async def test_an_answer_with_a_chart_and_a_file_is_one_container_message(world: World) -> None:
    world.llm.script(tool_call(CHART_AND_FILE), answer("Here is the **chart** and the file."))
    [reply] = await world.ask("chart it and save a summary")
    assert reply.v2 and reply.content == ""
    # A container of the text, a gallery of the chart and the file; 👍/👎 in an action row under it.
    assert component_types(reply.components) == [[17, [[10, []], [12, []], [13, []]]], [1, [[2, []], [2, []]]]]
    assert reply.text == "Here is the **chart** and the file."
    assert attachments_of(reply.components) == [(12, "figure-1.png"), (13, "summary.csv")]
    assert sorted(f.name for f in reply.files) == ["figure-1.png", "summary.csv"]
    assert len(reply.custom_ids) == 2
    assert world.discord.schema_errors == []


@in_module_loop
async def test_a_dataframe_the_code_shows_comes_first_as_an_aligned_table_with_its_csv(world: World) -> None:
    world.llm.script(tool_call(FRAME), answer("Sales listed."))
    shown, reply = await world.ask("list the sales")
    assert shown.content.startswith(
        "📋 `Sales by day (150 rows × 2 columns)`\n```\nday  | amount\n-----+-------\nd000 |      0"
    )
    assert len(shown.content) <= 2000
    assert shown.content.endswith("not shown; the whole table is in Sales-by-day.csv)_")
    assert reply.text == "Sales listed." and [f.name for f in reply.files] == ["Sales-by-day.csv"]


@in_module_loop
async def test_where_discord_refuses_components_v2_answers_go_out_as_before(world: World) -> None:
    fake = world.discord
    fake.refuse_components_v2 = True
    try:
        for question in ("chart it once", "chart it twice"):
            before = len(fake.message_requests)
            world.llm.script(tool_call(CHART_AND_FILE), answer("Here is the **chart** and the file."))
            [reply] = await world.ask(question)
            assert not reply.v2 and reply.content == "Here is the **chart** and the file."
            assert sorted(f.name for f in reply.files) == ["figure-1.png", "summary.csv"] and len(reply.custom_ids) == 2
            tried = [body for _, body in fake.message_requests[before:] if int(body.get("flags") or 0) & (1 << 15)]
            assert len(tried) == (1 if question == "chart it once" else 0), json.dumps(tried)[:200]  # remembered
    finally:
        fake.refuse_components_v2 = False


def test_a_shown_table_too_wide_for_a_message_keeps_its_code_block_closed() -> None:
    # Twenty header cells of 200 characters: the header alone is past 2,000 characters.
    header = tuple(f"[click {n}](https://evil.example/{n})" + "y" * 160 for n in range(20))
    table = Table(header=header, rows=(("1",) * 20,), caption="wide (1 rows × 20 columns)", total_rows=1)
    text = shown_table(table, 2000)
    assert len(text) <= 2000 and text.count("```") == 2
    assert render.text(text) == text and "](https://evil" not in text.split("```")[0] + text.split("```")[2]
