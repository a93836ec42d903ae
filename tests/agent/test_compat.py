"""The compatibility suite: the real loop and TurnRunner against the scripted server's
strictness modes, which reproduce what real OpenAI-compatible servers accept and refuse."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from bot.agent import CUT_OFF_NOTE, Agent, TurnResult
from bot.agent.nudge import NUDGE
from bot.app import Core
from kernels.seam.result import ExecutionResult, StreamChunk
from tests.agent.conftest import PreparedRunner, assert_valid_transcript, llm_settings
from tests.conftest import make_settings
from tests.fakes.memory import MemoryChat, bytes_attachment
from tests.fakes.openai_server import ScriptedOpenAI, Strictness, answer, error, text_tool_call, tool_call

SYSTEM = "You are a test assistant."
STRICT = Strictness(null_fields=500, tool_choice_required=True)


def printed(text: str) -> ExecutionResult:
    return ExecutionResult(streams=[StreamChunk("stdout", text)])


@pytest_asyncio.fixture
async def strict() -> AsyncIterator[ScriptedOpenAI]:
    async with ScriptedOpenAI(strict=STRICT) as server:
        yield server


@pytest_asyncio.fixture
async def agent(strict: ScriptedOpenAI) -> AsyncIterator[Agent]:
    made = Agent(llm_settings(strict, max_retries=1))
    yield made
    await made.close()


async def ask(agent: Agent, text: str, runner: PreparedRunner | None = None, **kwargs: Any) -> TurnResult:
    result = await agent.run_turn(
        history=kwargs.pop("history", []),
        user_content=text,
        runner=runner or PreparedRunner(),
        system_prompt=SYSTEM,
        **kwargs,
    )
    assert_valid_transcript(result.new_messages)
    return result


# -- the loop ---------------------------------------------------------------------------


async def test_tool_calls_and_their_replay_pass_a_null_rejecting_server(strict: ScriptedOpenAI, agent: Agent) -> None:
    strict.script(tool_call("print(2)"), answer("It is 2."), tool_call("print(3)"), answer("Now 3."))
    first = await ask(agent, "what is 1+1?", PreparedRunner(printed("2\n")))
    second = await ask(agent, "and 1+2?", PreparedRunner(printed("3\n")), history=first.new_messages)
    assert (first.text, second.text) == ("It is 2.", "Now 3.")
    assert strict.rejected == []
    # A history stored before the fix (null content beside tool calls) is accepted too.
    old = [{**m, "content": None} if m.get("tool_calls") else m for m in first.new_messages]
    strict.script(answer("still fine"))
    assert (await ask(agent, "hi", history=old)).text == "still fine"
    assert strict.rejected == []


async def test_the_wrap_up_never_asks_for_required_tools(strict: ScriptedOpenAI, agent: Agent) -> None:
    strict.script(tool_call("a()"), tool_call("b()"), answer("Half done."))
    result = await ask(agent, "go", PreparedRunner(printed("")), max_rounds=1)
    assert result.stop_reason == "max_rounds" and result.text.startswith("Half done.")
    assert strict.rejected == [] and {r.get("tool_choice") for r in strict.requests} <= {None, "none"}


@pytest.mark.parametrize("style", ["fence", "json", "tagged"])
async def test_tool_calls_written_as_text_are_run(strict: ScriptedOpenAI, agent: Agent, style: str) -> None:
    strict.script(text_tool_call("print(6 * 7)", style=style), answer("It is 42."))
    runner = PreparedRunner(printed("42\n"))
    result = await ask(agent, "what is 6*7?", runner)
    assert runner.codes == ["print(6 * 7)"] and result.text == "It is 42."
    assert "stdout:\n42" in strict.requests[1]["messages"][-1]["content"]


async def test_json_in_prose_is_not_run(strict: ScriptedOpenAI, agent: Agent) -> None:
    strict.script(answer('Send {"name": "python", "arguments": {"code": "1"}} to the API.'))
    runner = PreparedRunner()
    result = await ask(agent, "how do I call it?", runner)
    assert result.ok and runner.codes == []


async def test_sparse_replies_without_usage() -> None:
    async with ScriptedOpenAI(strict=Strictness(sparse=True, omit_usage=True, null_fields=400)) as server:
        agent = Agent(llm_settings(server))
        try:
            server.script(tool_call("print(1)"), answer("one"))
            result = await ask(agent, "count it", PreparedRunner(printed("1\n")))
        finally:
            await agent.close()
    assert result.text == "one" and server.rejected == []
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (0, 0)


async def test_a_failed_request_leaves_nothing_to_store(strict: ScriptedOpenAI, agent: Agent) -> None:
    strict.script(tool_call("print(1)"), error(500), error(500))
    runner = PreparedRunner(printed("1\n"))
    result = await ask(agent, "go", runner)
    assert result.stop_reason == "llm_error" and result.new_messages == []
    assert result.text == result.notice == "The language model had a server error (HTTP 500); please try again."
    assert runner.codes == ["print(1)"]  # the code did run (the runner keeps its cell); the exchange is not kept


def long_history(exchanges: int, size: int = 400) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = []
    for n in range(exchanges):
        call = {"id": f"c{n}", "type": "function", "function": {"name": "python", "arguments": '{"code": "x"}'}}
        history += [
            {"role": "user", "content": f"question {n} " + "u" * size},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": "o" * size},
            {"role": "assistant", "content": f"answer {n}"},
        ]
    return history


@pytest.mark.parametrize("style", ["openai", "vllm", "llamacpp", "llama-cpp-python", "ollama", "litellm"])
async def test_context_length_refusal_shrinks_the_history_and_retries_once(
    strict: ScriptedOpenAI, agent: Agent, style: str
) -> None:
    history = long_history(10)
    strict.strict = Strictness(context_chars=4000, context_style=style)
    strict.script(answer("short enough now"))
    result = await ask(agent, "latest question", history=history)
    assert result.text == "short enough now" and result.shrunk
    assert len(strict.rejected) == 1 and len(strict.requests) == 2
    sent = strict.requests[1]["messages"]
    assert_valid_transcript(sent[1:])
    assert sent[1]["role"] == "user" and "question 9" in json.dumps(sent)  # newest kept, whole exchanges
    assert "question 0 " not in json.dumps(sent)


async def test_context_length_refusal_twice_fails_cleanly(strict: ScriptedOpenAI, agent: Agent) -> None:
    strict.strict = Strictness(context_chars=100)
    strict.script(answer("never"))
    result = await ask(agent, "q" * 200, history=long_history(3))
    assert result.stop_reason == "llm_error" and result.new_messages == []
    assert "HTTP 400" in result.text and len(strict.requests) == 2  # one retry, not more
    assert strict.remaining == 1


async def test_cut_off_answer_gets_a_note(strict: ScriptedOpenAI, agent: Agent) -> None:
    strict.script(answer("The answer is that the sales gr", finish_reason="length"))
    result = await ask(agent, "explain")
    assert result.ok and result.text == f"The answer is that the sales gr\n\n{CUT_OFF_NOTE}"
    assert result.notice == CUT_OFF_NOTE
    assert result.new_messages[-1] == {"role": "assistant", "content": "The answer is that the sales gr"}


async def test_nudge_once_for_a_data_question_answered_without_code(strict: ScriptedOpenAI, agent: Agent) -> None:
    strict.script(
        answer("The total is 600."), tool_call("print(df.amount.sum())"), answer("The total is 600 (computed).")
    )
    runner = PreparedRunner(printed("600\n"))
    result = await ask(agent, "what is the total amount in sales.csv?", runner)
    assert result.nudged and result.text == "The total is 600 (computed)." and runner.codes
    assert strict.requests[1]["messages"][-1] == {"role": "user", "content": NUDGE}
    # The refused answer and the nudge were for that request only: the stored transcript shows the tool use.
    assert [m["role"] for m in result.new_messages] == ["user", "assistant", "tool", "assistant"]
    assert NUDGE not in json.dumps(result.new_messages)


async def test_nudge_never_twice(strict: ScriptedOpenAI, agent: Agent) -> None:
    strict.script(answer("I can't access files."), answer("I still cannot access files."))
    result = await ask(agent, "average of the amount column?")
    assert result.nudged and result.text == "I still cannot access files." and len(strict.requests) == 2


@pytest.mark.parametrize("text", ["hi", "thanks"])
async def test_no_nudge_for_chit_chat(strict: ScriptedOpenAI, agent: Agent, text: str) -> None:
    strict.script(answer("Hello! I can't wait to help: ask me 1 thing."))
    result = await ask(agent, text)
    assert not result.nudged and len(strict.requests) == 1


# -- the turn runner, end to end ---------------------------------------------------------


@pytest_asyncio.fixture
async def core(tmp_path: Path, strict: ScriptedOpenAI) -> AsyncIterator[Core]:
    async with Core.open(make_settings(tmp_path, llm_url=strict.base_url, llm={"max_retries": 1})) as running:
        yield running


async def test_thread_stays_usable_after_a_500(strict: ScriptedOpenAI, core: Core) -> None:
    chat = MemoryChat(core.dispatcher)
    key = chat.key()
    strict.script(tool_call("x = 41 + 1\nprint(x)"), answer("x is 42."))
    assert (await chat.say("compute x")).reply.text == "x is 42."
    stored = await core.store.transcripts.history(key)

    strict.script(tool_call("print(x)"), error(500), error(500))
    failed = (await chat.say("print x again", mentioned=False)).reply
    assert not failed.ok and "HTTP 500" in failed.text
    assert await core.store.transcripts.history(key) == stored  # nothing of the failed turn, not even its question

    strict.script(answer("hello again"))
    assert (await chat.say("hi", mentioned=False)).reply.text == "hello again"
    sent = json.dumps(strict.requests[-1]["messages"])
    assert "HTTP 500" not in sent and "print x again" not in sent and strict.rejected == []


async def test_notices_are_stored_but_never_replayed(strict: ScriptedOpenAI, core: Core) -> None:
    chat = MemoryChat(core.dispatcher)
    strict.script(answer("Sales grew, and the reason is", finish_reason="length"))
    reply = (await chat.say("why did sales grow?")).reply
    assert reply.text.endswith("(answer cut off at the length limit)_")
    timeline = await core.store.transcripts.timeline(chat.key())
    assert [e.role for e in timeline] == ["user", "assistant", "notice"]  # type: ignore[union-attr]

    strict.script(answer("ok"))
    await chat.say("go on", mentioned=False)
    assert "cut off" not in json.dumps(strict.requests[-1]["messages"])


async def test_thread_stays_usable_after_a_context_length_400(strict: ScriptedOpenAI, core: Core) -> None:
    chat = MemoryChat(core.dispatcher)
    for n in range(6):
        strict.script(answer(f"answer {n} " + "a" * 300))
        await chat.say(f"question {n} " + "q" * 300, mentioned=n == 0)
    strict.strict = Strictness(null_fields=500, context_chars=2500, context_style="llamacpp")
    strict.script(answer("fits now"))
    assert (await chat.say("latest", mentioned=False)).reply.text == "fits now"
    assert len(strict.rejected) == 1
    strict.script(answer("and again"))
    assert (await chat.say("next", mentioned=False)).reply.text == "and again"
    assert len(strict.rejected) == 1  # the budget that fitted is kept for the model: no second refusal


async def test_attached_file_question_is_nudged_once(strict: ScriptedOpenAI, core: Core) -> None:
    chat = MemoryChat(core.dispatcher)
    strict.script(
        answer("I'm unable to open attachments."),
        tool_call("import pandas as pd\nprint(pd.read_csv('sales.csv').amount.sum())"),
        lambda body: answer("Total: " + body["messages"][-1]["content"]),
    )
    csv = bytes_attachment("sales.csv", b"month,amount\nJan,100\nFeb,200\n")
    reply = (await chat.say("look at this", attachments=[csv])).reply
    assert "300" in reply.text and NUDGE in json.dumps(strict.requests[1]["messages"])
    assert NUDGE not in json.dumps(await core.store.transcripts.history(chat.key()))
