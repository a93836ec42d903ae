"""The Responses API on the wire (``POST /responses``): the request body, and the reply read
leniently, whole or as its stream of events.

The thread's messages stay in the chat completions shape (that is what the store keeps); they
are turned into Responses input items here, per request: the first system message becomes
``instructions``, an assistant's tool calls ``function_call`` items, a tool result a
``function_call_output``. An assistant message of this turn that came with reasoning carries
the reply's own output items (:data:`~bot.agent.history.TURN_ITEMS`): those are sent back as
they came, reasoning first, so the model keeps its reasoning between the tool calls of a turn.
Requests are sent with ``store: false`` (the thread's history is ours) and ask for the
reasoning as ``encrypted_content``; the reasoning is never read as text.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from bot.agent.history import TURN_ITEMS, WIRE_ROLES
from bot.agent.params import is_reasoning_model
from bot.agent.reasoning import visible_text
from bot.agent.reply import Completion, ReplyFailed, ToolCall, Unreadable, Usage

PATH = "/responses"
ENCRYPTED_REASONING = "reasoning.encrypted_content"


def responses_body(
    messages: list[dict[str, Any]],
    *,
    model: str,
    tools: list[dict[str, Any]] | None,
    tool_choice: str | None,
    temperature: float | None,
    max_tokens: int | None,
) -> dict[str, Any]:
    """The request body: ``store: false``, the reasoning asked for encrypted, no ``temperature``
    for reasoning models."""
    instructions, items = input_items(messages)
    body: dict[str, Any] = {"model": model, "input": items, "store": False, "include": [ENCRYPTED_REASONING]}
    if instructions:
        body["instructions"] = instructions
    if tools:
        body["tools"] = function_tools(tools)
        if tool_choice is not None:
            body["tool_choice"] = tool_choice
    if temperature is not None and not is_reasoning_model(model):
        body["temperature"] = temperature
    if max_tokens is not None:
        body["max_output_tokens"] = max_tokens
    return body


def streamed_body(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` asked as a stream of events."""
    return {**body, "stream": True}


def sent_chars(body: dict[str, Any]) -> int:
    """The characters of what the request sent to the model (for usage a server did not report)."""
    return len(json.dumps(body["input"], ensure_ascii=False)) + len(body.get("instructions") or "")


def function_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat completions function tools (``{"type": "function", "function": {...}}``, what every
    :class:`~bot.agent.loop.Tool` gives) as Responses function tools (flat: name, description,
    parameters). ``strict`` is false unless the tool asks for it: on the Responses API a missing
    ``strict`` means true, which refuses any schema not written for it."""
    out = []
    for tool in tools:
        function = tool.get("function")
        if tool.get("type") != "function" or not isinstance(function, dict):
            out.append(tool)  # already a Responses tool
            continue
        flat: dict[str, Any] = {"type": "function", "name": function.get("name", "")}
        if "description" in function:
            flat["description"] = function["description"]
        flat["parameters"] = function.get("parameters") or {"type": "object", "properties": {}}
        flat["strict"] = bool(function.get("strict", False))
        out.append(flat)
    return out


def input_items(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """``(instructions, input items)`` for chat-shaped ``messages``; roles the model does not
    know (our notices) are left out, as on chat completions."""
    instructions = ""
    items: list[dict[str, Any]] = []
    for position, message in enumerate(messages):
        role = message.get("role")
        if role not in WIRE_ROLES:
            continue
        content = message.get("content")
        text = content if isinstance(content, str) else "" if content is None else json.dumps(content)
        if role == "system" and position == 0:
            instructions = text
        elif role == "tool":
            items.append(
                {"type": "function_call_output", "call_id": str(message.get("tool_call_id") or ""), "output": text}
            )
        elif role == "assistant" and (own := message.get(TURN_ITEMS)):
            items.extend(own)
        elif role == "assistant":
            if text:
                items.append({"role": "assistant", "content": text})
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                arguments = function.get("arguments")
                if not isinstance(arguments, str):
                    arguments = "{}" if arguments is None else json.dumps(arguments)
                items.append(
                    {
                        "type": "function_call",
                        "call_id": str(call.get("id") or ""),
                        "name": str(function.get("name") or ""),
                        "arguments": arguments,
                    }
                )
        else:
            items.append({"role": role, "content": text})
    return instructions, items


def _usage(reported: object) -> Usage:
    if not isinstance(reported, dict):
        return Usage()
    details = reported.get("output_tokens_details")
    reasoning = details.get("reasoning_tokens") if isinstance(details, dict) else None
    return Usage(
        _count(reported.get("input_tokens")),
        _count(reported.get("output_tokens")),
        _count(reasoning),
    )


def _count(value: object) -> int:
    return value if isinstance(value, int) and value > 0 else 0


def parse_response(response: object, items: list[dict[str, Any]] | None = None) -> Completion:
    """Read a Responses API reply leniently (``items``: its output items, when a stream gave them)."""
    if not isinstance(response, dict):
        raise Unreadable(f"a {type(response).__name__} where a response was expected")
    if items is None:
        output = response.get("output")
        if not isinstance(output, list):
            raise Unreadable("a response without output")
        items = [item for item in output if isinstance(item, dict)]
    if response.get("status") == "failed":
        raise ReplyFailed(_failure(response.get("error")))
    texts: list[str] = []
    calls: list[ToolCall] = []
    reasoned = False
    for item in items:
        kind = item.get("type")
        if kind == "message":
            texts.append("".join(_part_text(part) for part in item.get("content") or () if isinstance(part, dict)))
        elif kind == "function_call":
            arguments = item.get("arguments")
            if arguments is not None and not isinstance(arguments, str):
                arguments = json.dumps(arguments)
            calls.append(
                ToolCall(
                    id=str(item.get("call_id") or item.get("id") or f"call_{uuid.uuid4().hex[:24]}"),
                    name=str(item.get("name") or ""),
                    arguments=arguments or "",
                )
            )
        elif kind == "reasoning":
            reasoned = True
    text = visible_text("\n\n".join(t for t in texts if t))
    return Completion(
        content=text or None,
        tool_calls=tuple(calls),
        usage=_usage(response.get("usage")),
        finish_reason=_finish_reason(response, calls),
        turn_items=tuple(items) if reasoned else (),
    )


def _part_text(part: dict[str, Any]) -> str:
    kind = part.get("type")
    value = part.get("text") if kind in ("output_text", "text") else part.get("refusal") if kind == "refusal" else ""
    return value if isinstance(value, str) else ""


def _finish_reason(response: dict[str, Any], calls: list[ToolCall]) -> str:
    if response.get("status") == "incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        return "length" if reason in (None, "max_output_tokens") else str(reason)
    return "tool_calls" if calls else "stop"


def _failure(error: object) -> str:
    if isinstance(error, dict):
        return str(error.get("code") or error.get("message") or "failed")
    return "failed"


@dataclass
class ResponsesStream:
    """A streamed reply put together from its events: text from ``response.output_text.delta``
    (nothing else is shown: reasoning has events of its own), the finished items from
    ``response.output_item.done`` (their reasoning is complete only there), status and usage
    from ``response.completed`` / ``response.incomplete``."""

    #: output_index → the text pieces of that message item
    texts: dict[int, list[str]] = field(default_factory=dict)
    #: output_index → the finished item
    items: dict[int, dict[str, Any]] = field(default_factory=dict)
    final: dict[str, Any] | None = None
    events: int = 0

    @property
    def text(self) -> str:
        """The answer's text so far (no reasoning)."""
        return visible_text("\n\n".join("".join(self.texts[index]) for index in sorted(self.texts)))

    @property
    def usage_reported(self) -> bool:
        """True when the last event reported usage."""
        return self.final is not None and isinstance(self.final.get("usage"), dict)

    @property
    def empty(self) -> bool:
        """True when the server sent no event at all."""
        return not self.events

    def add(self, event: object) -> bool:
        """Take one event in; True when it added text to show."""
        if not isinstance(event, dict):
            return False
        self.events += 1
        kind = event.get("type")
        if kind == "response.output_text.delta":
            delta = event.get("delta")
            if isinstance(delta, str) and delta:
                self.texts.setdefault(_index(event), []).append(delta)
                return True
        elif kind == "response.output_item.done":
            if isinstance(item := event.get("item"), dict):
                self.items[_index(event)] = item
        elif kind in ("response.completed", "response.incomplete"):
            if isinstance(response := event.get("response"), dict):
                self.final = response
        elif kind == "response.failed":
            response = event.get("response")
            raise ReplyFailed(_failure(response.get("error") if isinstance(response, dict) else None))
        elif kind == "error":
            raise ReplyFailed(_failure(event))
        return False

    def completion(self) -> Completion:
        """The whole reply; :class:`Unreadable` when the stream ended before its last event
        (``response.completed`` or ``response.incomplete``): a stream closed early holds part of
        a reply, which must not pass for all of it."""
        if self.final is None:
            raise Unreadable("a stream that ended before response.completed")
        items = [self.items[index] for index in sorted(self.items)] or None
        final = self.final
        if items is None and not isinstance(final.get("output"), list):
            if not self.texts:
                raise Unreadable("a stream without output items")
            items = [  # a server that streamed text but never listed the items it made
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "".join(pieces)}]}
                for _, pieces in sorted(self.texts.items())
            ]
        return parse_response(final, items)


def _index(event: dict[str, Any]) -> int:
    index = event.get("output_index")
    return index if isinstance(index, int) else 0
