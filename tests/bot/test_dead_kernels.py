"""A kernel that kills itself costs only its thread, end to end (issue: one dead kernel froze
every thread): the thread's reply says so once, a neighbour thread is answered, and the
thread's next message runs in a fresh kernel without hearing it again."""

from __future__ import annotations

import asyncio

import pytest

from bot.app import Core
from tests.fakes.memory import MemoryChat
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call

pytestmark = pytest.mark.timeout(90)  # a frozen event loop lets no asyncio timeout fire


async def test_a_kernel_that_kills_itself_stops_only_its_thread(core: Core, llm: ScriptedOpenAI) -> None:
    chat = MemoryChat(core.dispatcher)
    llm.script(tool_call("x = 1"), answer("x is set."))
    assert (await chat.say("set x", thread="a")).reply.ok
    llm.script(tool_call("import os\nos.kill(os.getpid(), 9)"), answer("The kernel died."))
    died = (await chat.say("crash it", thread="a", mentioned=False)).reply
    assert died.text.count("This thread's kernel stopped (killed by SIGKILL") == 1
    assert "files in the workspace are kept" in died.text

    await asyncio.sleep(1.5)  # past the after-turn save's quiet time: the save that used to spin
    llm.script(tool_call("print(1+1)"), answer("It is 2."))
    neighbour = await asyncio.wait_for(chat.say("what is 1+1?", thread="b"), 30)
    assert neighbour.reply.ok and "It is 2." in neighbour.reply.text

    llm.script(tool_call("print(x * 7)"), answer("x is back."))
    again = (await chat.say("print x", thread="a", mentioned=False)).reply
    assert again.ok and "x is back." in again.text and "kernel stopped" not in again.text
    assert "7" in next(m["content"] for m in reversed(llm.requests[-1]["messages"]) if m["role"] == "tool")
