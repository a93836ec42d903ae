"""Threads as .ipynb: :func:`export_notebook` rebuilds a thread's timeline (as the store keeps
it, :mod:`bot.transcript`) as a notebook: the conversation as markdown cells, executed code as
code cells with their outputs (images included).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Sequence
from typing import Any

import nbformat
from nbformat import NotebookNode
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from bot.agent.loop import fenced_python, text_tool_call
from bot.mcp.cell import is_mcp_function
from bot.mcp.cell import notebook_markdown as mcp_markdown
from bot.sources.cell import SQL_TOOL, notebook_code, notebook_markdown
from bot.transcript import CellEntry, TimelineEntry

__all__ = ["ASSISTANT_LABEL", "export_notebook"]

#: Who the assistant is in exported notebooks.
ASSISTANT_LABEL = "Threadbook"


def export_notebook(timeline: Sequence[TimelineEntry], *, title: str) -> bytes:
    """A valid .ipynb (UTF-8 JSON) of a thread's timeline.

    User and assistant text become markdown cells labelled with who spoke; executed cells
    become code cells with their stored outputs, right after the assistant message that ran
    them (a turn stores its cells as they run and its messages once it ends, so in the store
    they come first). A tool call with no recorded cell (not executed, or recorded before
    cells were kept) becomes a code cell whose output is the tool result the model saw.
    System messages and tool results of recorded cells are left out: the notebook shows the
    conversation and the code, not the prompt plumbing. An ``sql`` call becomes a ``%%sql``
    markdown cell with its query, then the cell that loaded its rows into the kernel; an MCP
    tool's call (``<server>__<tool>``) a markdown cell with the server, the tool, the arguments
    and the answer the model got (:mod:`bot.mcp.cell`).
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
                function = str(call.get("function", {}).get("name", ""))
                if is_mcp_function(function):  # made by the bot, nothing ran in the kernel
                    next(found, [])
                    answer = tool_results.get(str(call.get("id")))
                    cells.append(new_markdown_cell(mcp_markdown(function, call["function"].get("arguments"), answer)))
                    continue
                sql = function == SQL_TOOL
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
    if is_mcp_function(str(call.get("function", {}).get("name", ""))):
        return ""  # no code: an MCP call runs nothing in the kernel
    try:
        parsed = json.loads(arguments)
    except (TypeError, ValueError):
        return str(arguments)
    if isinstance(parsed, dict) and isinstance(parsed.get("code"), str):
        return str(parsed["code"])
    return str(arguments)
