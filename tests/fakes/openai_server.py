"""A scripted OpenAI-compatible HTTP server for tests (real aiohttp on 127.0.0.1, port 0).

The real ``openai`` client talks to it through ``base_url``. Each ``POST /v1/chat/completions``
takes the next step from a script; every request body is recorded so a test can assert on
what the model was told. ``GET /v1/models`` lists ``model``.

Usage::

    from tests.fakes.openai_server import ScriptedOpenAI, answer, error, tool_call

    async with ScriptedOpenAI() as llm:
        llm.script(tool_call("print(1 + 1)"), error(500), answer("It is 2."))
        client = openai.AsyncOpenAI(base_url=llm.base_url, api_key="test")
        ...
        assert llm.requests[-1]["messages"][-1]["role"] == "tool"
        assert llm.remaining == 0

Steps (each one answers exactly one request; a retry takes the next step):

- ``answer(text)`` — an assistant text reply.
- ``tool_call(*codes, content=None)`` — one reply with one ``python`` tool call per code.
- ``raw_tool_call(arguments, name="python")`` — a tool call with arbitrary (e.g. invalid
  JSON) arguments.
- ``error(status, message=None, retry_after=None)`` — an OpenAI-shaped error body; the
  ``Retry-After`` header is set when ``retry_after`` is given (seconds, may be fractional).
- ``delay(seconds, then=answer("late"))`` — wait, then answer ``then`` (to trigger client
  timeouts; the wait ends early when the server stops).
- ``garbage(body="this is not json")`` — HTTP 200 with a non-JSON body.
- ``text_tool_call(code, style="fence"|"json"|"tagged")`` — a tool call written as text in
  ``content`` (a ```` ```python ```` block, a bare JSON call, or ``<tool_call>`` tags), as
  small local models do.
- ``answer(text, finish_reason="length")`` — a reply cut off at ``max_tokens``.
- any callable ``(request_json) -> step``, e.g. to echo the last tool observation.

Strictness modes (``ScriptedOpenAI(strict=Strictness(...))``, or assign ``server.strict``)
reproduce what real servers do; a request they reject does not consume a step and is
recorded in ``rejected``:

- ``null_fields=500`` (llama.cpp's server) or ``400`` (vLLM/LiteLLM validation): a message
  with any null field (``"content": null``, ``"name": null``…) is refused.
- ``tool_choice_required=True``: ``tool_choice: "required"`` is refused (400).
- ``context_chars=N``: a request whose messages serialise to more than N characters gets
  HTTP 400 in the phrasing of ``context_style`` (``openai``, ``vllm``, ``llamacpp``,
  ``llama-cpp-python``, ``ollama``, ``litellm``).
- ``omit_usage=True``: replies carry no ``usage``.
- ``sparse=True``: replies leave out what local servers leave out (``id``, ``created``,
  ``finish_reason``, a null ``content``) and send ``tool_calls: []``.
- ``empty_deltas=True``: streamed replies include chunks with empty deltas and null content.
- ``no_stream=True``: a streamed request (``stream``, ``stream_options``) is refused (400).

Every step takes ``usage=(prompt_tokens, completion_tokens)``; by default usage is derived
from character counts. ``served_usage`` sums what successful replies reported. A request
with ``"stream": true`` gets the same reply as Server-Sent Events (with a usage chunk when
``stream_options.include_usage`` is set). ``ScriptedOpenAI(api_key="k")`` answers 401 to
any other bearer token without consuming a step. When the script runs dry the server
answers HTTP 400 "script exhausted" (not retried by clients) and counts it in
``exhausted``.

For pytest, ``scripted_openai`` is a ready fixture: import it into a ``conftest.py``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest_asyncio
from aiohttp import web

from tests.fakes.local_http import serve_locally

MODEL = "fake-model"


@dataclass
class Strictness:
    """What the server refuses or leaves out, like a real one (see the module docstring)."""

    null_fields: int | None = None
    tool_choice_required: bool = False
    context_chars: int | None = None
    context_style: str = "openai"
    omit_usage: bool = False
    sparse: bool = False
    empty_deltas: bool = False
    no_stream: bool = False


@dataclass(frozen=True)
class _Reply:
    content: str | None = None
    tool_calls: tuple[tuple[str, str], ...] = ()  # (name, raw arguments)
    usage: tuple[int, int] | None = None
    finish_reason: str | None = None  # default: "tool_calls" or "stop"
    #: Seconds between streamed chunks (a model writing at its own pace).
    pace_s: float = 0.0


@dataclass(frozen=True)
class _Error:
    status: int
    message: str
    retry_after: float | None = None


@dataclass(frozen=True)
class _Delay:
    seconds: float
    then: Step


@dataclass(frozen=True)
class _Garbage:
    body: str


Step = _Reply | _Error | _Delay | _Garbage | Callable[[dict[str, Any]], "Step"]


def answer(
    text: str, *, usage: tuple[int, int] | None = None, finish_reason: str | None = None, pace_s: float = 0.0
) -> Step:
    """An assistant reply with text and no tool call (``finish_reason="length"``: cut off);
    streamed, its chunks come ``pace_s`` apart."""
    return _Reply(content=text, usage=usage, finish_reason=finish_reason, pace_s=pace_s)


def text_tool_call(code: str, *, style: str = "json") -> Step:
    """A ``python`` call written as text in ``content``: ``fence``, ``json`` or ``tagged``."""
    call = json.dumps({"name": "python", "arguments": {"code": code}})
    texts = {"fence": f"```python\n{code}\n```", "json": call, "tagged": f"<tool_call>\n{call}\n</tool_call>"}
    return _Reply(content=texts[style])


def tool_call(
    *codes: str, content: str | None = None, usage: tuple[int, int] | None = None, pace_s: float = 0.0
) -> Step:
    """One assistant reply that calls the ``python`` tool once per code string, in order
    (streamed, its chunks come ``pace_s`` apart)."""
    calls = tuple(("python", json.dumps({"code": code})) for code in codes)
    return _Reply(content=content, tool_calls=calls, usage=usage, pace_s=pace_s)


def raw_tool_call(arguments: str, *, name: str = "python", usage: tuple[int, int] | None = None) -> Step:
    """A tool call whose arguments string is sent as is (e.g. malformed JSON)."""
    return _Reply(tool_calls=((name, arguments),), usage=usage)


_ERROR_TYPES = {
    400: ("invalid_request_error", "Bad request."),
    401: ("invalid_request_error", "Incorrect API key provided."),
    404: ("invalid_request_error", "The model does not exist."),
    429: ("rate_limit_exceeded", "Rate limit reached for requests."),
    500: ("server_error", "The server had an error while processing your request."),
    503: ("server_error", "The engine is currently overloaded."),
}


def error(status: int, message: str | None = None, *, retry_after: float | None = None) -> Step:
    """An HTTP error with an OpenAI-shaped body, optionally with ``Retry-After``."""
    default = _ERROR_TYPES.get(status, ("server_error", f"HTTP {status}"))[1]
    return _Error(status=status, message=message or default, retry_after=retry_after)


def delay(seconds: float, then: Step | None = None) -> Step:
    """Wait ``seconds`` before answering ``then`` (default: a short text answer)."""
    return _Delay(seconds=seconds, then=then if then is not None else answer("late"))


def garbage(body: str = "this is not json") -> Step:
    """HTTP 200 whose body is not JSON."""
    return _Garbage(body=body)


class ScriptedOpenAI:
    """The server; use as ``async with ScriptedOpenAI() as llm``."""

    def __init__(
        self,
        *,
        api_key: str | None = None,
        model: str = MODEL,
        strict: Strictness | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.api_key = api_key
        #: The address it listens on (``0.0.0.0``: also for containers on the host's bridges).
        self.host = host
        self.model = model
        #: The strictness modes in force (may be replaced between requests).
        self.strict = strict or Strictness()
        #: Why each refused request was refused (strictness modes), in order.
        self.rejected: list[str] = []
        #: Every chat.completions request body, in arrival order (retries included).
        self.requests: list[dict[str, Any]] = []
        #: Requests that arrived after the script ran dry.
        self.exhausted = 0
        #: (prompt_tokens, completion_tokens) summed over the replies served.
        self.served_usage = (0, 0)
        self._steps: deque[Step] = deque()
        self._runner: web.AppRunner | None = None
        self._port = 0
        self._closing = asyncio.Event()

    def script(self, *steps: Step) -> None:
        """Append steps to the queue."""
        self._steps.extend(steps)

    @property
    def remaining(self) -> int:
        """Steps not yet used."""
        return len(self._steps)

    @property
    def port(self) -> int:
        """The port it listens on."""
        return self._port

    @property
    def base_url(self) -> str:
        """The ``base_url`` for ``openai.AsyncOpenAI`` (ends in ``/v1``)."""
        return f"http://127.0.0.1:{self._port}/v1"

    async def __aenter__(self) -> ScriptedOpenAI:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        self._runner, self._port = await serve_locally(app, host=self.host)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        if (denied := self._check_key(request)) is not None:
            return denied
        return web.json_response(
            {"object": "list", "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "tests"}]}
        )

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        if (denied := self._check_key(request)) is not None:
            return denied
        if (refusal := self._refuse(body)) is not None:
            self.rejected.append(refusal[1])
            return _error_response(_Error(*refusal))
        if not self._steps:
            self.exhausted += 1
            return _error_response(_Error(400, "ScriptedOpenAI: script exhausted"))
        step = self._steps.popleft()
        while True:
            while callable(step):
                step = step(body)
            if not isinstance(step, _Delay):
                break
            try:
                await asyncio.wait_for(self._closing.wait(), step.seconds)
                return web.Response(status=503, text="shutting down")
            except TimeoutError:
                step = step.then
        if isinstance(step, _Error):
            return _error_response(step)
        if isinstance(step, _Garbage):
            return web.Response(status=200, text=step.body, content_type="application/json")
        assert isinstance(step, _Reply)
        usage = step.usage or _estimate_usage(body, step)
        self.served_usage = (self.served_usage[0] + usage[0], self.served_usage[1] + usage[1])
        if body.get("stream"):
            return await self._stream(request, body, step, usage)
        return web.json_response(_completion(body.get("model", self.model), step, usage, self.strict))

    def _refuse(self, body: dict[str, Any]) -> tuple[int, str] | None:
        """``(status, message)`` when a strictness mode refuses the request."""
        strict, messages = self.strict, body.get("messages", [])
        if strict.null_fields is not None:
            for index, message in enumerate(messages):
                nulls = [k for k, v in message.items() if v is None]
                if nulls:
                    if strict.null_fields >= 500:  # llama.cpp's server: a C++ JSON type error
                        return strict.null_fields, "[json.exception.type_error.302] type must be string, but is null"
                    return strict.null_fields, f"messages[{index}].{nulls[0]}: Input should be a valid string"
        if strict.no_stream and (body.get("stream") or "stream_options" in body):
            return 400, "stream_options: extra inputs are not permitted"
        if strict.tool_choice_required and body.get("tool_choice") == "required":
            return 400, "tool_choice 'required' is not supported"
        if strict.context_chars is not None:
            size = len(json.dumps(messages))
            if size > strict.context_chars:
                limit, used, completion = strict.context_chars // 4, size // 4, body.get("max_tokens") or 0
                return 400, _context_message(strict.context_style, limit, used, completion)
        return None

    def _check_key(self, request: web.Request) -> web.Response | None:
        if self.api_key is None or request.headers.get("Authorization") == f"Bearer {self.api_key}":
            return None
        return _error_response(_Error(401, _ERROR_TYPES[401][1]))

    async def _stream(
        self, request: web.Request, body: dict[str, Any], reply: _Reply, usage: tuple[int, int]
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        chunks = _chunks(body.get("model", self.model), reply, usage, body.get("stream_options") or {}, self.strict)
        for index, chunk in enumerate(chunks):
            if reply.pace_s and index:
                await asyncio.sleep(reply.pace_s)
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _context_message(style: str, limit: int, used: int, completion: int) -> str:
    """A context-length refusal as each server words it."""
    messages = {
        "openai": (
            f"This model's maximum context length is {limit} tokens. However, your messages resulted in "
            f"{used} tokens. Please reduce the length of the messages."
        ),
        "vllm": (
            f"This model's maximum context length is {limit} tokens. However, you requested {used + completion} "
            f"tokens ({used} in the messages, {completion} in the completion). Please reduce the length of the "
            "messages or completion."
        ),
        "llamacpp": "the request exceeds the available context size, try increasing it",
        "llama-cpp-python": f"Requested tokens ({used}) exceed context window of {limit}",
        "ollama": f"prompt too long; exceeded max context length by {used - limit} tokens",
        "litellm": (
            "litellm.ContextWindowExceededError: litellm.BadRequestError: ContextWindowExceededError: "
            "OpenAIException - Input is too long for the requested model."
        ),
    }
    return messages[style]


def _error_response(err: _Error) -> web.Response:
    kind = _ERROR_TYPES.get(err.status, ("server_error", ""))[0]
    headers = {"Retry-After": f"{err.retry_after:g}"} if err.retry_after is not None else {}
    payload = {"error": {"message": err.message, "type": kind, "param": None, "code": None}}
    return web.json_response(payload, status=err.status, headers=headers)


def _estimate_usage(body: dict[str, Any], reply: _Reply) -> tuple[int, int]:
    prompt = len(json.dumps(body.get("messages", [])))
    completion = len(reply.content or "") + sum(len(args) for _, args in reply.tool_calls)
    return max(1, prompt // 4), max(1, completion // 4)


def _tool_calls(reply: _Reply) -> list[dict[str, Any]]:
    return [
        {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function", "function": {"name": name, "arguments": args}}
        for name, args in reply.tool_calls
    ]


def _usage(usage: tuple[int, int]) -> dict[str, int]:
    return {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}


def _finish_reason(reply: _Reply) -> str:
    return reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")


def _completion(model: str, reply: _Reply, usage: tuple[int, int], strict: Strictness) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = _tool_calls(reply)
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": _finish_reason(reply)}
    completion: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": _usage(usage),
    }
    if strict.sparse:
        del completion["id"], completion["created"]
        if reply.finish_reason is None:
            del choice["finish_reason"]
        if message["content"] is None:
            del message["content"]
        message.setdefault("tool_calls", [])
    if strict.omit_usage:
        del completion["usage"]
    return completion


def _chunks(
    model: str, reply: _Reply, usage: tuple[int, int], options: dict[str, Any], strict: Strictness
) -> list[dict[str, Any]]:
    """The reply as ``chat.completion.chunk`` objects: role, content pieces, tool-call pieces."""
    base = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    out = [chunk({"role": "assistant", "content": ""})]
    if strict.empty_deltas:
        out += [chunk({}), chunk({"content": None})]
    text = reply.content or ""
    out += [chunk({"content": text[i : i + 8]}) for i in range(0, len(text), 8)]
    for index, call in enumerate(_tool_calls(reply)):
        head = {
            "index": index,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""},
        }
        out.append(chunk({"tool_calls": [head]}))
        args = call["function"]["arguments"]
        out += [
            chunk({"tool_calls": [{"index": index, "function": {"arguments": args[i : i + 8]}}]})
            for i in range(0, len(args), 8)
        ]
    out.append(chunk({}, _finish_reason(reply)))
    if options.get("include_usage") and not strict.omit_usage:
        out.append({**base, "choices": [], "usage": _usage(usage)})
    return out


@pytest_asyncio.fixture
async def scripted_openai() -> AsyncIterator[ScriptedOpenAI]:
    """A running :class:`ScriptedOpenAI`, stopped after the test."""
    async with ScriptedOpenAI() as server:
        yield server
