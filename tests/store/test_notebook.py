"""nbformat outputs of executions and the .ipynb export of a stored thread."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import nbformat
from PIL import Image

from bot.events import ThreadKey
from bot.notebook import export_notebook
from bot.store import Store
from bot.transcript import NewCell, result_to_outputs
from kernels.seam.result import DisplayOutput, ErrorInfo, ExecutionResult, Outcome, StreamChunk

KEY = ThreadKey.parse("slack:T1:C1:1700000000.000100")


def _png(width: int = 32, height: int = 16) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def _call(call_id: str, code: str) -> dict[str, object]:
    arguments = json.dumps({"code": code})
    return {"id": call_id, "type": "function", "function": {"name": "python", "arguments": arguments}}


def test_outputs_merge_streams_and_keep_every_kind() -> None:
    result = ExecutionResult(
        outcome=Outcome.ERROR,
        streams=[
            StreamChunk("stdout", "a"),
            StreamChunk("stdout", "b\n"),
            StreamChunk("stderr", "warn\n"),
            StreamChunk("stdout", "c\n"),
        ],
        displays=[DisplayOutput({"image/png": _png(), "text/plain": "<Figure>"})],
        result="3",
        error=ErrorInfo("ValueError", "bad", "Traceback (most recent call last):\nValueError: bad"),
        execution_count=7,
        notice="the kernel was restarted",
    )
    outputs = result_to_outputs(result)
    kinds = [(o["output_type"], o.get("name")) for o in outputs]
    assert kinds == [
        ("stream", "stdout"),
        ("stream", "stderr"),
        ("stream", "stdout"),
        ("display_data", None),
        ("execute_result", None),
        ("error", None),
        ("stream", "stderr"),
    ]
    assert outputs[0]["text"] == "ab\n"
    assert base64.b64decode(outputs[3]["data"]["image/png"]) == _png()
    assert outputs[4]["data"] == {"text/plain": "3"} and outputs[4]["execution_count"] == 7
    assert outputs[5]["traceback"] == ["Traceback (most recent call last):", "ValueError: bad"]
    assert "restarted" in outputs[6]["text"]
    json.dumps(outputs)  # plain JSON, storable as is
    # Built without nbformat (its per-output validation cost every turn a millisecond), each is
    # still an output the schema takes, as the export's own validation will ask.
    for output in outputs:
        nbformat.validate(nbformat.from_dict(output), ref=output["output_type"], version=4, version_minor=5)


async def test_export_of_a_stored_thread_is_a_valid_notebook_with_the_image(store_target: Path | str) -> None:
    png = _png(40, 20)
    plot_code = "df.plot()\nplt.show()"
    plotted = ExecutionResult(
        streams=[StreamChunk("stdout", "rows: 3\n")],
        displays=[DisplayOutput({"image/png": png, "text/plain": "<Figure size 640x480>"})],
        execution_count=2,
        duration_s=0.3,
    )
    async with await Store.open(store_target) as store:
        await store.transcripts.add_messages(KEY, [{"role": "user", "content": "plot sales.csv"}], user_id="U42")
        await store.transcripts.add_messages(
            KEY, [{"role": "assistant", "content": "Let me plot it.", "tool_calls": [_call("c1", plot_code)]}]
        )
        await store.transcripts.add_cell(KEY, NewCell.of(plot_code, plotted))
        await store.transcripts.add_messages(
            KEY,
            [
                {"role": "tool", "tool_call_id": "c1", "content": "stdout: rows: 3\n[1 image]"},
                {"role": "assistant", "content": None, "tool_calls": [_call("c2", "print('never run')")]},
                {"role": "tool", "tool_call_id": "c2", "content": "never run"},
                {"role": "assistant", "content": "Here is the chart."},
            ],
        )
        timeline = await store.transcripts.timeline(KEY)

    data = export_notebook(timeline, title="Thread in #sales")
    notebook = nbformat.reads(data.decode("utf-8"), as_version=4)
    nbformat.validate(notebook)
    assert notebook.metadata.kernelspec.name == "python3"

    cells = [(cell.cell_type, cell.source) for cell in notebook.cells]
    assert cells == [
        ("markdown", "# Thread in #sales"),
        ("markdown", "**U42:**\n\nplot sales.csv"),
        ("markdown", "**Threadbook:**\n\nLet me plot it."),
        ("code", plot_code),  # from the recorded cell, not a second copy from the tool call
        ("code", "print('never run')"),  # tool call without a recorded cell
        ("markdown", "**Threadbook:**\n\nHere is the chart."),
    ]
    plot_cell, unrecorded = notebook.cells[3], notebook.cells[4]
    assert plot_cell.execution_count == 2
    assert plot_cell.outputs[0].text == "rows: 3\n"
    image = Image.open(io.BytesIO(base64.b64decode(plot_cell.outputs[1].data["image/png"])))
    assert image.size == (40, 20)
    assert [o.text for o in unrecorded.outputs] == ["never run"]


def test_export_of_an_empty_thread_is_valid() -> None:
    notebook = nbformat.reads(export_notebook([], title="empty").decode(), as_version=4)
    nbformat.validate(notebook)
    assert [cell.source for cell in notebook.cells] == ["# empty"]


async def test_a_turns_cells_follow_its_question_as_stored_by_a_real_turn(store_target: Path | str) -> None:
    # A turn stores each cell as it runs and its messages once it ends: the cells come first
    # in the store, yet the notebook reads question → code → answer, turn after turn.
    async with await Store.open(store_target) as store:
        for turn, code in enumerate(("x = 1", "x + 1"), start=1):
            await store.transcripts.add_cell(KEY, NewCell.of(code, ExecutionResult(execution_count=turn)))
            await store.transcripts.add_messages(
                KEY,
                [
                    {"role": "user", "content": f"question {turn}"},
                    {"role": "assistant", "content": None, "tool_calls": [_call(f"c{turn}", code)]},
                    {"role": "tool", "tool_call_id": f"c{turn}", "content": "ok"},
                    {"role": "assistant", "content": f"answer {turn}"},
                ],
                user_id="U1",
            )
        fenced = "```python\nprint(3)\n```"
        await store.transcripts.add_cell(KEY, NewCell.of("print(3)", ExecutionResult(execution_count=3)))
        await store.transcripts.add_messages(
            KEY, [{"role": "user", "content": "question 3"}, {"role": "assistant", "content": fenced}], user_id="U1"
        )
        timeline = await store.transcripts.timeline(KEY)
    notebook = nbformat.reads(export_notebook(timeline, title="t").decode(), as_version=4)
    assert [(cell.cell_type, cell.source) for cell in notebook.cells][1:] == [
        ("markdown", "**U1:**\n\nquestion 1"),
        ("code", "x = 1"),
        ("markdown", "**Threadbook:**\n\nanswer 1"),
        ("markdown", "**U1:**\n\nquestion 2"),
        ("code", "x + 1"),
        ("markdown", "**Threadbook:**\n\nanswer 2"),
        ("markdown", "**U1:**\n\nquestion 3"),
        ("markdown", f"**Threadbook:**\n\n{fenced}"),
        ("code", "print(3)"),
    ]
    assert [cell.execution_count for cell in notebook.cells if cell.cell_type == "code"] == [1, 2, 3]
