"""Collects one execution's iopub outputs within a fixed memory budget.

Text streams keep a head and a tail of ``max_bytes`` in total and mark the cut; rich
display outputs keep the first and last ones within ``max_display_bytes`` (each rich
payload whole, up to a quarter of it). Memory stays
bounded however much the kernel prints, because the middle is dropped while receiving.
"""

from __future__ import annotations

import base64
import json
import re
from collections import deque
from typing import Any

from kernels.seam.result import DisplayOutput, ErrorInfo, StreamChunk
from kernels.seam.wire import MAX_DISPLAY_BYTES

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_BINARY_MIME = ("image/png", "image/jpeg", "image/gif")


def strip_ansi(text: str) -> str:
    """Remove ANSI colour/cursor escape sequences."""
    return _ANSI.sub("", text)


def cut_marker(dropped: int) -> str:
    """The text put where output was cut out."""
    return f"\n… [{dropped} bytes truncated] …\n"


class _TextBudget:
    """Head + tail of a sequence of named text chunks, ``max_bytes`` (UTF-8) in total."""

    def __init__(self, max_bytes: int) -> None:
        self.head_budget = max_bytes // 2
        self.tail_budget = max_bytes - self.head_budget
        self.head: list[StreamChunk] = []
        self.head_bytes = 0
        self.tail: deque[StreamChunk] = deque()
        self.tail_bytes = 0
        self.dropped = 0

    def add(self, name: str, text: str) -> None:
        data = text.encode()
        room = self.head_budget - self.head_bytes
        if room > 0:
            part = data[:room].decode(errors="ignore")
            if part:
                self.head.append(StreamChunk(name, part))
                used = len(part.encode())
                self.head_bytes += used
                data = data[used:]
        if not data:
            return
        if len(data) > self.tail_budget:
            self.dropped += len(data) - self.tail_budget
            data = data[-self.tail_budget :]
        self.tail.append(StreamChunk(name, data.decode(errors="ignore")))
        self.tail_bytes += len(data)
        while self.tail_bytes > self.tail_budget:
            first = self.tail.popleft()
            size = len(first.text.encode())
            excess = self.tail_bytes - self.tail_budget
            if size > excess:
                kept = first.text.encode()[excess:].decode(errors="ignore")
                self.tail.appendleft(StreamChunk(first.name, kept))
                self.tail_bytes -= size - len(kept.encode())
                self.dropped += size - len(kept.encode())
            else:
                self.tail_bytes -= size
                self.dropped += size

    def chunks(self) -> list[StreamChunk]:
        middle: list[StreamChunk] = []
        if self.dropped:
            name = self.tail[0].name if self.tail else "stdout"
            middle = [StreamChunk(name, cut_marker(self.dropped))]
        return _merge([*self.head, *middle, *self.tail])


def _merge(chunks: list[StreamChunk]) -> list[StreamChunk]:
    merged: list[StreamChunk] = []
    for chunk in chunks:
        if merged and merged[-1].name == chunk.name:
            merged[-1] = StreamChunk(chunk.name, merged[-1].text + chunk.text)
        else:
            merged.append(chunk)
    return merged


def _bundle(
    data: dict[str, Any], metadata: dict[str, Any] | None, max_text: int, max_rich: int
) -> tuple[DisplayOutput, int]:
    """Decode binary MIME types; cut overlong ``text/plain``; keep other payloads whole (a cut
    SVG, HTML page or chart spec is broken, and the notebook export keeps them as sent) up to
    ``max_rich`` each, and leave out larger ones. Returns the output and its size."""
    decoded: dict[str, Any] = {}
    size = 0
    for mime, value in data.items():
        if mime in _BINARY_MIME and isinstance(value, str):
            value = base64.b64decode(value)
        elif mime == "text/plain" and isinstance(value, str) and len(value) > max_text:
            value = value[: max_text // 2] + cut_marker(len(value) - max_text) + value[-max_text // 2 :]
        payload = len(value) if isinstance(value, (str, bytes)) else _json_size(value)
        if payload > max_rich and mime not in _BINARY_MIME and mime != "text/plain":
            continue  # too large to keep whole; its PNG, if any, stays
        decoded[mime] = value
        size += payload
    return DisplayOutput(decoded, dict(metadata or {})), size


def _json_size(value: Any) -> int:
    """About how many bytes a JSON payload (a chart spec) holds."""
    try:
        return len(json.dumps(value, separators=(",", ":")))
    except (TypeError, ValueError):
        return 64


class OutputCollector:
    """Accumulates what one execution shows, in arrival order, within budgets."""

    def __init__(self, max_bytes: int, max_display_bytes: int = MAX_DISPLAY_BYTES) -> None:
        self.max_bytes = max_bytes
        self.max_display_bytes = max_display_bytes
        self._max_rich = max(max_bytes, max_display_bytes // 4)
        self.result: DisplayOutput | None = None
        self.error: ErrorInfo | None = None
        self.execution_count: int | None = None
        self._reset()
        self._clear_on_next = False

    def _reset(self) -> None:
        self._text = _TextBudget(self.max_bytes)
        self._head: list[tuple[str | None, DisplayOutput]] = []
        self._head_bytes = 0
        self._tail: deque[tuple[str | None, DisplayOutput, int]] = deque()
        self._tail_bytes = 0
        self.dropped_displays = 0

    def _maybe_clear(self) -> None:
        if self._clear_on_next:
            self._clear_on_next = False
            self._reset()

    @property
    def truncated(self) -> bool:
        """Whether any text or display output was dropped."""
        return bool(self._text.dropped or self.dropped_displays)

    def handle(self, msg_type: str, content: dict[str, Any]) -> None:
        """Take one iopub message (already matched to this execution)."""
        if msg_type == "stream":
            self._maybe_clear()
            self._text.add(content.get("name", "stdout"), content.get("text", ""))
        elif msg_type == "display_data":
            self._maybe_clear()
            self._display(content)
        elif msg_type == "update_display_data":
            self._update_display(content)
        elif msg_type == "execute_result":
            self._maybe_clear()
            self.result, _ = _bundle(content.get("data", {}), content.get("metadata"), self.max_bytes, self._max_rich)
            self.execution_count = content.get("execution_count", self.execution_count)
        elif msg_type == "error":
            self._maybe_clear()
            self.error = ErrorInfo(
                ename=content.get("ename", ""),
                evalue=strip_ansi(content.get("evalue", "")),
                traceback=strip_ansi("\n".join(content.get("traceback", []))),
            )
        elif msg_type == "execute_input":
            self.execution_count = content.get("execution_count", self.execution_count)
        elif msg_type == "clear_output":
            if content.get("wait"):
                self._clear_on_next = True
            else:
                self._reset()

    def _display(self, content: dict[str, Any]) -> None:
        display_id = (content.get("transient") or {}).get("display_id")
        output, size = _bundle(content.get("data", {}), content.get("metadata"), self.max_bytes, self._max_rich)
        half = self.max_display_bytes // 2
        if size > half:
            self.dropped_displays += 1  # one output bigger than the whole budget half
            return
        if self._head_bytes + size <= half and not self._tail:
            self._head.append((display_id, output))
            self._head_bytes += size
            return
        self._tail.append((display_id, output, size))
        self._tail_bytes += size
        while self._tail_bytes > self.max_display_bytes - half:
            _, _, dropped = self._tail.popleft()
            self._tail_bytes -= dropped
            self.dropped_displays += 1

    def _update_display(self, content: dict[str, Any]) -> None:
        display_id = (content.get("transient") or {}).get("display_id")
        output, size = _bundle(content.get("data", {}), content.get("metadata"), self.max_bytes, self._max_rich)
        for i, (shown_id, _) in enumerate(self._head):
            if display_id is not None and shown_id == display_id:
                self._head[i] = (display_id, output)
                return
        for i, (shown_id, _, old_size) in enumerate(self._tail):
            if display_id is not None and shown_id == display_id:
                self._tail[i] = (display_id, output, old_size)
                return
        # The display was created by an earlier execution: show the new state here.
        self._display(content)

    def streams(self) -> list[StreamChunk]:
        """stdout/stderr chunks in order (neighbours of the same stream merged)."""
        return self._text.chunks()

    def displays(self) -> list[DisplayOutput]:
        """Kept display outputs, in order."""
        return [out for _, out in self._head] + [out for _, out, _ in self._tail]
