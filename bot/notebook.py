"""Jupyter notebook format: execution results as nbformat outputs, threads as .ipynb.

:func:`result_to_outputs` turns a :class:`~kernels.result.ExecutionResult` into nbformat v4
output dicts (the store keeps them per cell); :func:`export_notebook` rebuilds a thread's
timeline as a notebook: the conversation as markdown cells, executed code as code cells
with their outputs (images included).
"""

from __future__ import annotations

import base64
import json
import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import nbformat
from nbformat import NotebookNode
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from bot.agent.loop import fenced_python, text_tool_call
from bot.sources.cell import SQL_TOOL, notebook_code, notebook_markdown
from kernels.result import DisplayOutput, ExecutionResult

#: MIME types whose data nbformat stores as JSON (any other type holds text).
_JSON_MIME = re.compile(r"^application/(.*\+)?json$")
#: Who the assistant is in exported notebooks.
ASSISTANT_LABEL = "Threadbook"


@dataclass(frozen=True, slots=True)
class MessageEntry:
    """One OpenAI-format message of a thread, as stored."""

    seq: int
    message: dict[str, Any]
    user_id: str | None
    created_at: float

    @property
    def role(self) -> str:
        """``user``, ``assistant``, ``tool`` or ``system``."""
        return str(self.message.get("role", ""))


@dataclass(frozen=True, slots=True)
class CellEntry:
    """One executed code cell with its nbformat v4 outputs."""

    seq: int
    code: str
    outputs: list[dict[str, Any]]
    execution_count: int | None
    outcome: str
    duration_s: float
    created_at: float


#: What :meth:`bot.store.Store.timeline` returns and :func:`export_notebook` reads, in ``seq`` order.
TimelineEntry = MessageEntry | CellEntry


def result_to_outputs(result: ExecutionResult) -> list[dict[str, Any]]:
    """nbformat v4 outputs of one execution: streams, displays, result, error, notice.

    Consecutive stream chunks of the same name are merged; binary payloads (PNG) are
    stored base64-encoded as nbformat requires.
    """
    outputs: list[dict[str, Any]] = []
    for chunk in result.streams:
        last = outputs[-1] if outputs else None
        if last is not None and last["output_type"] == "stream" and last["name"] == chunk.name:
            last["text"] += chunk.text
        else:
            outputs.append(new_output("stream", name=chunk.name, text=chunk.text))
    for display in result.displays:
        outputs.append(new_output("display_data", data=_mime_bundle(display), metadata=dict(display.metadata)))
    if result.result_data is not None or result.result is not None:
        bundle = _mime_bundle(result.result_data) if result.result_data else {"text/plain": result.result}
        metadata = dict(result.result_data.metadata) if result.result_data else {}
        outputs.append(
            new_output("execute_result", data=bundle, metadata=metadata, execution_count=result.execution_count)
        )
    if result.error is not None:
        error = result.error
        outputs.append(
            new_output("error", ename=error.ename, evalue=error.evalue, traceback=error.traceback.splitlines())
        )
    if result.notice:
        outputs.append(new_output("stream", name="stderr", text=f"[{result.notice}]\n"))
    return [_plain(output) for output in outputs]


def export_notebook(timeline: Sequence[TimelineEntry], *, title: str) -> bytes:
    """A valid .ipynb (UTF-8 JSON) of a thread's timeline.

    User and assistant text become markdown cells labelled with who spoke; executed cells
    become code cells with their stored outputs, right after the assistant message that ran
    them (a turn stores its cells as they run and its messages once it ends, so in the store
    they come first). A tool call with no recorded cell (not executed, or recorded before
    cells were kept) becomes a code cell whose output is the tool result the model saw.
    System messages and tool results of recorded cells are left out: the notebook shows the
    conversation and the code, not the prompt plumbing. An ``sql`` call becomes a ``%%sql``
    markdown cell with its query, then the cell that loaded its rows into the kernel.
    """
    ran_by = _cells_run_by(timeline)
    placed = {cell.seq for found in ran_by.values() for runs in found for cell in runs}
    tool_results = {
        str(entry.message.get("tool_call_id")): _text_of(entry.message.get("content"))
        for entry in timeline
        if not isinstance(entry, CellEntry) and entry.role == "tool"
    }
    cells: list[NotebookNode] = [new_markdown_cell(f"# {title}")]
    for entry in timeline:
        if isinstance(entry, CellEntry):
            if entry.seq not in placed:  # its messages were never stored (a failed model request)
                cells.append(_code_cell(entry))
            continue
        message = entry.message
        text = _text_of(message.get("content")).strip()
        if entry.role == "user" and text:
            who = message.get("name") or entry.user_id or "user"
            cells.append(new_markdown_cell(f"**{who}:**\n\n{text}"))
        elif entry.role == "assistant":
            if text:
                cells.append(new_markdown_cell(f"**{ASSISTANT_LABEL}:**\n\n{text}"))
            found = iter(ran_by.get(entry.seq, []))
            for call in message.get("tool_calls") or []:
                sql = call.get("function", {}).get("name") == SQL_TOOL
                if sql:
                    cells.append(new_markdown_cell(notebook_markdown(call["function"].get("arguments"))))
                recorded = next(found, [])
                if recorded:
                    cells.extend(_code_cell(run) for run in recorded)  # with their real outputs
                    continue
                if sql:  # refused or failed: nothing was loaded, the answer it got is what there is
                    said = tool_results.get(str(call.get("id")), "").strip()
                    if said:
                        cells.append(new_markdown_cell("\n".join(f"> {line}" for line in said.splitlines())))
                    continue
                cell = new_code_cell(_code_of(call))
                observed = tool_results.get(str(call.get("id")))
                if observed:
                    cell.outputs = [new_output("stream", name="stdout", text=observed)]
                cells.append(cell)
            if not message.get("tool_calls"):
                cells.extend(_code_cell(run) for runs in found for run in runs)  # code written as text
    notebook = new_notebook(
        cells=cells,
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"},
            "title": title,
        },
    )
    nbformat.validate(notebook)
    ipynb: str = nbformat.writes(notebook)
    return ipynb.encode("utf-8")


def _code_cell(entry: CellEntry) -> NotebookNode:
    cell: NotebookNode = new_code_cell(entry.code, execution_count=entry.execution_count)
    cell.outputs = [nbformat.from_dict(output) for output in entry.outputs]
    return cell


def _cells_run_by(timeline: Sequence[TimelineEntry]) -> dict[int, list[list[CellEntry]]]:
    """For each assistant message (by ``seq``), the recorded cells its code ran as, per tool
    call (or for the code it wrote as text): the earliest cell with the same code not placed
    yet, and the cells of the same code stored right after it (a re-run after an install)."""
    waiting: dict[str, deque[CellEntry]] = {}
    for entry in timeline:
        if isinstance(entry, CellEntry):
            waiting.setdefault(entry.code, deque()).append(entry)
    ran_by: dict[int, list[list[CellEntry]]] = {}
    for entry in timeline:
        if isinstance(entry, CellEntry) or entry.role != "assistant":
            continue
        calls = entry.message.get("tool_calls") or []
        text = _text_of(entry.message.get("content"))
        codes = [_code_of(call) for call in calls] if calls else [fenced_python(text) or text_tool_call(text)]
        found: list[list[CellEntry]] = []
        for code in codes:
            queue = waiting.get(code)
            runs = [queue.popleft()] if code and queue else []
            while runs and queue and queue[0].seq == runs[-1].seq + 1:
                runs.append(queue.popleft())
            found.append(runs)
        ran_by[entry.seq] = found
    return ran_by


def _mime_bundle(display: DisplayOutput) -> dict[str, Any]:
    """The bundle as the kernel sent it: every MIME type kept, binary ones base64-encoded."""
    return {mime: _payload(mime, value) for mime, value in display.data.items()}


def _payload(mime: str, value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, str) or _JSON_MIME.match(mime):
        return value
    # nbformat takes structured data only under a JSON type (``…+json``); any other type (Altair
    # 6 says ``application/vnd.vegalite.v6.json``) keeps its data as JSON text so the
    # notebook stays valid.
    return json.dumps(value)


def _plain(node: Any) -> Any:
    """NotebookNode → plain dicts/lists, so callers can ``json.dumps`` without nbformat."""
    if isinstance(node, dict):
        return {key: _plain(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_plain(value) for value in node]
    return node


def _text_of(content: Any) -> str:
    """Text of an OpenAI message ``content``: a string or a list of typed parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content)


def _code_of(call: dict[str, Any]) -> str:
    """The ``code`` argument of a ``python`` tool call (raw arguments when not JSON); for an
    ``sql`` call, the code that loaded its rows."""
    arguments = call.get("function", {}).get("arguments", "")
    if call.get("function", {}).get("name") == SQL_TOOL:
        return notebook_code(arguments)
    try:
        parsed = json.loads(arguments)
    except (TypeError, ValueError):
        return str(arguments)
    if isinstance(parsed, dict) and isinstance(parsed.get("code"), str):
        return str(parsed["code"])
    return str(arguments)
