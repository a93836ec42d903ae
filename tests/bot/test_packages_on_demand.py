"""Packages on demand through the whole bot: the model's code fails on a missing module, the
bot installs the allowed package (real uv, an offline wheel) and runs the code again; the
thread and the model are told. Real kernels, scripted model, in-memory chat."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
import pytest_asyncio

from bot.app import Core
from kernels.host.packages import installed_distributions
from tests.conftest import make_settings
from tests.fakes.memory import MemoryChat
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call
from tests.fakes.wheels import make_wheel


def tool_outputs(request: dict[str, Any]) -> list[str]:
    """The tool messages the model was sent, in order."""
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


def echo_tool_output(request: dict[str, Any]) -> Any:
    return answer("Result: " + tool_outputs(request)[-1])


@pytest.fixture
def packages_dir(tmp_path: Path) -> Path:
    return tmp_path / "packages"


@pytest_asyncio.fixture
async def chat(tmp_path: Path, llm: ScriptedOpenAI, packages_dir: Path) -> AsyncIterator[MemoryChat]:
    links = tmp_path / "wheels"
    make_wheel(links, "tbdemo", "1.2.3")
    make_wheel(links, "tbother", "1.0")
    packages = {
        "allow": ["tbdemo", "tbmissing"],
        "find_links": [str(links)],
        "no_index": True,
        "dir": str(packages_dir),
    }
    async with Core.open(make_settings(tmp_path, llm_url=llm.base_url, kernels={"packages": packages})) as core:
        yield MemoryChat(core.dispatcher)


async def test_missing_allowed_package_is_installed_and_the_code_runs_again(
    chat: MemoryChat, llm: ScriptedOpenAI, packages_dir: Path
) -> None:
    llm.script(tool_call("import tbdemo\nprint('value is', tbdemo.VALUE)"), echo_tool_output)

    out = await chat.say("use tbdemo to get the value")

    reply = out.reply
    assert reply.ok
    assert "Installed tbdemo 1.2.3 for this code." in reply.text  # the thread is told
    assert "value is 42" in reply.text  # the re-run's output
    seen = tool_outputs(llm.requests[1])
    assert len(seen) == 1  # one tool call, one observation: the re-run's
    assert "tbdemo 1.2.3 was installed and the code ran again" in seen[0]
    assert "value is 42" in seen[0] and "ModuleNotFoundError" not in seen[0]
    assert ("update", "📦 Installing `tbdemo`…") in out.progress_log
    assert installed_distributions(packages_dir) == {"tbdemo": "1.2.3"}

    # The export shows what happened: the failed run, then the run after the install.
    export = await chat.say("export", mentioned=False)
    notebook = nbformat.reads(export.reply.files[0].open_reader().read().decode(), as_version=4)
    code_cells = [c for c in notebook.cells if c.cell_type == "code"]
    assert [c.source for c in code_cells] == ["import tbdemo\nprint('value is', tbdemo.VALUE)"] * 2
    assert code_cells[0].outputs[-1]["ename"] == "ModuleNotFoundError"
    assert code_cells[1].outputs[0]["text"] == "value is 42\n"

    # A later turn imports it without installing anything.
    llm.script(tool_call("import tbdemo\nprint(tbdemo.VALUE + 1)"), echo_tool_output)
    later = await chat.say("and plus one?", mentioned=False)
    assert "43" in later.reply.text and "Installed" not in later.reply.text


async def test_package_off_the_allow_list_is_unavailable_to_the_model(
    chat: MemoryChat, llm: ScriptedOpenAI, packages_dir: Path
) -> None:
    llm.script(tool_call("import tbother"), answer("I will do without tbother."))

    out = await chat.say("use tbother")

    assert out.reply.text == "I will do without tbother."  # nothing about installs in the thread
    seen = tool_outputs(llm.requests[1])[-1]
    assert "Module 'tbother' is not available" in seen and "not on the allow-list" in seen
    assert "ModuleNotFoundError" in seen
    assert not any(status.startswith("📦") for _, status in out.progress_log)
    assert installed_distributions(packages_dir) == {}
    assert not (packages_dir / "tbother").exists()


async def test_failed_install_is_one_note_for_the_thread_and_the_model(
    chat: MemoryChat, llm: ScriptedOpenAI, packages_dir: Path
) -> None:
    llm.script(tool_call("import tbmissing"), tool_call("print('still', 1 + 1)"), echo_tool_output)

    out = await chat.say("use tbmissing")

    reply = out.reply
    notes = [line for line in reply.text.splitlines() if "tbmissing" in line]
    assert len(notes) == 1 and notes[0].startswith("⚠️ Could not install tbmissing: ")  # one clear note
    first = tool_outputs(llm.requests[1])[-1]
    assert "Module 'tbmissing' is not available: installing tbmissing failed" in first
    assert "still 2" in reply.text  # the kernel still works
    assert installed_distributions(packages_dir) == {}
