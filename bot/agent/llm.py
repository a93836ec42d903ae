"""A thin wrapper over ``openai.AsyncOpenAI`` chat completions with typed failures.

Retries are done here, not by the openai client (it counts every kind alike): 408/409/429/
5xx and connection errors up to ``llm.max_retries`` times with exponential backoff that
honours ``Retry-After``; a timeout at most once, because a server that timed out is often
still generating the first answer and every retry queues one more on a one-at-a-time local
server; an unreadable reply up to ``llm.max_retries`` times. Every failure that survives
becomes :class:`LLMError`, whose message is one sentence fit to post in the chat thread
(never the API key, never a stack trace); a refusal because the request is longer than the
model's context is a :class:`ContextLengthError`, so the loop can shrink the history.

Messages are converted to the shape strict servers accept (:func:`~bot.agent.history.wire_messages`)
right before they are sent, whatever the stored history holds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import random
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from bot import metrics
from bot.agent.history import wire_messages
from bot.config import LLMSettings

log = logging.getLogger(__name__)

#: Pause before retrying an unreadable reply (doubles per attempt).
_MALFORMED_BACKOFF_S = 0.2
#: Backoff before retrying a status or connection error: doubles per attempt, up to the cap.
_BACKOFF_S = 0.5
_BACKOFF_CAP_S = 8.0
#: A ``Retry-After`` longer than this is not waited for (the turn would look hung).
_RETRY_AFTER_CAP_S = 60.0
_RETRYABLE_STATUS = frozenset({408, 409, 429})
#: How servers say a request is longer than the model's context: OpenAI and Azure
#: ("maximum context length", code ``context_length_exceeded``), vLLM ("maximum context
#: length"), llama.cpp's server ("exceeds the available context size", "too big compared
#: to KV size"), llama-cpp-python ("exceed context window"), Ollama ("prompt too long;
#: exceeded max context length"), LiteLLM (``ContextWindowExceededError``), Anthropic behind
#: a proxy ("prompt is too long"), and the generic "too many tokens".
_CONTEXT_EXCEEDED = re.compile(
    r"context[ _-]?length|context[ _-]?window|context size|maximum context|max context|"
    r"too many tokens|prompt is too long|prompt too long|input is too long|too big compared to kv|"
    r"exceeds? (?:the )?(?:available |model'?s? )?context",
    re.IGNORECASE,
)
_TOKENS_LIMIT = re.compile(r"(?:maximum context length|context window|context size)\D{0,30}?(\d[\d,]*)", re.I)
_TOKENS_ASKED = re.compile(
    r"(?:resulted in|requested|request has|requested tokens \(|prompt has)\D{0,12}?(\d[\d,]*)", re.I
)


#: Receives the reply's text so far (the whole of it each time) while a streamed reply arrives.
OnText = Callable[[str], Awaitable[None]]


class LLMError(Exception):
    """The language model could not give an answer; ``str()`` is one user-facing sentence."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ContextLengthError(LLMError):
    """The server refused the request as longer than the model's context.

    ``limit`` and ``requested`` are the token counts the server named, when it named both.
    """

    def __init__(
        self, message: str, *, status: int | None = None, limit: int | None = None, requested: int | None = None
    ) -> None:
        super().__init__(message, status=status)
        self.limit = limit
        self.requested = requested


# --- metrics of each request (the decorator on LLMClient.complete) ---------------------------


class _LLMClient(Protocol):
    @property
    def settings(self) -> LLMSettings: ...


_Client = TypeVar("_Client", bound=_LLMClient)
_P = ParamSpec("_P")
_R = TypeVar("_R")


def observe_llm(
    complete: Callable[Concatenate[_Client, _P], Awaitable[_R]],
) -> Callable[Concatenate[_Client, _P], Awaitable[_R]]:
    """Decorates ``LLMClient.complete``: its latency and tokens by model, its failures by kind,
    and when its endpoint last answered or failed (for readiness)."""

    @functools.wraps(complete)
    async def observed(self: _Client, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        settings = self.settings
        model = kwargs.get("model")
        model = model if isinstance(model, str) and model else settings.model
        seen = metrics.endpoint_seen(settings.base_url)
        started = time.monotonic()
        try:
            completion = await complete(self, *args, **kwargs)
        except Exception as exc:
            seen.last_failure = time.monotonic()
            metrics.LLM_SECONDS.labels(model).observe(seen.last_failure - started)
            metrics.ERRORS.labels(f"llm_{llm_error_kind(exc)}").inc()
            raise
        seen.last_ok = time.monotonic()
        metrics.LLM_SECONDS.labels(model).observe(seen.last_ok - started)
        usage = getattr(completion, "usage", None)
        metrics.LLM_TOKENS.labels(model, "prompt").inc(max(0, getattr(usage, "prompt_tokens", 0) or 0))
        metrics.LLM_TOKENS.labels(model, "completion").inc(max(0, getattr(usage, "completion_tokens", 0) or 0))
        return completion

    return observed


def llm_error_kind(exc: BaseException) -> str:
    """One of :data:`bot.metrics.LLM_ERROR_KINDS` for a failed request (an ``LLMError`` and its cause)."""
    if isinstance(exc, ContextLengthError):
        return "context_length"
    status = exc.status if isinstance(exc, LLMError) else None
    if status is not None:
        if status in (401, 403):
            return "auth"
        if status == 404:
            return "not_found"
        if status == 429:
            return "rate_limited"
        return "server_error" if status >= 500 else "refused"
    cause = exc.__cause__
    if isinstance(cause, openai.APITimeoutError):  # before APIConnectionError: a subclass of it
        return "timeout"
    if isinstance(cause, openai.APIConnectionError):
        return "connection"
    if isinstance(cause, (openai.APIResponseValidationError, ValueError)) or type(cause).__name__ == "_Unreadable":
        return "unreadable"
    return "other"


@dataclass
class Usage:
    """Tokens spent, summed over requests."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

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
    finish_reason: str | None = None

    @property
    def cut_off(self) -> bool:
        """True when the server stopped the reply at its length limit (``max_tokens``)."""
        return self.finish_reason == "length"

    def message(self) -> dict[str, Any]:
        """The reply as an OpenAI-format assistant message, ready to replay as history.

        ``content`` is always a string (``""`` beside tool calls): strict servers reject null.
        """
        message: dict[str, Any] = {"role": "assistant", "content": self.content or ""}
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
        #: Set when the server refused a streamed request that it answers unstreamed: ask it plainly.
        self._stream_refused = False
        self._client = client or openai.AsyncOpenAI(
            base_url=settings.base_url,
            # Local servers (Ollama, vLLM) accept any key, but the client insists on one.
            api_key=settings.api_key.get_secret_value() or "not-needed",
            timeout=settings.request_timeout_s,
            max_retries=0,  # retried in complete(), where a timeout is retried once at most
        )

    @property
    def settings(self) -> LLMSettings:
        """The ``llm`` settings this client was made with."""
        return self._settings

    async def close(self) -> None:
        """Close the HTTP connections."""
        await self._client.close()

    @observe_llm  # latency, tokens and failures; when the endpoint last answered (readiness)
    async def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        model: str | None = None,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | None = None,
        on_text: OnText | None = None,
    ) -> Completion:
        """One chat completion; raises :class:`LLMError` on failure.

        With ``on_text`` the reply is streamed and ``on_text`` gets its text so far as it grows
        (from the start again if a retry begins anew). A server that refuses streamed requests
        is asked unstreamed, from then on.
        """
        kwargs: dict[str, Any] = {"model": model or self._settings.model, "messages": wire_messages(messages)}
        if tools:
            kwargs["tools"] = tools
            if tool_choice is not None:
                kwargs["tool_choice"] = tool_choice
        if self._settings.temperature is not None:
            kwargs["temperature"] = self._settings.temperature
        if self._settings.max_tokens is not None:
            kwargs["max_tokens"] = self._settings.max_tokens
        retries = self._settings.max_retries
        timeouts = 0
        for attempt in range(retries + 1):
            last = attempt >= retries
            try:
                # The typed ``chat.completions.create`` runs every message of the history through
                # openai's parameter transformer (tens of ms per call for a long thread); our
                # messages are plain JSON already, so post them as they are.
                if on_text is not None and not self._stream_refused:
                    streamed = await self._streamed(kwargs, on_text)
                    if streamed is not None:
                        return streamed
                response = await self._client.post(
                    "/chat/completions", body=kwargs, cast_to=ChatCompletion, options={"max_retries": 0}
                )
                return _parse(response)
            # ValueError: the openai client lets json.JSONDecodeError through for a non-JSON body.
            except (_Unreadable, openai.APIResponseValidationError, ValueError) as exc:
                log.warning("unreadable LLM reply (attempt %d/%d): %s", attempt + 1, retries + 1, exc)
                if last:
                    raise LLMError("The language model sent a reply that could not be read; please try again.") from exc
                pause = _MALFORMED_BACKOFF_S * 2**attempt
            except openai.APITimeoutError as exc:
                timeouts += 1
                if last or timeouts > 1:
                    raise _to_llm_error(exc, kwargs["model"], self._settings.request_timeout_s) from exc
                log.warning("LLM request timed out after %gs; retrying once", self._settings.request_timeout_s)
                pause = 0.0
            except openai.OpenAIError as exc:
                if last or not _retryable(exc):
                    raise _to_llm_error(exc, kwargs["model"], self._settings.request_timeout_s) from exc
                pause = _backoff(exc, attempt)
                log.warning("LLM request failed (%r); retry %d/%d in %.1fs", exc, attempt + 1, retries, pause)
            await asyncio.sleep(pause)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _streamed(self, kwargs: dict[str, Any], on_text: OnText) -> Completion | None:
        """The reply streamed (Server-Sent Events); None when the server will not stream it."""
        body = {**kwargs, "stream": True, "stream_options": {"include_usage": True}}
        try:
            stream = await self._client.post(
                "/chat/completions",
                body=body,
                cast_to=ChatCompletion,
                options={"max_retries": 0},
                stream=True,
                stream_cls=openai.AsyncStream[ChatCompletionChunk],
            )
        except openai.BadRequestError as exc:
            if is_context_exceeded(_error_message(exc), exc.body):
                raise
            log.warning("the LLM server refused a streamed request (%s); asking without streaming from now on", exc)
            self._stream_refused = True
            return None
        reply = _StreamedReply()
        async with stream:
            # A stream cut off mid-way raises the client's APITimeoutError or APIConnectionError: retried.
            async for chunk in stream:
                if reply.add(chunk):
                    try:
                        await on_text(reply.text)
                    except Exception:  # showing the draft is cosmetic: the answer must not depend on it
                        log.exception("streamed text callback failed")
        if not reply.chunks:
            log.warning("the LLM server sent no chunks for a streamed request; asking without streaming from now on")
            self._stream_refused = True
            return None
        completion = reply.completion()
        if not reply.usage_reported:
            # Some servers (llama-cpp-python) ignore stream_options.include_usage: count about
            # four characters a token rather than nothing, so usage and budgets see the turn.
            sent = len(json.dumps(body["messages"], ensure_ascii=False))
            written = len(completion.content or "") + sum(len(c.arguments) for c in completion.tool_calls)
            completion = dataclasses.replace(completion, usage=Usage(sent // 4, max(1, written // 4)))
        return completion


def _retryable(exc: openai.OpenAIError) -> bool:
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in _RETRYABLE_STATUS or exc.status_code >= 500
    return isinstance(exc, openai.APIConnectionError)


def _backoff(exc: openai.OpenAIError, attempt: int) -> float:
    """Seconds to wait: the server's ``Retry-After`` when it gives a sane one, else exponential."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or {}
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            wait = float(headers.get(name, "")) * scale
        except ValueError:
            continue
        if 0 <= wait <= _RETRY_AFTER_CAP_S:
            return wait
    return min(_BACKOFF_S * 2.0**attempt, _BACKOFF_CAP_S) * random.uniform(0.75, 1.0)


class _Unreadable(Exception):
    """The response parsed as HTTP 200 but is not a chat completion."""


def _parse(response: Any) -> Completion:
    """Read a completion leniently: local servers omit ids, ``usage`` or ``finish_reason``."""
    choices = getattr(response, "choices", None)
    if not choices:
        raise _Unreadable(f"no choices in {type(response).__name__}")
    choice = choices[0]
    message = getattr(choice, "message", None)
    if message is None:
        raise _Unreadable("a choice without a message")
    calls = []
    for call in getattr(message, "tool_calls", None) or ():
        function = getattr(call, "function", None)
        if function is None:
            raise _Unreadable(f"tool call of unknown type {getattr(call, 'type', '?')!r}")
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
        usage = Usage(getattr(reported, "prompt_tokens", 0) or 0, getattr(reported, "completion_tokens", 0) or 0)
    content = getattr(message, "content", None)
    return Completion(
        content=content if isinstance(content, str) else None,
        tool_calls=tuple(calls),
        usage=usage,
        finish_reason=getattr(choice, "finish_reason", None),
    )


@dataclass
class _StreamedReply:
    """A streamed reply put together from its chunks, as leniently as :func:`_parse` reads one."""

    pieces: list[str] = field(default_factory=list)
    #: index → [id, name, argument pieces]
    calls: dict[int, list[Any]] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    usage_reported: bool = False
    finish_reason: str | None = None
    chunks: int = 0

    @property
    def text(self) -> str:
        """The content so far."""
        return "".join(self.pieces)

    def add(self, chunk: ChatCompletionChunk) -> bool:
        """Take one chunk in; True when it added text."""
        if (reported := getattr(chunk, "usage", None)) is not None:
            self.usage = Usage(
                getattr(reported, "prompt_tokens", 0) or 0, getattr(reported, "completion_tokens", 0) or 0
            )
            self.usage_reported = True
        choices = getattr(chunk, "choices", None) or []
        if not choices:
            return False
        self.chunks += 1
        choice = choices[0]
        self.finish_reason = getattr(choice, "finish_reason", None) or self.finish_reason
        delta = getattr(choice, "delta", None)
        if delta is None:
            return False
        for position, call in enumerate(getattr(delta, "tool_calls", None) or ()):
            index = getattr(call, "index", None)
            slot = self.calls.setdefault(index if isinstance(index, int) else position, ["", "", []])
            slot[0] = getattr(call, "id", None) or slot[0]
            function = getattr(call, "function", None)
            if function is not None:
                slot[1] = getattr(function, "name", None) or slot[1]
                arguments = getattr(function, "arguments", None)
                if arguments is not None:
                    slot[2].append(arguments if isinstance(arguments, str) else json.dumps(arguments))
        content = getattr(delta, "content", None)
        if isinstance(content, str) and content:
            self.pieces.append(content)
            return True
        return False

    def completion(self) -> Completion:
        """The whole reply."""
        calls = tuple(
            ToolCall(id=call_id or f"call_{uuid.uuid4().hex[:24]}", name=name, arguments="".join(arguments))
            for call_id, name, arguments in (self.calls[index] for index in sorted(self.calls))
        )
        text = self.text
        return Completion(content=text or None, tool_calls=calls, usage=self.usage, finish_reason=self.finish_reason)


def _to_llm_error(exc: openai.OpenAIError, model: str, timeout_s: float) -> LLMError:
    """One sentence for the chat thread; the details go to the log."""
    log.warning("LLM request failed: %r", exc)
    if isinstance(exc, openai.APITimeoutError):
        return LLMError(f"The language model did not answer within {timeout_s:g} seconds; please try again.")
    if isinstance(exc, openai.APIConnectionError):
        # The URL tried, less the endpoint, query and any user:password: the configured llm.base_url.
        tried = str(exc.request.url.copy_with(query=None, userinfo=b"")).removesuffix("/chat/completions")
        return LLMError(f"The language model at {tried} could not be reached; please try again later.")
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
        message = _error_message(exc)
        detail = _short(message)
        sentence = f"The language model refused the request (HTTP {status}{': ' + detail if detail else ''})."
        if status in (400, 413, 422) and is_context_exceeded(message, exc.body):
            return ContextLengthError(
                sentence,
                status=status,
                limit=_number(_TOKENS_LIMIT, message),
                requested=_number(_TOKENS_ASKED, message),
            )
    return LLMError(sentence, status=status)


def is_context_exceeded(message: str, body: object = None) -> bool:
    """True when an error message (or its body's ``code``/``type``) says the context was exceeded."""
    codes = ""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict):
            codes = f"{inner.get('code') or ''} {inner.get('type') or ''}"
    return bool(_CONTEXT_EXCEEDED.search(f"{message} {codes.replace('_', ' ')}"))


def _number(pattern: re.Pattern[str], text: str) -> int | None:
    match = pattern.search(text)
    return int(match.group(1).replace(",", "")) if match else None


def _error_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
        if isinstance(inner, str):  # Ollama and some proxies: {"error": "text"}
            return inner
    if isinstance(body, str):
        return body
    return ""


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split()).rstrip(".")
    return text if len(text) <= limit else text[: limit - 1] + "…"
