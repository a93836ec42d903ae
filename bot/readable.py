"""An exported notebook made fit for its readers (``export`` and ``export html``).

:func:`readable` takes the ``.ipynb`` bytes of :func:`bot.notebook.export_notebook` and returns
them with every error's traceback trimmed as the thread trims it (its last frames, then
``Name: value``: :func:`bot.agent.observation.short_traceback`) and every host path rewritten
(:mod:`bot.hostpaths`) in cells, outputs and text data. Images and other binary data are left
as they are. Pure: it runs in a worker thread.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from bot.agent.observation import short_traceback

Hide = Callable[[str], str]


def readable(ipynb: bytes, hide: Hide) -> bytes:
    """The notebook with trimmed tracebacks and no host path."""
    notebook = json.loads(ipynb)
    for cell in notebook.get("cells", []):
        cell["source"] = _hidden(cell.get("source", ""), hide)
        if cell.get("cell_type") == "code":
            cell["outputs"] = [_output(output, hide) for output in cell.get("outputs", [])]
    return (json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def _output(output: dict[str, Any], hide: Hide) -> dict[str, Any]:
    kind = output.get("output_type")
    if kind == "error":
        ename, evalue = str(output.get("ename", "")), hide(str(output.get("evalue", "")))
        frames = short_traceback("\n".join(output.get("traceback") or []), ename)
        lines = (["Traceback (last frames):", *frames.splitlines(), ""] if frames else []) + [f"{ename}: {evalue}"]
        return {**output, "evalue": evalue, "traceback": [hide(line) for line in lines]}
    if kind == "stream":
        return {**output, "text": _hidden(output.get("text", ""), hide)}
    if kind in ("display_data", "execute_result"):
        data = output.get("data") or {}
        return {
            **output,
            "data": {mime: _hidden(value, hide) if _textual(mime) else value for mime, value in data.items()},
        }
    return output


def _textual(mime: str) -> bool:
    return mime.startswith("text/") or mime == "image/svg+xml"


def _hidden(value: Any, hide: Hide) -> Any:
    """A notebook text (a string or a list of lines) with host paths rewritten."""
    if isinstance(value, str):
        return hide(value)
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return [hide(line) for line in value]
    return value
