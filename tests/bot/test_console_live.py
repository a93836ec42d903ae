"""The console on a terminal, as a person enjoys it: the code and its output while it runs,
Markdown rendered, history kept per thread, each thread's files in their own folder, the name
to resume printed on exit, and ``--quiet``. Driven through a pseudo-terminal."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pexpect

from tests.bot.test_console import REPO
from tests.bot.test_console_terminal import PROMPT, console, last_user_text
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call

TICKING = """# Tick six times
import time
for i in range(6):
    print(f"tick {i}", flush=True)
    time.sleep(0.5)
open("ticks.txt", "w").write("6 ticks")
"""
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def plain(text: str) -> str:
    """What the terminal shows, colours and cursor moves left out."""
    return ANSI.sub("", text)


async def test_the_code_and_its_output_show_while_it_runs_and_the_answer_is_rendered(tmp_path: Path) -> None:
    async with ScriptedOpenAI() as llm, console(tmp_path, llm.base_url, "--thread", "ticks") as term:
        llm.script(tool_call(TICKING), answer("**Six** ticks, saved in `ticks.txt`."))
        await term.expect(PROMPT)
        term.child.sendline("tick for me")
        await term.expect("Running step 1: Tick six times")
        await term.expect("range")  # the code (highlighted), as it starts
        await term.expect("│ tick 2")  # its output, line by line, while it runs
        shown_while_running = plain(term.transcript)
        await term.expect("ticks, saved in")
        await term.expect(PROMPT)
        # The next turn's steps count from 1 again, and show their code and output too.
        llm.script(tool_call("# Once more\nprint('again')"), answer("Done again."))
        term.child.sendline("once more")
        await term.expect("Running step 1: Once more")
        await term.expect("│ again")
        await term.expect("Done again.")
        await term.expect(PROMPT)
        term.child.sendeof()
        await term.expect("Resume this thread with: python -m bot console --thread ticks")
        assert await term.exit_code() == 0
    shown = plain(term.transcript)
    assert "Six ticks" not in shown_while_running  # the lines came before the answer
    assert [n for n in range(6) if f"│ tick {n}" in shown] == list(range(6))
    assert 'print(f"tick {i}", flush=True)' in shown
    assert "**Six**" not in shown and "Six ticks, saved in" in shown  # Markdown rendered, not raw
    # Searched, not taken from line starts: prompt_toolkit writes printed lines from its own
    # thread, so a prompt drawn meanwhile is erased by moving the cursor back over it (the
    # stream holds "you> " then "saved: …" on one line; the terminal shows them right).
    saved = re.findall(r"saved: (\S+)", shown)
    assert [Path(p).parent for p in saved] == [tmp_path / "out" / "ticks"]  # the thread's own folder
    assert Path(saved[0]).read_text() == "6 ticks"


async def test_history_is_kept_per_thread_and_up_arrow_brings_it_back(tmp_path: Path) -> None:
    async with ScriptedOpenAI() as llm:
        async with console(tmp_path, llm.base_url, "--thread", "remember") as term:
            llm.script(answer("First."))
            await term.expect(PROMPT)
            term.child.sendline("what is in the first file?")
            await term.expect("First.")
            await term.expect(PROMPT)
            term.child.sendeof()
            assert await term.exit_code() == 0
        assert "what is in the first file?" in (tmp_path / "out" / "remember" / ".history").read_text()

        async with console(tmp_path, llm.base_url, "--thread", "remember") as term:
            llm.script(answer("Again."))
            await term.expect(PROMPT)
            term.child.send("\x1b[A")  # up arrow: the last line of this thread, editable
            term.child.send("\r")
            await term.expect("Again.")
            await term.expect(PROMPT)
            term.child.sendeof()
            assert await term.exit_code() == 0
        assert last_user_text(llm) == "what is in the first file?"
        assert "^[[A" not in term.transcript

        async with console(tmp_path, llm.base_url, "--thread", "other") as term:
            await term.expect(PROMPT)
            term.child.sendeof()
            assert await term.exit_code() == 0
        assert not (tmp_path / "out" / "other" / ".history").read_text().strip()  # another thread, its own history


async def test_quiet_shows_one_line_per_step_and_no_code(tmp_path: Path) -> None:
    async with ScriptedOpenAI() as llm, console(tmp_path, llm.base_url, "--quiet") as term:
        llm.script(tool_call(TICKING), answer("Done."))
        await term.expect(PROMPT)
        term.child.sendline("tick quietly")
        await term.expect("Running step 1: Tick six times")
        await term.expect("Done.")
        await term.expect(PROMPT)
        term.child.sendeof()
        assert await term.exit_code() == 0
    shown = plain(term.transcript)
    assert "range(6)" not in shown and "│ tick" not in shown
    assert shown.count("Running step 1") == 1  # not a line per second


SCRIPT = """
import asyncio, sys
from adapters.console_terminal import Terminal

async def main():
    terminal = Terminal(sys.stdin, sys.stdout, history=None, show_code=True)
    with terminal.attached():
        async def scheduled():
            await asyncio.sleep(1.5)  # while the person is typing
            terminal.markdown("**Scheduled run:** revenue is up.")
        task = asyncio.create_task(scheduled())
        line = await terminal.read("you> ")
        await task
    print("READ:" + repr(line))

asyncio.run(main())
"""


async def test_what_is_printed_while_someone_types_goes_above_the_prompt(tmp_path: Path) -> None:
    """A scheduled run's answer arrives while a line is half typed: it is printed above the prompt,
    and the line goes on where it was."""
    child = pexpect.spawn(
        sys.executable,
        ["-c", SCRIPT],
        cwd=str(tmp_path),
        env={**os.environ, "PYTHONPATH": str(REPO)},
        encoding="utf-8",
        dimensions=(50, 250),
    )
    try:
        await child.expect_exact(PROMPT, timeout=10, async_=True)
        child.send("half ")
        await child.expect_exact("revenue is up.", timeout=10, async_=True)
        await child.expect_exact(
            "you> \x1b[0mhalf", timeout=10, async_=True
        )  # the prompt and what was typed, redrawn below it
        child.send("typed\r")
        await child.expect_exact("READ:'half typed'", timeout=10, async_=True)
    finally:
        child.close(force=True)
