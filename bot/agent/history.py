"""Keep replayed thread history within a character budget, in a shape every API accepts."""

from __future__ import annotations

import json
from typing import Any

#: Starts the user-role message that carries the output of a fenced code block back to the
#: model; such a message continues an exchange instead of starting one.
FENCED_OUTPUT_HEADER = "Output of the code block above:"

_MISSING_RESULT = "(no result was recorded for this call)"


def trim_history(history: list[dict[str, Any]], budget_chars: int) -> list[dict[str, Any]]:
    """The newest whole exchanges of ``history`` that fit in ``budget_chars``.

    An exchange is a user message and everything after it up to the next user message.
    Older exchanges are dropped whole, never split, and the result is repaired so that no
    tool message lacks its assistant ``tool_calls`` entry and no call lacks a result.
    """
    kept: list[list[dict[str, Any]]] = []
    total = 0
    for exchange in reversed(_exchanges(history)):
        size = sum(message_chars(m) for m in exchange)
        if total + size > budget_chars:
            break
        kept.append(exchange)
        total += size
    return repair([m for exchange in reversed(kept) for m in exchange])


def message_chars(message: dict[str, Any]) -> int:
    """The characters a message costs: its text plus any tool-call arguments."""
    content = message.get("content")
    size = len(content) if isinstance(content, str) else len(json.dumps(content)) if content else 0
    for call in message.get("tool_calls") or ():
        size += len(call.get("function", {}).get("arguments", "")) + 40
    return size


def repair(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop tool messages without a matching call; add a stub result for calls without one."""
    out: list[dict[str, Any]] = []
    pending: list[str] = []  # call ids of the last assistant message still waiting for results

    def close_pending() -> None:
        out.extend({"role": "tool", "tool_call_id": call_id, "content": _MISSING_RESULT} for call_id in pending)
        pending.clear()

    for message in messages:
        if message.get("role") == "tool":
            if message.get("tool_call_id") in pending:
                pending.remove(message["tool_call_id"])
                out.append(message)
            continue
        close_pending()
        out.append(message)
        if message.get("role") == "assistant":
            pending.extend(call["id"] for call in message.get("tool_calls") or ())
    close_pending()
    return out


def _exchanges(history: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Split into exchanges; messages before the first user message are dropped."""
    exchanges: list[list[dict[str, Any]]] = []
    for message in history:
        if message.get("role") == "system":
            continue
        if message.get("role") == "user" and not _is_fenced_output(message):
            exchanges.append([message])
        elif exchanges:
            exchanges[-1].append(message)
    return exchanges


def _is_fenced_output(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, str) and content.startswith(FENCED_OUTPUT_HEADER)
