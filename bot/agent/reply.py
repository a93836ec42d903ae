"""What one model request gave back, the same whichever API (chat completions, Responses) carried it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bot.agent.history import TURN_ITEMS


@dataclass
class Usage:
    """Tokens spent, summed over requests.

    ``reasoning_tokens`` are the part of ``completion_tokens`` a reasoning model spent thinking:
    billed as output (so cost and budgets already count them), never shown.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0

    def add(self, other: Usage) -> None:
        """Add ``other`` into this one."""
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.reasoning_tokens += other.reasoning_tokens


@dataclass(frozen=True)
class ToolCall:
    """One function call requested by the model (``arguments`` is the raw JSON text)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Completion:
    """The assistant's reply to one request."""

    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    finish_reason: str | None = None
    #: The Responses API output items of a reply that held reasoning, to hand back as they
    #: came with this turn's tool results (never stored, never shown).
    turn_items: tuple[dict[str, Any], ...] = ()

    @property
    def cut_off(self) -> bool:
        """True when the server stopped the reply at its length limit (``max_tokens``)."""
        return self.finish_reason == "length"

    def message(self) -> dict[str, Any]:
        """The reply as an OpenAI-format assistant message, ready to replay as history.

        ``content`` is always a string (``""`` beside tool calls): strict servers reject null.
        A reply with reasoning items carries them under :data:`~bot.agent.history.TURN_ITEMS`,
        which only this turn's Responses requests send and the store never keeps.
        """
        message: dict[str, Any] = {"role": "assistant", "content": self.content or ""}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        if self.turn_items:
            message[TURN_ITEMS] = list(self.turn_items)
        return message


class Unreadable(Exception):
    """The response parsed as HTTP 200 but is not a reply."""


class ReplyFailed(Exception):
    """The server said, inside an HTTP 200 (a streamed ``response.failed`` or ``error`` event),
    that it could not finish the reply; ``str()`` is its code or message."""
