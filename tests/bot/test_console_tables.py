"""Tables in the console: a DataFrame the code showed is printed as a table (rich on a terminal,
aligned text through a pipe) with how much is not shown, and its whole CSV is saved; a Markdown
table in an answer is drawn by rich on a terminal."""

from __future__ import annotations

import re
from pathlib import Path

from tests.bot.test_console import run_cli, write_config
from tests.bot.test_console_terminal import PROMPT, console
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call

FRAME = """import pandas as pd
sales = pd.DataFrame({"day": [f"d{n:03d}" for n in range(150)], "amount": [n * 1.5 for n in range(150)]})
display_dataframe_to_user("Sales by day", sales)"""


async def test_a_shown_frame_through_a_pipe_is_an_aligned_table_and_its_csv_is_saved(tmp_path: Path) -> None:
    async with ScriptedOpenAI() as llm:
        llm.script(tool_call(FRAME), answer("Sales listed."))
        code, out, err = await run_cli(
            "console",
            "--config",
            str(write_config(tmp_path, llm.base_url)),
            "--out",
            str(tmp_path / "out"),
            stdin="list the sales\n",
            cwd=tmp_path,
        )
    assert code == 0, err
    lines = out.splitlines()
    start = lines.index("Sales by day (150 rows × 2 columns)")
    assert lines[start + 1 : start + 4] == ["day  | amount", "-----+-------", "d000 |      0"]
    assert "(50 more rows not shown; the whole table is in Sales-by-day.csv)" in lines
    assert out.index("Sales by day") < out.index("Sales listed.")
    [saved] = [line.removeprefix("saved: ") for line in lines if line.startswith("saved: ")]
    assert saved.endswith("Sales-by-day.csv") and len(Path(saved).read_text().splitlines()) == 151


async def test_on_a_terminal_rich_draws_the_shown_frame_and_the_answers_table(tmp_path: Path) -> None:
    async with ScriptedOpenAI() as llm, console(tmp_path, llm.base_url) as term:
        llm.script(tool_call(FRAME), answer("| Region | Revenue |\n|---|--:|\n| North | 1,234 |\n\nDone."))
        await term.expect(PROMPT)
        term.child.sendline("list the sales")
        await term.expect("Done.", timeout=60)
        shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", term.transcript)  # rich's styles aside
        assert "Sales by day (150 rows × 2 columns)" in shown and "d099" in shown and "d100" not in shown
        assert "(50 more rows not shown; the whole table is in Sales-by-day.csv)" in shown
        assert "| Region |" not in shown and "Region" in shown and "1,234" in shown  # drawn, not the Markdown
