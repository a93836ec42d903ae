"""`python -m bot console` under a pseudo-terminal, as a person uses it.

The scripted model server runs in the test's event loop, so every wait on the console is
pexpect's ``async_=True`` form: a blocking ``expect`` would stall the server it waits on.
"""

from __future__ import annotations

import asyncio
import io
import os
import sqlite3
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pexpect

from tests.bot.test_console import HOSTILE, REPO, run_cli, write_config
from tests.fakes.openai_server import ScriptedOpenAI, answer, delay, error, tool_call

PROMPT = "you> "


class Console:
    """A console process on a pseudo-terminal, with everything it printed kept in ``transcript``."""

    def __init__(self, child: pexpect.spawn) -> None:
        self.child = child
        self._seen = io.StringIO()
        child.logfile_read = self._seen

    @property
    def transcript(self) -> str:
        """Everything the terminal showed so far (stdout and stderr, echoed input included)."""
        return self._seen.getvalue()

    async def expect(self, pattern: str | type[pexpect.EOF], timeout: float = 10) -> None:
        """Wait for ``pattern`` (a literal string, or ``pexpect.EOF``)."""
        if pattern is pexpect.EOF:
            await self.child.expect(pexpect.EOF, timeout=timeout, async_=True)
        else:
            await self.child.expect_exact(pattern, timeout=timeout, async_=True)

    async def exit_code(self) -> int:
        """Wait for the process to end by itself; its exit status."""
        await self.expect(pexpect.EOF)
        self.child.close()
        assert self.child.signalstatus is None, f"killed by signal {self.child.signalstatus}"
        return int(self.child.exitstatus)


@asynccontextmanager
async def console(tmp_path: Path, llm_url: str, *args: str) -> AsyncIterator[Console]:
    """Start the console on a terminal; it is killed at the end if it did not stop by itself."""
    config = write_config(tmp_path, llm_url)
    child = pexpect.spawn(
        sys.executable,
        ["-m", "bot", "console", "--config", str(config), "--out", str(tmp_path / "out"), *args],
        cwd=str(tmp_path),
        env={**os.environ, "PYTHONPATH": str(REPO)},
        encoding="utf-8",
        dimensions=(50, 250),
    )
    try:
        yield Console(child)
    finally:
        if child.isalive():
            child.terminate(force=True)
        child.close(force=True)


def turns_in_flight(tmp_path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(tmp_path / "data" / "tb.db") as db:
        return db.execute("SELECT thread, message_id FROM turns_in_flight").fetchall()


def last_user_text(llm: ScriptedOpenAI) -> str:
    return [m for m in llm.requests[-1]["messages"] if m["role"] == "user"][-1]["content"]


async def test_log_lines_go_to_the_log_file_not_between_the_answers(tmp_path: Path) -> None:
    dump = "validation error: " + "field required; " * 150  # a strict server's long complaint
    async with ScriptedOpenAI() as llm, console(tmp_path, llm.base_url) as term:
        llm.script(error(500, dump), error(500, dump))
        await term.expect(PROMPT)
        log_path = (tmp_path / "data" / "threadbook-console.log").resolve()
        assert f"Log: {log_path}" in term.transcript
        term.child.sendline("hi")
        await term.expect("server error (HTTP 500)")
        await term.expect(PROMPT)
        term.child.sendeof()  # Ctrl-D quits
        assert await term.exit_code() == 0
    shown = term.transcript
    assert "field required" not in shown and "WARNING" not in shown and "LLM request failed" not in shown
    assert "Traceback" not in shown
    assert "LLM request failed" in log_path.read_text()


async def test_ctrl_c_stops_a_long_cell_and_the_prompt_comes_back(tmp_path: Path) -> None:
    async with ScriptedOpenAI() as llm, console(tmp_path, llm.base_url) as term:
        started = tmp_path / "cell-started"
        llm.script(
            tool_call(
                f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\ntime.sleep(60)\nprint('finished')"
            )
        )
        await term.expect(PROMPT)
        term.child.sendline("count slowly")
        await term.expect("Running step 1")
        # A SIGINT that reaches ipykernel before the cell starts is ignored (and the kernel is
        # restarted after interrupt_grace_s): press Ctrl-C once the code really runs.
        for _ in range(100):
            if started.exists():
                break
            await asyncio.sleep(0.05)
        term.child.sendintr()
        await term.expect("Stopped on request")
        await term.expect(PROMPT)
        llm.script(answer("Still here."))
        term.child.sendline("are you there?")
        await term.expect("Still here.")
        await term.expect(PROMPT)
        term.child.sendeof()
        assert await term.exit_code() == 0
    assert "│ finished" not in term.transcript  # the code is shown as it runs; its last line never printed
    assert "Traceback" not in term.transcript and "restarted" not in term.transcript
    tool_results = [m for m in llm.requests[-1]["messages"] if m["role"] == "tool"]
    assert tool_results and "interrupt" in str(tool_results[-1]["content"]).lower()


async def test_ctrl_c_at_the_prompt_quits_at_once(tmp_path: Path) -> None:
    async with ScriptedOpenAI() as llm, console(tmp_path, llm.base_url) as term:
        await term.expect(PROMPT)
        term.child.sendintr()  # no Enter: the console must not wait for one
        assert await term.exit_code() == 0
    assert "Traceback" not in term.transcript and "restarted" not in term.transcript


async def test_a_second_ctrl_c_during_a_turn_quits_without_a_restart_notice(tmp_path: Path) -> None:
    async with ScriptedOpenAI() as llm, console(tmp_path, llm.base_url, "--thread", "slow") as term:
        llm.script(delay(60))  # the model never answers in time: Stop alone cannot end this turn
        await term.expect(PROMPT)
        term.child.sendline("think hard")
        await term.expect("Thinking")
        term.child.sendintr()
        await term.expect("Ctrl-C again quits")
        term.child.sendintr()
        assert await term.exit_code() == 0
    assert "Traceback" not in term.transcript and "restarted" not in term.transcript
    assert turns_in_flight(tmp_path) == []  # the next start does not report it as cut off either


async def test_a_pasted_block_between_triple_quotes_is_one_message(tmp_path: Path) -> None:
    async with ScriptedOpenAI() as llm, console(tmp_path, llm.base_url) as term:
        llm.script(answer("Got the block."))
        await term.expect(PROMPT)
        assert '"""' in term.transcript  # the banner says how
        term.child.send('"""\nwhat does this do?\n\n    def f(x):\n        return x * 2\n"""\n')  # one paste
        await term.expect("Got the block.")
        await term.expect(PROMPT)
        term.child.sendeof()
        assert await term.exit_code() == 0
    assert len(llm.requests) == 1
    assert last_user_text(llm) == "what does this do?\n\n    def f(x):\n        return x * 2"


async def test_an_unreachable_model_is_named_by_its_url(tmp_path: Path) -> None:
    url = "http://127.0.0.1:1/v1"  # nothing listens on port 1
    async with console(tmp_path, url) as term:
        await term.expect(PROMPT)
        term.child.sendline("hi")
        await term.expect(f"The language model at {url} could not be reached")
        await term.expect(PROMPT)
        term.child.sendeof()
        assert await term.exit_code() == 0


async def test_a_block_through_a_pipe_and_no_log_file_there(tmp_path: Path) -> None:
    async with ScriptedOpenAI() as llm:
        llm.script(answer("One message."))
        config = write_config(tmp_path, llm.base_url)
        code, out, err = await run_cli(
            "console",
            "--config",
            str(config),
            "--out",
            str(tmp_path / "out"),
            stdin='"""\nline one\nline two\n"""\n',
            cwd=tmp_path,
        )
    assert code == 0, err
    assert out.strip() == "One message."  # stdout holds answers only
    assert last_user_text(llm) == "line one\nline two"
    assert not (tmp_path / "data" / "threadbook-console.log").exists()


async def test_on_a_terminal_no_sequence_from_a_kernel_or_model_reaches_the_screen(tmp_path: Path) -> None:
    """The hostile answer and live output of the pipe test, on a terminal: the console's own
    colours aside, none of their sequences (clipboard, hyperlink, title, screen clear) is written."""
    async with ScriptedOpenAI() as llm, console(tmp_path, llm.base_url) as term:
        printed = f"print(bytes.fromhex({HOSTILE.encode().hex()!r}).decode())"  # the code shows no sequence itself
        llm.script(tool_call(f"{printed}\nprint('done printing')"), answer(HOSTILE))
        await term.expect(PROMPT)
        term.child.sendline("what is the total?")
        await term.expect("│ done printing")
        await term.expect("end")
        await term.expect(PROMPT)
        term.child.sendeof()
        assert await term.exit_code() == 0
    shown = term.transcript
    for sequence in ("\x1b]52", "\x1b]8;;https", "\x1b]0;owned", "\x1b[2J", "\x1bP+q", "\x9b", "\x9d", "\x9c"):
        assert sequence not in shown, (sequence, shown)
    assert "]52;c;" not in shown and "]0;owned" not in shown  # whole sequences left out, not shown as text
    assert "Total:" in shown and "click" in shown
