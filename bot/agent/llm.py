"""The model client: one request at a time to an OpenAI-compatible server, over chat completions
or the Responses API, with retries and typed failures.

**Which API** (``llm.api``): ``chat`` (``POST /chat/completions``), ``responses`` (``POST
/responses``), or ``auto``: OpenAI's own endpoint (api.openai.com) speaks ``responses``; any
other server is asked on chat completions first, and a 404/405 there that is about the path
(not about the model) means it speaks the Responses API, and the reverse. The answer is kept
for the process and logged once. Both give the same :class:`~bot.agent.reply.Completion`: the
wire formats are :mod:`bot.agent.wire_chat` and :mod:`bot.agent.wire_responses`; the thread's
messages are chat-shaped whichever is spoken.

**Retries** are done here, not by the openai client (it counts every kind alike): 408/409/429/
5xx and connection errors up to ``llm.max_retries`` times with exponential backoff that
honours ``Retry-After``; a timeout at most once, because a server that timed out is often
still generating the first answer and every retry queues one more on a one-at-a-time local
server; an unreadable reply up to ``llm.max_retries`` times. A 400 that names one of the
optional parameters sent (``temperature``, ``max_tokens``, ``tool_choice`` …) is asked again
once without it, and the model is remembered to refuse it (:mod:`bot.agent.params`).
Every failure that survives becomes :class:`~bot.agent.failures.LLMError` (one sentence for
the thread; :mod:`bot.agent.failures` logs what the operator should fix).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import random
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any, Concatenate, Literal, ParamSpec, Protocol, TypeVar

import aiohttp
import openai
from openai.types.chat import ChatCompletion

from bot import metrics
from bot.agent import wire_chat, wire_responses
from bot.agent.failures import (
    ContextLengthError,
    EndpointMissingError,
    LLMError,
    ModelMissingError,
    ToolsUnsupportedError,
    endpoint_missing,
    error_field,
    error_message,
    is_context_exceeded,
    is_missing_endpoint,
    names_missing_model,
    to_llm_error,
    tools_unsupported,
)
from bot.agent.params import ParamMemory, refused_param
from bot.agent.reply import Completion, ReplyFailed, ToolCall, Unreadable, Usage
from bot.config import LLMSettings

__all__ = [
    "Api",
    "Completion",
    "ContextLengthError",
    "LLMClient",
    "LLMError",
    "OnText",
    "ToolCall",
    "Usage",
    "is_context_exceeded",
    "llm_error_kind",
    "observe_llm",
]

log = logging.getLogger(__name__)

Api = Literal["chat", "responses"]
#: Receives the reply's text so far (the whole of it each time) while a streamed reply arrives.
OnText = Callable[[str], Awaitable[None]]

#: Pause before retrying an unreadable reply (doubles per attempt).
_MALFORMED_BACKOFF_S = 0.2
#: Backoff before retrying a status or connection error: doubles per attempt, up to the cap.
_BACKOFF_S = 0.5
_BACKOFF_CAP_S = 8.0
#: A ``Retry-After`` longer than this is not waited for (the turn would look hung).
_RETRY_AFTER_CAP_S = 60.0
_RETRYABLE_STATUS = frozenset({408, 409, 429})
_PATHS: dict[Api, str] = {"chat": wire_chat.PATH, "responses": wire_responses.PATH}
_OTHER: dict[Api, Api] = {"chat": "responses", "responses": "chat"}


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
    """Decorates ``LLMClient.complete``: its latency and tokens by model (reasoning tokens, a part
    of the completion tokens, also on their own), its failures by kind, and when its endpoint last
    answered or failed (for readiness)."""

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
        if reasoning := max(0, getattr(usage, "reasoning_tokens", 0) or 0):
            metrics.LLM_TOKENS.labels(model, "reasoning").inc(reasoning)
        return completion

    return observed


def llm_error_kind(exc: BaseException) -> str:
    """One of :data:`bot.metrics.LLM_ERROR_KINDS` for a failed request (an ``LLMError`` and its cause)."""
    if isinstance(exc, ContextLengthError):
        return "context_length"
    if isinstance(exc, (EndpointMissingError, ModelMissingError)):
        return "not_found"
    if isinstance(exc, ToolsUnsupportedError):
        return "refused"
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
    if isinstance(cause, ReplyFailed):
        return "server_error"
    if isinstance(cause, (openai.APIResponseValidationError, ValueError, Unreadable)):
        return "unreadable"
    return "other"


class LLMClient:
    """Sends requests to one OpenAI-compatible endpoint, over the API it speaks."""

    def __init__(self, settings: LLMSettings, *, client: openai.AsyncOpenAI | None = None) -> None:
        self._settings = settings
        #: The APIs whose streamed requests the server refused but answers plainly: asked plainly.
        self._stream_refused: set[Api] = set()
        #: The API spoken; None while ``auto`` has not found it out yet.
        self._api: Api | None = None if settings.api == "auto" else settings.api
        self._why = f"llm.api: {settings.api}"
        if self._api is None and _is_openai(settings.base_url):
            self._api, self._why = "responses", "llm.api: auto, OpenAI's own endpoint"
        self._announced = False
        self._params = ParamMemory()
        self._client = client or openai.AsyncOpenAI(
            base_url=settings.base_url,
            # Local servers (Ollama, vLLM) accept any key, but the client insists on one.
            api_key=settings.api_key.get_secret_value() or "not-needed",
            timeout=settings.request_timeout_s,
            max_retries=0,  # retried in complete(), where a timeout is retried once at most
            # aiohttp under the SDK's client, as its README advises for concurrency: the default
            # pool checks every open connection for each request it places (quadratic in a
            # crowd of turns).
            http_client=openai.DefaultAioHttpClient(),
        )

    @property
    def settings(self) -> LLMSettings:
        """The ``llm`` settings this client was made with."""
        return self._settings

    @property
    def api(self) -> Api | None:
        """The API this client speaks; None while ``auto`` has not found it out yet."""
        return self._api

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
        """One reply to chat-shaped ``messages`` (``tools``: chat completions function tools);
        raises :class:`LLMError` on failure.

        With ``on_text`` the reply is streamed and ``on_text`` gets its text so far as it grows
        (from the start again if a retry begins anew). A server that refuses streamed requests
        is asked unstreamed, from then on.
        """
        model = model or self._settings.model
        api: Api = self._api or "chat"
        probing = self._api is None
        missing: dict[Api, tuple[str, int]] = {}  # while probing: the paths that answered 404/405
        adjusted: set[str] = set()  # parameters refused in this request, each asked again once
        retries = self._settings.max_retries
        timeouts = 0
        attempt = 0
        while True:
            last = attempt >= retries
            body = self._body(api, messages, model, tools, tool_choice)
            try:
                completion = await self._send(api, body, on_text)
            except (Unreadable, ReplyFailed, openai.APIResponseValidationError, ValueError) as exc:
                # ValueError: the openai client lets json.JSONDecodeError through for a non-JSON body.
                log.warning("unreadable LLM reply (attempt %d/%d): %r", attempt + 1, retries + 1, exc)
                if last:
                    if isinstance(exc, ReplyFailed):
                        raise LLMError(f"The language model failed while answering ({exc}); please try again.") from exc
                    raise LLMError("The language model sent a reply that could not be read; please try again.") from exc
                pause = _MALFORMED_BACKOFF_S * 2**attempt
            except openai.APITimeoutError as exc:
                timeouts += 1
                if last or timeouts > 1:
                    raise self._failure(exc, model) from exc
                log.warning("LLM request timed out after %gs; retrying once", self._settings.request_timeout_s)
                pause = 0.0
            except openai.APIStatusError as exc:
                if probing and is_missing_endpoint(exc):
                    missing[api] = (str(exc.request.url.copy_with(query=None, userinfo=b"")), exc.status_code)
                    if _OTHER[api] not in missing:
                        api = _OTHER[api]
                        continue
                    (url, status), other = missing["chat"], missing["responses"]
                    raise endpoint_missing(url, status, api="chat", other=other) from exc
                if probing:  # the server has the path: whatever it said, it speaks this API
                    probing = False
                    self._settle(api, missing)
                message = error_message(exc)
                if exc.status_code in (400, 422) and not is_context_exceeded(message, exc.body):
                    refused = (
                        None if tools_unsupported(exc) else refused_param(message, error_field(exc, "param"), body)
                    )
                    if refused is not None and refused[0] not in adjusted:
                        adjusted.add(refused[0])
                        self._params.learn(model, *refused, why=f"HTTP {exc.status_code}: {message[:200]}")
                        continue
                if last or not _retryable(exc) or tools_unsupported(exc) or names_missing_model(exc):
                    raise self._failure(exc, model) from exc
                pause = _backoff(exc, attempt)
                log.warning("LLM request failed (%r); retry %d/%d in %.1fs", exc, attempt + 1, retries, pause)
            except openai.OpenAIError as exc:
                if last or not _retryable(exc):
                    raise self._failure(exc, model) from exc
                pause = _backoff(exc, attempt)
                log.warning("LLM request failed (%r); retry %d/%d in %.1fs", exc, attempt + 1, retries, pause)
            else:
                if probing:
                    self._settle(api, missing)
                if not self._announced:
                    self._announced = True
                    log.info("LLM API: %s at %s (%s)", _PATHS[api].lstrip("/"), self._settings.base_url, self._why)
                return completion
            attempt += 1
            await asyncio.sleep(pause)

    def _settle(self, api: Api, missing: dict[Api, tuple[str, int]]) -> None:
        """Keep ``api`` for the process: ``auto`` found the server has its path (``missing``: the
        other path's URL and status, when it answered that it has none)."""
        if self._api is None:
            other = missing.get(_OTHER[api])
            because = (
                f"POST {_PATHS[_OTHER[api]]} answered HTTP {other[1]}" if other else f"POST {_PATHS[api]} answered"
            )
            self._api, self._why = api, f"llm.api: auto, {because}"

    def _failure(self, exc: openai.OpenAIError, model: str) -> LLMError:
        return to_llm_error(
            exc, model=model, base_url=self._settings.base_url, timeout_s=self._settings.request_timeout_s
        )

    def _body(
        self,
        api: Api,
        messages: list[dict[str, Any]],
        model: str,
        tools: list[dict[str, Any]] | None,
        tool_choice: str | None,
    ) -> dict[str, Any]:
        build = wire_chat.chat_body if api == "chat" else wire_responses.responses_body
        body = build(
            messages,
            model=model,
            tools=tools,
            tool_choice=tool_choice,
            temperature=self._settings.temperature,
            max_tokens=self._settings.max_tokens,
        )
        self._params.apply(model, body)
        return body

    async def _send(self, api: Api, body: dict[str, Any], on_text: OnText | None) -> Completion:
        try:
            return await self._post(api, body, on_text)
        except openai.APITimeoutError as exc:
            if _timed_out(exc):
                raise
            # The SDK's aiohttp transport reports every refused or lost connection as a connect
            # timeout; the aiohttp error under it says which it was.
            raise openai.APIConnectionError(request=exc.request) from exc

    async def _post(self, api: Api, body: dict[str, Any], on_text: OnText | None) -> Completion:
        # Posted as plain JSON with client.post, not the typed create(): that runs every message of
        # the history through openai's parameter transformer (tens of ms per call for a long
        # thread), while our messages are plain JSON already.
        if on_text is not None and api not in self._stream_refused:
            streamed = await self._streamed(api, body, on_text)
            if streamed is not None:
                return streamed
        if api == "chat":
            response = await self._client.post(
                wire_chat.PATH, body=body, cast_to=ChatCompletion, options={"max_retries": 0}
            )
            return wire_chat.parse_chat(response)
        data = await self._client.post(wire_responses.PATH, body=body, cast_to=object, options={"max_retries": 0})
        return wire_responses.parse_response(data)

    async def _streamed(self, api: Api, body: dict[str, Any], on_text: OnText) -> Completion | None:
        """The reply streamed (Server-Sent Events); None when the server will not stream it."""
        reply: wire_chat.ChatStream | wire_responses.ResponsesStream
        try:
            if api == "chat":
                body = wire_chat.streamed_body(body)
                reply = wire_chat.ChatStream()
                # Chunks read as plain JSON: the client's types cost more than the rest of a turn's model work.
                stream: openai.AsyncStream[Any] = await self._client.post(
                    wire_chat.PATH,
                    body=body,
                    cast_to=object,
                    options={"max_retries": 0},
                    stream=True,
                    stream_cls=openai.AsyncStream[object],
                )
            else:
                body = wire_responses.streamed_body(body)
                reply = wire_responses.ResponsesStream()
                stream = await self._client.post(
                    wire_responses.PATH,
                    body=body,
                    cast_to=object,
                    options={"max_retries": 0},
                    stream=True,
                    stream_cls=openai.AsyncStream[object],
                )
        except openai.BadRequestError as exc:
            message = error_message(exc)
            if (
                is_context_exceeded(message, exc.body)
                or tools_unsupported(exc)
                or names_missing_model(exc)
                or refused_param(message, error_field(exc, "param"), body) is not None
            ):
                raise  # about the request, not about streaming it
            log.warning("the LLM server refused a streamed request (%s); asking without streaming from now on", exc)
            self._stream_refused.add(api)
            return None
        async with stream:
            # A stream cut off mid-way raises the client's APITimeoutError or APIConnectionError: retried.
            async for chunk in stream:
                if reply.add(chunk) and (text := reply.text):
                    try:
                        await on_text(text)
                    except Exception:  # showing the draft is cosmetic: the answer must not depend on it
                        log.exception("streamed text callback failed")
        if reply.empty:
            log.warning("the LLM server sent nothing for a streamed request; asking without streaming from now on")
            self._stream_refused.add(api)
            return None
        completion = reply.completion()
        if not reply.usage_reported:
            # Some servers (llama-cpp-python) ignore stream_options.include_usage: count about
            # four characters a token rather than nothing, so usage and budgets see the turn.
            sent = wire_chat.sent_chars(body) if api == "chat" else wire_responses.sent_chars(body)
            written = len(completion.content or "") + sum(len(c.arguments) for c in completion.tool_calls)
            completion = dataclasses.replace(completion, usage=Usage(sent // 4, max(1, written // 4)))
        return completion


def _timed_out(exc: openai.APITimeoutError) -> bool:
    """Whether a request the client says timed out did run out of time: not when an aiohttp
    connection error that is no timeout lies under it (a refused or dropped connection)."""
    cause = exc.__cause__
    while cause is not None:
        if isinstance(cause, TimeoutError):  # aiohttp's own timeouts are TimeoutErrors too
            return True
        if isinstance(cause, aiohttp.ClientConnectionError):
            return False
        cause = cause.__cause__
    return True


def _is_openai(base_url: str) -> bool:
    """True for OpenAI's own endpoint, which speaks the Responses API."""
    return urllib.parse.urlsplit(base_url).hostname == "api.openai.com"


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
