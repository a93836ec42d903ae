"""The agent on real ipykernel kernels (via ``kernels.KernelPool``) and the real openai client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio

from bot.agent import Agent, CodeRunner, TurnResult, build_system_prompt
from kernels import KernelPool, KernelSession, build_pool
from tests.agent.conftest import RecordingRunner, assert_valid_transcript, llm_settings
from tests.conftest import make_settings
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call


def last_tool_output(body: dict[str, Any]) -> str:
    """What the model was told about the last execution."""
    return str(body["messages"][-1]["content"])


@pytest_asyncio.fixture
async def pool(tmp_path: Path) -> AsyncIterator[KernelPool]:
    # pyplot is imported at start: its first import alone can take the whole 1.5 s on a busy machine.
    kernels_settings = {"exec_timeout_s": 1.5, "interrupt_grace_s": 1, "preload": ["matplotlib.pyplot"]}
    settings = make_settings(tmp_path, kernels=kernels_settings)
    kernels = build_pool(settings.kernels)
    try:
        yield kernels
    finally:
        await kernels.shutdown_all()


@pytest_asyncio.fixture
async def session(pool: KernelPool) -> KernelSession:
    return await pool.get_or_start("test:T:C:1")


@pytest_asyncio.fixture
async def runner(session: KernelSession) -> RecordingRunner:
    """The session, keeping the result of every execution the agent asks for."""
    return RecordingRunner(session)


@pytest_asyncio.fixture
async def agent(scripted_openai: ScriptedOpenAI) -> AsyncIterator[Agent]:
    made = Agent(llm_settings(scripted_openai, max_rounds=4))
    yield made
    await made.close()


async def ask(agent: Agent, runner: CodeRunner, text: str, history: list[dict[str, Any]] | None = None) -> TurnResult:
    result = await agent.run_turn(
        history=history or [], user_content=text, runner=runner, system_prompt=build_system_prompt()
    )
    assert_valid_transcript(result.new_messages)
    return result


async def test_name_error_is_repaired_and_a_follow_up_reuses_the_variable(
    scripted_openai: ScriptedOpenAI, agent: Agent, runner: RecordingRunner
) -> None:
    scripted_openai.script(
        tool_call("total = sum(valuez)"),
        lambda body: (
            tool_call("values = [3, 4, 5]\ntotal = sum(values)\ntotal")
            if "NameError" in last_tool_output(body)
            else answer("the error never reached me")
        ),
        lambda body: answer(f"The total is {last_tool_output(body).split(chr(10))[-1]}."),
    )
    first = await ask(agent, runner, "Sum 3, 4 and 5.")
    error_seen = last_tool_output(scripted_openai.requests[1])
    assert error_seen.startswith("Error: NameError: name 'valuez' is not defined")
    assert "total = sum(valuez)" in error_seen  # the failing line, from the short traceback
    assert "\x1b[" not in error_seen and len(error_seen) < 800
    assert first.text == "The total is 12." and first.ok
    assert [r.ok for r in runner.results] == [False, True]

    # Next message: the variable survives in the same kernel; the history is replayed.
    scripted_openai.script(
        tool_call("print(total * 2)"), lambda body: answer(f"Doubled: {last_tool_output(body).split()[-1]}")
    )
    second = await ask(agent, runner, "Double it.", history=first.new_messages)
    assert second.text == "Doubled: 24"
    assert scripted_openai.requests[3]["messages"][1:-1] == first.new_messages


async def test_fenced_code_reply_runs_in_the_kernel(
    scripted_openai: ScriptedOpenAI, agent: Agent, runner: RecordingRunner
) -> None:
    scripted_openai.script(
        answer("I'll compute it:\n```python\nimport math\nprint(math.factorial(10))\n```"),
        lambda body: answer("10! = " + body["messages"][-1]["content"].split("stdout:\n")[1].strip()),
    )
    result = await ask(agent, runner, "What is 10 factorial?")
    assert result.text == "10! = 3628800"
    assert [r.stdout for r in runner.results] == ["3628800\n"]


async def test_files_and_figures_are_counted_not_inlined(
    scripted_openai: ScriptedOpenAI, agent: Agent, runner: RecordingRunner
) -> None:
    code = (
        "import matplotlib.pyplot as plt\n"
        "open('report.csv', 'w').write('a,b\\n1,2\\n')\n"
        "plt.plot([1, 2, 3])\nplt.show()\n"
    )
    scripted_openai.script(tool_call(code), answer("Saved report.csv and drew a line."))
    await ask(agent, runner, "Make a report and a chart.")
    observation = last_tool_output(scripted_openai.requests[1])
    assert "report.csv" in observation
    assert "1 image displayed" in observation
    assert "iVBOR" not in observation and len(observation) < 1000  # no base64 PNG for the model
    assert len(runner.results[0].images) == 1  # the runner (the bot's turn) gets the image from the result


async def test_timeout_and_death_are_explained_to_the_model(
    scripted_openai: ScriptedOpenAI, agent: Agent, runner: RecordingRunner
) -> None:
    scripted_openai.script(
        tool_call("kept = 1\nimport time\ntime.sleep(30)"),
        tool_call("print(kept)\nimport os\nos._exit(1)"),
        tool_call("print(kept)"),
        answer("The kernel was reset."),
    )
    result = await ask(agent, runner, "Try things.")
    timed_out, died, after = (last_tool_output(scripted_openai.requests[i]) for i in (1, 2, 3))
    assert timed_out.startswith("Notice: Execution timed out") and "variables are kept" in timed_out
    assert "----> 3 time.sleep(30)" in timed_out  # where it was stuck
    assert died.startswith("Notice: The kernel died") and "lost" in died
    assert "Error: NameError: name 'kept' is not defined" in after and "restarted" in after
    assert result.ok and len(runner.results) == 3
    json.dumps(result.new_messages)  # storable as is
