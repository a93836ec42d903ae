"""Keep replayed thread history within a character budget, in a shape every API accepts."""

from __future__ import annotations

import json
from typing import Any

#: Starts the user-role message that carries the output of a fenced code block back to the
#: model; such a message continues an exchange instead of starting one.
FENCED_OUTPUT_HEADER = "Output of the code block above:"

_MISSING_RESULT = "(no result was recorded for this call)"

#: The roles a chat completions server knows; anything else stored (e.g. our ``notice``
#: entries) is never sent.
WIRE_ROLES = frozenset({"system", "user", "assistant", "tool"})

#: A key of an assistant message that lives only within its turn: the Responses API output
#: items the reply came with (its reasoning items first), handed back as they were with the
#: tool results of that turn. Never stored (:func:`stored`), never sent on chat completions
#: (:func:`wire_messages` copies only the keys it knows), never shown.
TURN_ITEMS = "_turn_items"


def stored(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` as the thread's history keeps it: without what belongs to its turn only."""
    if TURN_ITEMS not in message:
        return message
    return {key: value for key, value in message.items() if key != TURN_ITEMS}


def wire_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` in the shape strict servers accept (llama.cpp's server, vLLM, LiteLLM).

    ``content`` is always present and never null (``""`` beside tool calls); keys that are
    null, unknown to the role (``refusal``, ``audio``, ``function_call``…) or empty
    (``tool_calls: []``) are left out; tool calls are ``{id, type, function: {name,
    arguments}}`` with string arguments. Messages of other roles are dropped.
    """
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role not in WIRE_ROLES:
            continue
        content = message.get("content")
        wire: dict[str, Any] = {"role": role, "content": "" if content is None else content}
        if role == "tool":
            wire["tool_call_id"] = str(message.get("tool_call_id") or "")
        elif isinstance(message.get("name"), str) and message["name"]:
            wire["name"] = message["name"]
        if role == "assistant" and (calls := message.get("tool_calls")):
            wire["tool_calls"] = [_wire_call(call) for call in calls]
        out.append(wire)
    return out


def _wire_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = "{}" if arguments is None else json.dumps(arguments)
    return {
        "id": str(call.get("id") or ""),
        "type": "function",
        "function": {"name": str(function.get("name") or ""), "arguments": arguments},
    }


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


def history_chars(history: list[dict[str, Any]]) -> int:
    """The characters ``history`` costs (see :func:`message_chars`)."""
    return sum(message_chars(m) for m in history)


def message_chars(message: dict[str, Any]) -> int:
    """The characters a message costs: its text plus any tool-call arguments."""
    content = message.get("content")
    size = len(content) if isinstance(content, str) else len(json.dumps(content)) if content else 0
    for call in message.get("tool_calls") or ():
        size += len(str((call.get("function") or {}).get("arguments") or "")) + 40
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
        if message.get("role") not in WIRE_ROLES or message.get("role") == "system":
            continue
        if message.get("role") == "user" and not _is_fenced_output(message):
            exchanges.append([message])
        elif exchanges:
            exchanges[-1].append(message)
    return exchanges


def _is_fenced_output(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, str) and content.startswith(FENCED_OUTPUT_HEADER)
