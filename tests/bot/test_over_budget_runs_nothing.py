"""Over its Python-time budget, nothing of a thread runs: no command (``export``, ``export
html``, ``status``, ``usage``, ``files``) and no refused message executes anything in the
thread's kernel. A cell of the thread installs an audit hook that notes every ``exec`` and
``eval`` its kernel runs (cells, and the user expressions of the bot's own requests); the
hook's log must not grow once the budget is spent."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bot.app import Core
from tests.bot.test_budgets import MORNING, Clock
from tests.conftest import make_settings
from tests.fakes.memory import MemoryChat
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call

HOOK_AND_SPIN = """
import os, sys, time
def _note(event, args):
    if event == "exec":
        fd = os.open("ran.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, b"x")
        os.close(fd)
sys.addaudithook(_note)
end = time.process_time() + 0.5
while time.process_time() < end:
    pass
"""


async def test_nothing_of_the_thread_runs_once_its_budget_is_spent(tmp_path: Path, llm: ScriptedOpenAI) -> None:
    clock = Clock(MORNING)
    settings = make_settings(tmp_path, llm_url=llm.base_url, limits={"kernel_seconds_per_user_day": 0.3})
    async with Core.open(settings, clock=clock) as core:
        chat = MemoryChat(core.dispatcher)
        llm.script(tool_call(HOOK_AND_SPIN), answer("spun"))
        assert "spun" in (await chat.say("spin")).reply.text
        for _ in range(100):  # the after-turn save runs in the kernel (allowed: it is bounded and counted)
            if not core.pool._saves:
                break
            await asyncio.sleep(0.05)
        ran = core.pool.workspaces.for_key(str(chat.key())).path / "ran.log"
        before = ran.read_text()
        assert before  # the hook works: the cell's own execution was noted

        refused = await chat.say("and again", mentioned=False)
        assert "🪫" in refused.replies[0].text
        for command in ("export", "export html", "status", "usage", "files"):
            out = await chat.say(command, mentioned=False)
            assert out.replies or out.notices, command
        await asyncio.sleep(1.5)  # past the quiet time of any save a command might have started
        assert ran.read_text() == before, "the thread's kernel ran code after its budget was spent"
