"""A thread's transcript as the store keeps it: messages, and executed cells whose outputs
are nbformat v4 output dicts (:func:`result_to_outputs`), read back in order as a timeline.

Plain data with no dependency on the agent or the notebook export, so the store can keep it
and :mod:`bot.notebook` can read it without either importing the other's world.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import Any

from kernels import DisplayOutput, ExecutionResult

#: MIME types whose data nbformat stores as JSON (any other type holds text).
_JSON_MIME = re.compile(r"^application/(.*\+)?json$")


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


@dataclass(frozen=True, slots=True)
class NewCell:
    """An executed cell as the store records it (:meth:`NewCell.of` an execution result)."""

    code: str
    outputs: list[dict[str, Any]]
    execution_count: int | None
    outcome: str
    duration_s: float

    @classmethod
    def of(cls, code: str, result: ExecutionResult) -> NewCell:
        """The cell that ran ``code`` and produced ``result``."""
        return cls(code, result_to_outputs(result), result.execution_count, result.outcome.value, result.duration_s)


#: What :meth:`bot.store.Transcripts.timeline` returns and :func:`export_notebook` reads, in ``seq`` order.
TimelineEntry = MessageEntry | CellEntry


def result_to_outputs(result: ExecutionResult) -> list[dict[str, Any]]:
    """nbformat v4 outputs of one execution: streams, displays, result, error, notice.

    Consecutive stream chunks of the same name are merged; binary payloads (PNG) are
    stored base64-encoded as nbformat requires. Built as the schema has them, not through
    nbformat's ``new_output``, which validated each against the schema (a millisecond of every
    turn; :func:`bot.notebook.export_notebook` validates the notebook it makes).
    """
    outputs: list[dict[str, Any]] = []
    for chunk in result.streams:
        last = outputs[-1] if outputs else None
        if last is not None and last["output_type"] == "stream" and last["name"] == chunk.name:
            last["text"] += chunk.text
        else:
            outputs.append({"output_type": "stream", "name": chunk.name, "text": chunk.text})
    for display in result.displays:
        outputs.append(
            {"output_type": "display_data", "data": _mime_bundle(display), "metadata": dict(display.metadata)}
        )
    if result.result_data is not None or result.result is not None:
        bundle = _mime_bundle(result.result_data) if result.result_data else {"text/plain": result.result}
        metadata = dict(result.result_data.metadata) if result.result_data else {}
        outputs.append(
            {
                "output_type": "execute_result",
                "data": bundle,
                "metadata": metadata,
                "execution_count": result.execution_count,
            }
        )
    if result.error is not None:
        error = result.error
        outputs.append(
            {
                "output_type": "error",
                "ename": error.ename,
                "evalue": error.evalue,
                "traceback": error.traceback.splitlines(),
            }
        )
    if result.notice:
        outputs.append({"output_type": "stream", "name": "stderr", "text": f"[{result.notice}]\n"})
    return outputs


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
