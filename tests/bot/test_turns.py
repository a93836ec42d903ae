"""The bot core end to end: real kernels, real openai client, scripted model, in-memory chat."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import nbformat
import pytest
from PIL import Image

from bot.app import Core
from bot.line import QUEUED_NOTICE
from tests.conftest import make_settings
from tests.fakes.memory import MemoryChat, MemoryOutbox, bytes_attachment
from tests.fakes.openai_server import ScriptedOpenAI, answer, error, tool_call

SALES_CSV = b"month,amount\nJan,100\nFeb,200\nMar,300\n"


def last_tool_output(request: dict[str, Any]) -> str:
    """The text of the most recent tool message the model was sent."""
    return next(m["content"] for m in reversed(request["messages"]) if m["role"] == "tool")


def echo_tool_output(prefix: str = "Result: ") -> Any:
    """A script step that answers with the last tool observation (so the reply shows real kernel output)."""
    return lambda request: answer(prefix + last_tool_output(request))


@pytest.fixture
def chat(core: Core) -> MemoryChat:
    return MemoryChat(core.dispatcher)


async def test_csv_question_gets_answer_with_chart_then_follow_up_reuses_variables(
    chat: MemoryChat, llm: ScriptedOpenAI
) -> None:
    llm.script(
        tool_call("import pandas as pd\ndf = pd.read_csv('sales.csv')\nprint(df.shape)"),
        tool_call("import matplotlib.pyplot as plt\ndf.plot(x='month', y='amount')\nplt.show()"),
        answer("Sales grew every month, peaking in **March**."),
    )
    out = await chat.say("plot the sales", attachments=[bytes_attachment("sales.csv", SALES_CSV)])

    reply = out.reply
    assert reply.ok
    assert "peaking in **March**" in reply.text
    assert len(reply.images) == 1
    image = Image.open(io.BytesIO(reply.images[0].data))
    assert image.format == "PNG" and image.width > 100
    assert reply.files == ()  # the upload is not echoed back
    # The model saw the upload's preview and the real kernel output.
    first_user = next(m for m in llm.requests[0]["messages"] if m["role"] == "user")["content"]
    assert "sales.csv" in first_user and "amount" in first_user
    assert "(3, 2)" in last_tool_output(llm.requests[1])
    # The step is labelled by what it does (not by its first import) and shows its time.
    assert ("cell", "Running step 1 (0 s): `df = pd.read_csv('sales.csv')`") in out.progress_log
    assert out.progress_log[-1] == ("finish", "ok")

    llm.script(tool_call("print(df['amount'].sum())"), echo_tool_output("Total: "))
    follow_up = await chat.say("what is the total?", mentioned=False)
    assert "600" in follow_up.reply.text
    # The history of the first turn was replayed to the model.
    assert any("plot the sales" in str(m.get("content")) for m in llm.requests[-1]["messages"])


async def test_saved_chart_is_sent_once_and_new_files_come_back(chat: MemoryChat, llm: ScriptedOpenAI) -> None:
    llm.script(
        tool_call(
            "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.savefig('chart.png')\nplt.show()\n"
            "open('summary.csv', 'w').write('a,b\\n1,2\\n')"
        ),
        answer("Done."),
    )
    reply = (await chat.say("chart and summary please")).reply
    assert [i.title for i in reply.images] == ["chart.png"]
    Image.open(io.BytesIO(reply.images[0].data)).verify()
    assert [f.name for f in reply.files] == ["summary.csv"]
    with reply.files[0].open_reader() as reader:
        assert reader.read() == b"a,b\n1,2\n"


async def test_errors_go_back_to_the_model_and_llm_failures_are_reported(chat: MemoryChat, llm: ScriptedOpenAI) -> None:
    llm.script(
        tool_call("print(undefined_name)"), tool_call("undefined_name = 5\nprint(undefined_name)"), echo_tool_output()
    )
    reply = (await chat.say("go")).reply
    assert "NameError" in last_tool_output(llm.requests[1])
    assert reply.text.strip().endswith("5")

    llm.script(error(500), answer("recovered"))
    assert (await chat.say("again", mentioned=False)).reply.text == "recovered"

    llm.script(error(401))
    failed = await chat.say("and again", mentioned=False)
    assert not failed.reply.ok
    assert failed.progress_log[-1] == ("finish", "failed")
    assert "llm.api_key" in failed.reply.text  # our sentence for the operator, not the server's body
    assert "Incorrect API key" not in failed.reply.text


async def test_rules_duplicates_bots_mentions_allow_list(tmp_path: Path, llm: ScriptedOpenAI) -> None:
    settings = make_settings(tmp_path, llm_url=llm.base_url, access={"allow_users": ["U1"]})
    async with Core.open(settings) as core:
        chat = MemoryChat(core.dispatcher)
        llm.script(answer("hello once"))
        message = chat.message("hi", message_id="dup-1")
        first, second = await chat.send(message), await chat.send(message)
        assert first.reply.text == "hello once"
        assert second.replies == [] and second.notices == []

        before = len(llm.requests)
        assert (await chat.say("bot talk", is_bot=True)).replies == []
        assert (await chat.say("not allowed", user="U2")).replies == []
        assert (await chat.say("no mention, unknown thread", thread="t-other", mentioned=False)).replies == []
        assert len(llm.requests) == before


async def test_second_message_in_a_busy_thread_is_queued_not_interleaved(chat: MemoryChat, llm: ScriptedOpenAI) -> None:
    llm.script(tool_call("import time\ntime.sleep(1.5)\nx = 1"), answer("first done"), answer("second done"))
    first = asyncio.create_task(chat.say("slow one"))
    while not llm.requests:
        await asyncio.sleep(0.02)
    second = await chat.say("quick one", mentioned=False)
    assert second.notices == [QUEUED_NOTICE]
    assert (await first).reply.text == "first done"
    assert second.reply.text == "second done"
    # The second turn started only after the first had its final answer.
    last_messages = llm.requests[-1]["messages"]
    assert [m.get("content") for m in last_messages if m["role"] == "assistant"][-1] == "first done"


async def test_two_threads_answer_concurrently(chat: MemoryChat, llm: ScriptedOpenAI) -> None:
    def route(request: dict[str, Any]) -> Any:
        user = [m["content"] for m in request["messages"] if m["role"] == "user"][-1]
        if request["messages"][-1]["role"] == "tool":
            return answer(f"{user}: {last_tool_output(request)}")
        return tool_call(f"import os, time\ntime.sleep(0.5)\nprint('{user}', len(os.listdir('.')))")

    llm.script(*[route] * 4)
    one, two = await asyncio.gather(chat.say("alpha", thread="ta"), chat.say("beta", thread="tb"))
    assert "alpha 0" in one.reply.text and one.reply.text.startswith("alpha:")
    assert "beta 0" in two.reply.text and two.reply.text.startswith("beta:")


async def test_commands_help_files_status_reset(chat: MemoryChat, llm: ScriptedOpenAI) -> None:
    assert "reset" in (await chat.say("help")).reply.text
    assert "reset" in (await chat.say("   ")).reply.text  # a bare mention gets help, not silence
    llm.script(tool_call("kept = 42"), answer("stored"))
    await chat.say("remember 42", attachments=[bytes_attachment("notes.txt", b"hello")])

    assert "notes.txt" in (await chat.say("files", mentioned=False)).reply.text
    status = (await chat.say("status", mentioned=False)).reply.text
    assert "Code cells run in this thread:** 1" in status and "Tokens used" in status
    assert "**Kernels:** 1 of 6 running, 0 threads waiting" in status
    assert "**Isolation:** cgroup v" in status or "**Isolation:** rlimits only (no cgroup)" in status
    assert "**Sandbox:** ⚠️ kernels run WITHOUT a sandbox (kernels.sandbox: none)" in status
    assert "Fresh kernel" in (await chat.say("reset", mentioned=False)).reply.text

    llm.script(tool_call("print('kept' in dir())\nprint(open('notes.txt').read())"), echo_tool_output())
    after = (await chat.say("still there?", mentioned=False)).reply.text
    assert "False" in after and "hello" in after
    system = llm.requests[-2]["messages"][0]["content"]
    assert "variables from earlier in this thread are gone" in system  # the model was told the kernel is fresh


async def test_export_is_a_valid_notebook_with_the_chart(chat: MemoryChat, llm: ScriptedOpenAI) -> None:
    llm.script(tool_call("import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [1, 2])\nplt.show()"), answer("Here."))
    await chat.say("bar chart")
    reply = (await chat.say("export", mentioned=False)).reply
    assert reply.files and reply.files[0].name.endswith(".ipynb")
    with reply.files[0].open_reader() as reader:
        notebook = nbformat.reads(reader.read().decode(), as_version=4)
    nbformat.validate(notebook)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert "plt.bar" in code[0].source
    assert any("image/png" in o.get("data", {}) for o in code[0].outputs)
    assert any("bar chart" in c.source for c in notebook.cells if c.cell_type == "markdown")


async def test_oversized_attachment_is_refused_without_writing(tmp_path: Path, llm: ScriptedOpenAI) -> None:
    settings = make_settings(tmp_path, llm_url=llm.base_url, kernels={"max_upload_mb": 1})
    async with Core.open(settings) as core:
        chat = MemoryChat(core.dispatcher)
        big = bytes_attachment("huge.csv", b"x" * (2 * 2**20))
        out = await chat.say("", attachments=[big])
        assert len(out.notices) == 1 and "huge.csv" in out.notices[0]
        workspace = core.pool.workspaces.for_key(str(chat.key()))
        assert await workspace.list_files() == []
        assert llm.requests == []


async def test_stop_interrupts_running_code(chat: MemoryChat, llm: ScriptedOpenAI, core: Core) -> None:
    llm.script(tool_call("import time\ntime.sleep(60)"), answer("should not be needed"))
    turn = asyncio.create_task(chat.say("sleep"))
    while (session := core.pool.get(str(chat.key()))) is None or not session.busy:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.3)
    assert await core.dispatcher.stop(chat.key(), user_id="U1")
    out = await asyncio.wait_for(turn, 10)
    assert "stop" in out.reply.text.lower()
    assert llm.remaining == 1  # no further model call after Stop


async def test_restart_keeps_history_and_restores_variables(tmp_path: Path, llm: ScriptedOpenAI) -> None:
    settings = make_settings(tmp_path, llm_url=llm.base_url)
    async with Core.open(settings) as core:
        chat = MemoryChat(core.dispatcher)
        llm.script(tool_call("secret_number = 41\nopen('kept.txt', 'w').write('yes')"), answer("Noted 41."))
        await chat.say("remember 41")

    async with Core.open(settings) as core:
        chat = MemoryChat(core.dispatcher)
        llm.script(tool_call("print(open('kept.txt').read(), secret_number + 1)"), echo_tool_output())
        reply = (await chat.say("what did I say?", mentioned=False)).reply
        assert "yes 42" in reply.text
        request = llm.requests[-2]
        assert any("remember 41" in json.dumps(m) for m in request["messages"])
        system = request["messages"][0]["content"]
        assert "restored from this thread's snapshot" in system and "`secret_number` (int)" in system


async def test_without_snapshots_a_restart_tells_the_model_variables_are_lost(
    tmp_path: Path, llm: ScriptedOpenAI
) -> None:
    settings = make_settings(tmp_path, llm_url=llm.base_url, kernels={"snapshot": False})
    async with Core.open(settings) as core:
        llm.script(tool_call("secret_number = 41"), answer("Noted 41."))
        await MemoryChat(core.dispatcher).say("remember 41")
        workspace = core.pool.workspaces.for_key(str(MemoryChat(core.dispatcher).key()))
    # After the shutdown, which is when a snapshot would certainly have been written.
    assert workspace.saved_state() is None

    async with Core.open(settings) as core:
        llm.script(tool_call("print('secret_number' in dir())"), echo_tool_output())
        reply = (await MemoryChat(core.dispatcher).say("what did I say?", mentioned=False)).reply
        assert "False" in reply.text
        assert "variables from earlier in this thread are gone" in llm.requests[-2]["messages"][0]["content"]


async def test_a_turn_cut_off_by_shutdown_says_so(chat: MemoryChat, llm: ScriptedOpenAI, core: Core) -> None:
    llm.script(tool_call("import time\ntime.sleep(30)"), answer("never"))
    outbox = MemoryOutbox()
    turn = asyncio.create_task(core.dispatcher.handle(chat.message("slow"), outbox))
    while (session := core.pool.get(str(chat.key()))) is None or not session.busy:
        await asyncio.sleep(0.02)
    turn.cancel()
    with pytest.raises(asyncio.CancelledError):
        await turn
    assert any("restarted" in notice for notice in outbox.notices)
    assert outbox.progress_log[-1] == ("finish", "failed")


async def test_channel_policy_sets_prompt_model_rounds_and_data(tmp_path: Path, llm: ScriptedOpenAI) -> None:
    data = tmp_path / "sales-data"
    data.mkdir()
    (data / "prices.csv").write_text("sku,eur\nA,3\n")
    policy = {
        "system_prompt": "Amounts are in EUR.",
        "model": "special-model",
        "max_rounds": 1,
        "data_dir": str(data),
        "background_processes": True,
    }
    settings = make_settings(tmp_path, llm_url=llm.base_url, channels={"test:C1": policy})
    async with Core.open(settings) as core:
        chat = MemoryChat(core.dispatcher)
        llm.script(
            tool_call("import os\nprint(sorted(os.listdir(os.environ['THREADBOOK_DATA_DIR'])))"),
            tool_call("print('a second run is over the limit')"),
            answer("Summary: prices.csv is there."),
        )
        reply = (await chat.say("what data do we have?")).reply
        assert "['prices.csv']" in last_tool_output(llm.requests[1])
        assert "limit" in reply.text.lower()  # max_rounds 1 stopped the second run
        assert {r["model"] for r in llm.requests} == {"special-model"}
        system = llm.requests[0]["messages"][0]["content"]
        assert "Amounts are in EUR." in system and str(data) in system
        session = core.pool.get(str(chat.key()))
        assert session is not None and session.options.background_processes

        other = MemoryChat(core.dispatcher, channel="C2")
        llm.script(answer("default channel"))
        await other.say("hi")
        assert llm.requests[-1]["model"] == "fake-model"
        assert "EUR" not in llm.requests[-1]["messages"][0]["content"]
        other_session = core.pool.get(str(other.key()))
        assert other_session is None or not other_session.options.background_processes
