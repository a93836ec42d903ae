"""Chat completions on the wire: the request body, and the reply read leniently (whole or streamed).

A reply's ``reasoning_content`` (llama.cpp, vLLM, DeepSeek) is never read as text: it is not
the answer, and it is not sent back (DeepSeek refuses it in a request's messages).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import pydantic

from bot.agent.history import wire_messages
from bot.agent.params import is_reasoning_model
from bot.agent.reasoning import visible_text
from bot.agent.reply import Completion, ToolCall, Unreadable, Usage

PATH = "/chat/completions"


def chat_body(
    messages: list[dict[str, Any]],
    *,
    model: str,
    tools: list[dict[str, Any]] | None,
    tool_choice: str | None,
    temperature: float | None,
    max_tokens: int | None,
) -> dict[str, Any]:
    """The request body; reasoning models get ``max_completion_tokens`` and no ``temperature``."""
    body: dict[str, Any] = {"model": model, "messages": wire_messages(messages)}
    if tools:
        body["tools"] = tools
        if tool_choice is not None:
            body["tool_choice"] = tool_choice
    reasoning = is_reasoning_model(model)
    if temperature is not None and not reasoning:
        body["temperature"] = temperature
    if max_tokens is not None:
        body["max_completion_tokens" if reasoning else "max_tokens"] = max_tokens
    return body


def streamed_body(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` asked as Server-Sent Events, with a usage chunk at the end."""
    return {**body, "stream": True, "stream_options": {"include_usage": True}}


def sent_chars(body: dict[str, Any]) -> int:
    """The characters of what the request sent to the model (for usage a server did not report)."""
    return len(json.dumps(body["messages"], ensure_ascii=False))


def _get(value: Any, name: str) -> Any:
    """``value``'s field ``name``, whether it came as JSON (a streamed chunk) or as the client's
    type (a whole reply); None when it has none (or is no object at all: a server's garbage)."""
    if isinstance(value, dict):
        return value.get(name)
    return getattr(value, name, None) if isinstance(value, pydantic.BaseModel) else None


def _usage(reported: Any) -> Usage:
    details = _get(reported, "completion_tokens_details")
    reasoning = _get(details, "reasoning_tokens") if details is not None else None
    prompt, completion = _get(reported, "prompt_tokens"), _get(reported, "completion_tokens")
    return Usage(
        prompt if isinstance(prompt, int) else 0,
        completion if isinstance(completion, int) else 0,
        reasoning if isinstance(reasoning, int) else 0,
    )


def parse_chat(response: Any) -> Completion:
    """Read a completion leniently: local servers omit ids, ``usage`` or ``finish_reason``."""
    choices = getattr(response, "choices", None)
    if not choices:
        raise Unreadable(f"no choices in {type(response).__name__}")
    choice = choices[0]
    message = getattr(choice, "message", None)
    if message is None:
        raise Unreadable("a choice without a message")
    calls = []
    for call in getattr(message, "tool_calls", None) or ():
        function = getattr(call, "function", None)
        if function is None:
            raise Unreadable(f"tool call of unknown type {getattr(call, 'type', '?')!r}")
        arguments = getattr(function, "arguments", None)
        if arguments is not None and not isinstance(arguments, str):
            arguments = json.dumps(arguments)  # some servers send the arguments as an object
        calls.append(
            ToolCall(
                id=getattr(call, "id", None) or f"call_{uuid.uuid4().hex[:24]}",
                name=getattr(function, "name", None) or "",
                arguments=arguments or "",
            )
        )
    usage = Usage()
    if (reported := getattr(response, "usage", None)) is not None:
        usage = _usage(reported)
    content = getattr(message, "content", None)
    return Completion(
        content=visible_text(content) if isinstance(content, str) else None,
        tool_calls=tuple(calls),
        usage=usage,
        finish_reason=getattr(choice, "finish_reason", None),
    )


@dataclass
class ChatStream:
    """A streamed reply put together from its chunks, as leniently as :func:`parse_chat` reads one."""

    pieces: list[str] = field(default_factory=list)
    #: index → [id, name, argument pieces]
    calls: dict[int, list[Any]] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    usage_reported: bool = False
    finish_reason: str | None = None
    chunks: int = 0

    @property
    def text(self) -> str:
        """The answer's text so far (no reasoning)."""
        return visible_text("".join(self.pieces))

    def add(self, chunk: Any) -> bool:
        """Take one chunk in; True when it added text to show."""
        if (reported := _get(chunk, "usage")) is not None:
            self.usage = _usage(reported)
            self.usage_reported = True
        choices = _get(chunk, "choices")
        if not isinstance(choices, list) or not choices:
            return False
        self.chunks += 1
        choice = choices[0]
        self.finish_reason = _get(choice, "finish_reason") or self.finish_reason
        delta = _get(choice, "delta")
        if delta is None:
            return False
        for position, call in enumerate(_get(delta, "tool_calls") or ()):
            index = _get(call, "index")
            slot = self.calls.setdefault(index if isinstance(index, int) else position, ["", "", []])
            slot[0] = _get(call, "id") or slot[0]
            function = _get(call, "function")
            if function is not None:
                slot[1] = _get(function, "name") or slot[1]
                arguments = _get(function, "arguments")
                if arguments is not None:
                    slot[2].append(arguments if isinstance(arguments, str) else json.dumps(arguments))
        content = _get(delta, "content")
        if isinstance(content, str) and content:
            self.pieces.append(content)
            return True
        return False

    @property
    def empty(self) -> bool:
        """True when the server sent no chunk at all."""
        return not self.chunks

    def completion(self) -> Completion:
        """The whole reply."""
        calls = tuple(
            ToolCall(id=call_id or f"call_{uuid.uuid4().hex[:24]}", name=name, arguments="".join(arguments))
            for call_id, name, arguments in (self.calls[index] for index in sorted(self.calls))
        )
        text = self.text
        return Completion(content=text or None, tool_calls=calls, usage=self.usage, finish_reason=self.finish_reason)
