"""The tool loop's rules, with the real openai client against the scripted server.

Kernel behaviour is not under test here, so the runner is a double that returns prepared
``ExecutionResult`` values; ``test_agent_kernel.py`` runs the same loop on real kernels.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest_asyncio

from bot.agent import Agent, TurnResult
from bot.agent.history import FENCED_OUTPUT_HEADER, wire_messages
from kernels.seam.result import ErrorInfo, ExecutionResult, KernelError, Outcome, StreamChunk
from tests.agent.conftest import PreparedRunner, assert_valid_transcript, llm_settings
from tests.fakes.openai_server import ScriptedOpenAI, answer, error, raw_tool_call, tool_call

SYSTEM = "You are a test assistant."
MakeAgent = Callable[..., Agent]


def printed(text: str) -> ExecutionResult:
    return ExecutionResult(streams=[StreamChunk("stdout", text)])


@pytest_asyncio.fixture
async def make_agent(scripted_openai: ScriptedOpenAI) -> AsyncIterator[MakeAgent]:
    agents: list[Agent] = []

    def make(**overrides: Any) -> Agent:
        history_chars = overrides.pop("history_chars", 48_000)
        agents.append(Agent(llm_settings(scripted_openai, **overrides), history_chars=history_chars))
        return agents[-1]

    yield make
    for agent in agents:
        await agent.close()


async def turn(agent: Agent, runner: PreparedRunner, text: str = "question", **kwargs: Any) -> TurnResult:
    result = await agent.run_turn(
        history=kwargs.pop("history", []), user_content=text, runner=runner, system_prompt=SYSTEM, **kwargs
    )
    assert_valid_transcript(result.new_messages)
    if result.stop_reason == "llm_error":  # a failed request leaves nothing to store
        assert result.new_messages == [] and result.text == result.notice
        return result
    assert result.new_messages[0] == {"role": "user", "content": text}
    last = result.new_messages[-1]
    said = last["content"] if last["role"] == "assistant" and not last.get("tool_calls") else ""
    assert result.text == "\n\n".join(part for part in (said, result.notice) if part)
    # Our own notes are never stored as the model's words.
    assert not result.notice or all(result.notice not in str(m.get("content")) for m in result.new_messages)
    return result


async def test_plain_answer(scripted_openai: ScriptedOpenAI, make_agent: MakeAgent) -> None:
    scripted_openai.script(answer("Just words, no code."))
    runner = PreparedRunner()
    result = await turn(make_agent(), runner, "hi")
    assert (result.text, result.stop_reason, result.ok, runner.codes) == ("Just words, no code.", "answer", True, [])
    body = scripted_openai.requests[0]
    assert body["messages"][0] == {"role": "system", "content": SYSTEM}
    assert [t["function"]["name"] for t in body["tools"]] == ["python"]
    assert body["model"] == "fake-model"


async def test_tool_call_observation_reaches_the_model(scripted_openai: ScriptedOpenAI, make_agent: MakeAgent) -> None:
    scripted_openai.script(
        tool_call("# add them\nprint(2 + 2)"),
        lambda body: answer(f"The kernel said: {body['messages'][-1]['content']}"),
    )
    steps: list[tuple[int, str, str]] = []

    async def on_step(round_: int, label: str, code: str) -> None:
        steps.append((round_, label, code))

    runner = PreparedRunner(printed("4\n"))
    result = await turn(make_agent(), runner, on_step=on_step, model="special-model")
    assert runner.codes == ["# add them\nprint(2 + 2)"]
    assert steps == [(1, "add them", "# add them\nprint(2 + 2)")]  # the model's comment labels the step
    assert "stdout:\n4" in result.text
    assert [r.stdout for r in runner.results] == ["4\n"]  # the runner keeps the result the model saw
    assert [m["role"] for m in result.new_messages] == ["user", "assistant", "tool", "assistant"]
    assert {r["model"] for r in scripted_openai.requests} == {"special-model"}


async def test_parallel_calls_run_in_order(scripted_openai: ScriptedOpenAI, make_agent: MakeAgent) -> None:
    scripted_openai.script(tool_call("a = 1", "b = 2", "print(a + b)"), answer("3"))
    runner = PreparedRunner(printed(""), printed(""), printed("3\n"))
    result = await turn(make_agent(), runner)
    assert runner.codes == ["a = 1", "b = 2", "print(a + b)"]
    tool_messages = [m for m in scripted_openai.requests[1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == ["(ran without output)", "(ran without output)", "stdout:\n3\n"]
    assert result.stop_reason == "answer"


async def test_max_rounds_stops_with_a_note_and_a_summary(
    scripted_openai: ScriptedOpenAI, make_agent: MakeAgent
) -> None:
    scripted_openai.script(tool_call("step(1)"), tool_call("step(2)", "step(3)"), answer("Found half of it."))
    runner = PreparedRunner(printed("1\n"), printed("2\n"))
    result = await turn(make_agent(max_rounds=5), runner, max_rounds=2)
    assert runner.codes == ["step(1)", "step(2)"]  # step(3) never ran
    assert result.stop_reason == "max_rounds" and not result.ok
    assert result.text.startswith("Found half of it.")
    assert "Stopped after 2 code runs, the limit for one message" in result.text
    wrap_up = scripted_openai.requests[-1]
    assert wrap_up["tool_choice"] == "none"
    assert "limit of 2 code runs" in wrap_up["messages"][-1]["content"]
    not_run = [m for m in result.new_messages if m["role"] == "tool" and m["content"].startswith("Not run")]
    assert len(not_run) == 1
    # The wrap-up instruction is sent once, not stored as something the user said.
    assert [m for m in result.new_messages if m["role"] == "user"] == [result.new_messages[0]]


async def test_max_rounds_when_the_summary_fails(scripted_openai: ScriptedOpenAI, make_agent: MakeAgent) -> None:
    scripted_openai.script(tool_call("x"), tool_call("y"), error(401))
    result = await turn(make_agent(max_rounds=1), PreparedRunner(printed("")))
    assert result.stop_reason == "max_rounds"
    assert result.text == "_Stopped after 1 code run, the limit for one message. Reply “continue” to let me go on._"


async def test_malformed_arguments_are_reported_to_the_model(
    scripted_openai: ScriptedOpenAI, make_agent: MakeAgent
) -> None:
    scripted_openai.script(
        raw_tool_call('{"code": "print(1'), raw_tool_call("{}", name="bash"), tool_call("print(1)"), answer("1")
    )
    runner = PreparedRunner(printed("1\n"))
    result = await turn(make_agent(), runner)
    assert runner.codes == ["print(1)"]
    tool_texts = [m["content"] for m in result.new_messages if m["role"] == "tool"]
    assert tool_texts[0].startswith("Error: the tool arguments were not valid JSON")
    assert "no tool named 'bash'" in tool_texts[1]
    assert result.stop_reason == "answer"


async def test_malformed_arguments_count_as_rounds(scripted_openai: ScriptedOpenAI, make_agent: MakeAgent) -> None:
    scripted_openai.script(*[raw_tool_call("not json")] * 3, answer("gave up"))
    result = await turn(make_agent(), PreparedRunner(), max_rounds=2)
    assert result.stop_reason == "max_rounds"
    assert result.text.startswith("gave up")


async def test_fenced_python_without_tool_call_is_executed(
    scripted_openai: ScriptedOpenAI, make_agent: MakeAgent
) -> None:
    reply = "Let me compute.\n\n```python\nx = 6 * 7\n```\n\n```bash\nrm -rf /\n```\n\n```py\nprint(x)\n```\n"
    scripted_openai.script(answer(reply), answer("It is 42."))
    runner = PreparedRunner(printed("42\n"))
    result = await turn(make_agent(), runner)
    assert runner.codes == ["x = 6 * 7\n\nprint(x)"]  # both python fences, not the bash one
    feedback = scripted_openai.requests[1]["messages"][-1]
    assert feedback["role"] == "user" and feedback["content"].startswith(FENCED_OUTPUT_HEADER)
    assert "stdout:\n42" in feedback["content"]
    assert result.text == "It is 42." and result.stop_reason == "answer"


async def test_other_fences_are_just_text(scripted_openai: ScriptedOpenAI, make_agent: MakeAgent) -> None:
    scripted_openai.script(answer("Run this yourself:\n```bash\nls\n```"))
    runner = PreparedRunner()
    result = await turn(make_agent(), runner)
    assert result.text == "Run this yourself:\n```bash\nls\n```" and runner.codes == []


async def test_interrupted_ends_the_turn(scripted_openai: ScriptedOpenAI, make_agent: MakeAgent) -> None:
    scripted_openai.script(tool_call("long()", "after()"))
    runner = PreparedRunner(ExecutionResult(outcome=Outcome.INTERRUPTED))
    result = await turn(make_agent(), runner)
    assert runner.codes == ["long()"]
    assert result.stop_reason == "interrupted"
    assert result.text == "_Stopped on request after 1 code run._"
    assert scripted_openai.remaining == 0 and len(scripted_openai.requests) == 1


async def test_llm_failure_mid_turn_keeps_a_valid_transcript(
    scripted_openai: ScriptedOpenAI, make_agent: MakeAgent
) -> None:
    scripted_openai.script(tool_call("print(1)"), error(500), error(500))
    runner = PreparedRunner(printed("1\n"))
    result = await turn(make_agent(max_retries=1), runner)
    assert result.stop_reason == "llm_error"
    assert result.text == "The language model had a server error (HTTP 500); please try again."
    assert runner.codes == ["print(1)"]


async def test_kernel_failure_is_reported(scripted_openai: ScriptedOpenAI, make_agent: MakeAgent) -> None:
    class BrokenRunner(PreparedRunner):
        async def execute(self, code: str, timeout: float | None = None) -> ExecutionResult:
            raise KernelError("the kernel could not be started")

    scripted_openai.script(tool_call("print(1)"))
    result = await turn(make_agent(), BrokenRunner())
    assert result.stop_reason == "kernel_error"
    assert result.text == "The Python kernel for this thread failed: the kernel could not be started"


async def test_usage_is_summed(scripted_openai: ScriptedOpenAI, make_agent: MakeAgent) -> None:
    scripted_openai.script(tool_call("1", usage=(100, 10)), error(500), answer("done", usage=(150, 5)))
    result = await turn(make_agent(), PreparedRunner(printed("")))
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (250, 15)
    assert scripted_openai.served_usage == (250, 15)


async def test_base64_is_stripped_from_the_answer(scripted_openai: ScriptedOpenAI, make_agent: MakeAgent) -> None:
    blob = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
    scripted_openai.script(answer(f"Here: ![chart](data:image/png;base64,{blob}) and data:image/png;base64,{blob}"))
    result = await turn(make_agent(), PreparedRunner())
    assert blob not in result.text and "base64" not in result.text
    assert result.text == "Here: [image omitted] and [data omitted]"


async def test_error_result_goes_back_to_the_model(scripted_openai: ScriptedOpenAI, make_agent: MakeAgent) -> None:
    failing = ExecutionResult(
        outcome=Outcome.ERROR,
        error=ErrorInfo("ZeroDivisionError", "division by zero", "Cell In[1], line 1\n----> 1 1/0"),
    )
    scripted_openai.script(tool_call("1/0"), tool_call("1/1"), answer("1.0"))
    result = await turn(make_agent(), PreparedRunner(failing, printed("1.0\n")))
    observation = scripted_openai.requests[1]["messages"][-1]["content"]
    assert "Error: ZeroDivisionError: division by zero" in observation and "----> 1 1/0" in observation
    assert result.ok


async def test_history_is_replayed_and_trimmed(scripted_openai: ScriptedOpenAI, make_agent: MakeAgent) -> None:
    arguments = json.dumps({"code": "x" * 500})
    old_call = {"id": "call_old", "type": "function", "function": {"name": "python", "arguments": arguments}}
    history = [
        {"role": "user", "content": "first question " + "a" * 400},
        {"role": "assistant", "content": None, "tool_calls": [old_call]},
        {"role": "tool", "tool_call_id": "call_old", "content": "big output " + "b" * 400},
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": "second question"},
        {"role": "assistant", "content": "second answer"},
    ]
    scripted_openai.script(answer("third answer"), answer("again"))
    await turn(make_agent(history_chars=300), PreparedRunner(), "third question", history=history)
    sent = scripted_openai.requests[0]["messages"]
    assert [m["content"] for m in sent] == [SYSTEM, "second question", "second answer", "third question"]

    await turn(make_agent(), PreparedRunner(), "third question", history=history)
    assert scripted_openai.requests[1]["messages"][1:-1] == wire_messages(history)
    assert scripted_openai.requests[1]["messages"][2]["content"] == ""  # never null beside tool calls


async def test_bad_key_ends_the_turn_with_one_sentence() -> None:
    async with ScriptedOpenAI(api_key="right-key") as server:
        server.script(answer("never sent"))
        agent = Agent(llm_settings(server, api_key="wrong-key"))
        try:
            result = await turn(agent, PreparedRunner())
        finally:
            await agent.close()
    assert result.stop_reason == "llm_error" and not result.ok
    assert result.text == (
        "The language model rejected the bot's API key (HTTP 401); the bot's operator should check llm.api_key."
    )
    assert server.remaining == 1 and len(server.requests) == 1
