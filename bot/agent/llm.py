"""A thin wrapper over ``openai.AsyncOpenAI`` chat completions with typed failures.

Transport retries (timeouts, connection errors, 408/409/429/5xx with exponential backoff
that honours ``Retry-After``) are the openai client's own, configured from
``llm.max_retries``. This module adds a retry for replies that cannot be read and turns
every failure that survives the retries into :class:`LLMError`, whose message is one
sentence fit to post in the chat thread (never the API key, never a stack trace).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import openai
from openai.types.chat import ChatCompletion

from bot.config import LLMSettings

log = logging.getLogger(__name__)

#: Pause before retrying an unreadable reply (doubles per attempt).
_MALFORMED_BACKOFF_S = 0.2


class LLMError(Exception):
    """The language model could not give an answer; ``str()`` is one user-facing sentence."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Usage:
    """Tokens spent, summed over requests."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens

    def add(self, other: Usage) -> None:
        """Add ``other`` into this one."""
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens


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

    def message(self) -> dict[str, Any]:
        """The reply as an OpenAI-format assistant message, ready to replay as history."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        return message


class LLMClient:
    """Sends chat completion requests to one OpenAI-compatible endpoint."""

    def __init__(self, settings: LLMSettings, *, client: openai.AsyncOpenAI | None = None) -> None:
        self._settings = settings
        self._client = client or openai.AsyncOpenAI(
            base_url=settings.base_url,
            # Local servers (Ollama, vLLM) accept any key, but the client insists on one.
            api_key=settings.api_key.get_secret_value() or "not-needed",
            timeout=settings.request_timeout_s,
            max_retries=settings.max_retries,
        )

    async def close(self) -> None:
        """Close the HTTP connections."""
        await self._client.close()

    async def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        model: str | None = None,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | None = None,
    ) -> Completion:
        """One non-streaming chat completion; raises :class:`LLMError` on failure."""
        kwargs: dict[str, Any] = {"model": model or self._settings.model, "messages": messages}
        if tools:
            kwargs["tools"] = tools
            if tool_choice is not None:
                kwargs["tool_choice"] = tool_choice
        if self._settings.temperature is not None:
            kwargs["temperature"] = self._settings.temperature
        attempts = self._settings.max_retries + 1
        for attempt in range(attempts):
            try:
                # The typed ``chat.completions.create`` runs every message of the history through
                # openai's parameter transformer (tens of ms per call for a long thread); our
                # messages are plain JSON already, so post them as they are.
                response = await self._client.post("/chat/completions", body=kwargs, cast_to=ChatCompletion)
                return _parse(response)
            # ValueError: the openai client lets json.JSONDecodeError through for a non-JSON body.
            except (_Unreadable, openai.APIResponseValidationError, ValueError) as exc:
                log.warning("unreadable LLM reply (attempt %d/%d): %s", attempt + 1, attempts, exc)
            except openai.OpenAIError as exc:
                raise _to_llm_error(exc, kwargs["model"], self._settings.request_timeout_s) from exc
            if attempt + 1 < attempts:
                await asyncio.sleep(_MALFORMED_BACKOFF_S * 2**attempt)
        raise LLMError("The language model sent a reply that could not be read; please try again.")


class _Unreadable(Exception):
    """The response parsed as HTTP 200 but is not a chat completion."""


def _parse(response: Any) -> Completion:
    choices = getattr(response, "choices", None)
    if not choices:
        raise _Unreadable(f"no choices in {type(response).__name__}")
    message = choices[0].message
    calls = []
    for call in message.tool_calls or ():
        function = getattr(call, "function", None)
        if function is None:
            raise _Unreadable(f"tool call of unknown type {getattr(call, 'type', '?')!r}")
        calls.append(ToolCall(id=call.id, name=function.name, arguments=function.arguments or ""))
    usage = Usage()
    if response.usage is not None:
        usage = Usage(response.usage.prompt_tokens or 0, response.usage.completion_tokens or 0)
    return Completion(content=message.content, tool_calls=tuple(calls), usage=usage)


def _to_llm_error(exc: openai.OpenAIError, model: str, timeout_s: float) -> LLMError:
    """One sentence for the chat thread; the details go to the log."""
    log.warning("LLM request failed: %r", exc)
    if isinstance(exc, openai.APITimeoutError):
        return LLMError(f"The language model did not answer within {timeout_s:g} seconds; please try again.")
    if isinstance(exc, openai.APIConnectionError):
        return LLMError("The language model could not be reached; please try again later.")
    if not isinstance(exc, openai.APIStatusError):
        return LLMError("The language model request failed; please try again.")
    status = exc.status_code
    if status in (401, 403):
        sentence = (
            f"The language model rejected the bot's API key (HTTP {status}); "
            "the bot's operator should check llm.api_key."
        )
    elif status == 404:
        sentence = (
            f"The language model endpoint does not know the model '{model}' (HTTP 404); "
            "the bot's operator should check llm.model."
        )
    elif status == 429:
        sentence = "The language model is rate-limiting requests (HTTP 429); please try again in a minute."
    elif status >= 500:
        sentence = f"The language model had a server error (HTTP {status}); please try again."
    else:
        detail = _short(_error_message(exc))
        sentence = f"The language model refused the request (HTTP {status}{': ' + detail if detail else ''})."
    return LLMError(sentence, status=status)


def _error_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
    return ""


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split()).rstrip(".")
    return text if len(text) <= limit else text[: limit - 1] + "…"
