"""A scripted OpenAI-compatible HTTP server for tests (real aiohttp on 127.0.0.1, port 0).

The real ``openai`` client talks to it through ``base_url``. Each ``POST /v1/chat/completions``
or ``POST /v1/responses`` takes the next step from one script, and answers it in that API's
shape; every request body is recorded (``requests``, with ``endpoints`` saying which API it
came to: ``"chat"`` or ``"responses"``) so a test can assert on what the model was told.
``GET /v1/models`` lists ``model``. ``ScriptedOpenAI(apis=("responses",))`` (or assigning
``server.apis``) serves only those APIs: a request to the other path gets HTTP 404 as a
FastAPI server (vLLM, LiteLLM) answers it, ``{"detail": "Not Found"}``, counted in
``missing``, consuming no step.

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
- ``answer(..., reasoning="…")`` / ``tool_call(..., reasoning="…")`` — the reply of a reasoning
  model: on chat completions its ``reasoning_content`` (as llama.cpp, vLLM and DeepSeek send
  it, also in stream deltas); on the Responses API a ``reasoning`` item first (``summary``,
  ``content`` as ``reasoning_text``, ``encrypted_content``: :func:`encrypted`), streamed with
  ``response.reasoning_text.delta`` events. Its tokens are counted as reasoning tokens.
- any callable ``(request_json) -> step``, e.g. to echo the last tool observation
  (:func:`last_tool_output` reads it from either API's request).

The Responses API (``/v1/responses``) is served as OpenAI serves it: ``output`` items
(``reasoning``, ``message`` with ``output_text``, ``function_call`` with ``call_id``), ``status``
``incomplete`` at the length limit, ``usage`` with ``input_tokens``/``output_tokens`` and
``output_tokens_details.reasoning_tokens``; streamed (``"stream": true``) as named SSE events
(``response.created`` … ``response.output_text.delta`` … ``response.output_item.done`` …
``response.completed``). Its requests are validated as OpenAI does, and refused with 400 (not
consuming a step, recorded in ``rejected``): unknown top-level parameters, nested chat-style
tools (``tools[0].name`` missing), function tools whose ``strict`` is missing or true without a
strict schema, input items of unknown shape, a ``function_call_output`` without its
``function_call``, and an item this server gave after a reasoning item sent back without that
reasoning item ("… was provided without its required 'reasoning' item").

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
- ``refuse_params={"temperature": "message", …}``: a request carrying one of those parameters
  is refused with HTTP 400, that message and the error's ``param``; :data:`O_SERIES` holds
  OpenAI's refusals of ``temperature`` and ``max_tokens`` to its reasoning models.
- ``no_tools="llamacpp"|"vllm"|"ollama"``: a request with ``tools`` is refused as that server
  does when it cannot take tools (llama.cpp without ``--jinja``: HTTP 500; vLLM without
  ``--enable-auto-tool-choice``: 400; an Ollama model without tool support: 400).
- ``check_model=True``: a request for a model other than ``model`` gets HTTP 404 (OpenAI's
  ``model_not_found``).

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
import base64
import json
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
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
    refuse_params: dict[str, str] = field(default_factory=dict)
    no_tools: str | None = None
    check_model: bool = False


#: How OpenAI refuses ``temperature`` and ``max_tokens`` to its reasoning models (for ``refuse_params``).
O_SERIES = {
    "temperature": (
        "Unsupported value: 'temperature' does not support 0.2 with this model. Only the default (1) value is "
        "supported."
    ),
    "max_tokens": (
        "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead."
    ),
}
#: How servers that cannot take tools refuse a request with ``tools``: (status, message, body style).
_NO_TOOLS = {
    "llamacpp": (500, "tools param requires --jinja flag", "llamacpp"),
    "vllm": (
        400,
        '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
        "vllm",
    ),
    "ollama": (400, "registry.ollama.ai/library/gemma2:2b does not support tools", "openai"),
}


@dataclass(frozen=True)
class _Reply:
    content: str | None = None
    tool_calls: tuple[tuple[str, str], ...] = ()  # (name, raw arguments)
    usage: tuple[int, int] | None = None
    finish_reason: str | None = None  # default: "tool_calls" or "stop"
    #: Seconds between streamed chunks (a model writing at its own pace).
    pace_s: float = 0.0
    #: A reasoning model's thinking (``reasoning_content``; a Responses ``reasoning`` item).
    reasoning: str | None = None


@dataclass(frozen=True)
class _Error:
    status: int
    message: str
    retry_after: float | None = None
    param: str | None = None
    code: str | None = None
    #: ``openai`` ({"error": {...}}), ``vllm`` ({"object": "error", "message": …}), ``llamacpp``
    #: ({"error": {"code": 500, "message": …}}), ``fastapi`` ({"detail": …}).
    style: str = "openai"


@dataclass(frozen=True)
class _Delay:
    seconds: float
    then: Step


@dataclass(frozen=True)
class _Garbage:
    body: str


Step = _Reply | _Error | _Delay | _Garbage | Callable[[dict[str, Any]], "Step"]


def answer(
    text: str,
    *,
    usage: tuple[int, int] | None = None,
    finish_reason: str | None = None,
    pace_s: float = 0.0,
    reasoning: str | None = None,
) -> Step:
    """An assistant reply with text and no tool call (``finish_reason="length"``: cut off);
    streamed, its chunks come ``pace_s`` apart; ``reasoning``: a reasoning model's thinking first."""
    return _Reply(content=text, usage=usage, finish_reason=finish_reason, pace_s=pace_s, reasoning=reasoning)


def text_tool_call(code: str, *, style: str = "json") -> Step:
    """A ``python`` call written as text in ``content``: ``fence``, ``json`` or ``tagged``."""
    call = json.dumps({"name": "python", "arguments": {"code": code}})
    texts = {"fence": f"```python\n{code}\n```", "json": call, "tagged": f"<tool_call>\n{call}\n</tool_call>"}
    return _Reply(content=texts[style])


def tool_call(
    *codes: str,
    content: str | None = None,
    usage: tuple[int, int] | None = None,
    pace_s: float = 0.0,
    reasoning: str | None = None,
) -> Step:
    """One assistant reply that calls the ``python`` tool once per code string, in order
    (streamed, its chunks come ``pace_s`` apart; ``reasoning``: a reasoning model's thinking first)."""
    calls = tuple(("python", json.dumps({"code": code})) for code in codes)
    return _Reply(content=content, tool_calls=calls, usage=usage, pace_s=pace_s, reasoning=reasoning)


def raw_tool_call(
    arguments: str, *, name: str = "python", usage: tuple[int, int] | None = None, reasoning: str | None = None
) -> Step:
    """A tool call whose arguments string is sent as is (e.g. malformed JSON), to any tool name."""
    return _Reply(tool_calls=((name, arguments),), usage=usage, reasoning=reasoning)


def encrypted(reasoning: str) -> str:
    """The ``encrypted_content`` this server gives a reasoning item (opaque to the client)."""
    return "gAAAA" + base64.b64encode(reasoning.encode()).decode()


def last_tool_output(request: dict[str, Any]) -> str | None:
    """The last message of a request when it is a tool result (either API's shape), else None."""
    if "input" in request:
        items = request["input"]
        last = items[-1] if isinstance(items, list) and items else {}
        return last.get("output") if isinstance(last, dict) and last.get("type") == "function_call_output" else None
    messages = request.get("messages") or [{}]
    return messages[-1].get("content") if messages[-1].get("role") == "tool" else None


_ERROR_TYPES = {
    400: ("invalid_request_error", "Bad request."),
    401: ("invalid_request_error", "Incorrect API key provided."),
    404: ("invalid_request_error", "The model does not exist."),
    429: ("rate_limit_exceeded", "Rate limit reached for requests."),
    500: ("server_error", "The server had an error while processing your request."),
    503: ("server_error", "The engine is currently overloaded."),
}


def error(
    status: int,
    message: str | None = None,
    *,
    retry_after: float | None = None,
    param: str | None = None,
    code: str | None = None,
    style: str = "openai",
) -> Step:
    """An HTTP error with an OpenAI-shaped body (``style``: another server's shape), optionally
    with ``Retry-After``, the error's ``param`` and ``code``."""
    default = _ERROR_TYPES.get(status, ("server_error", f"HTTP {status}"))[1]
    return _Error(
        status=status, message=message or default, retry_after=retry_after, param=param, code=code, style=style
    )


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
        apis: Iterable[str] = ("chat", "responses"),
    ) -> None:
        self.api_key = api_key
        #: The APIs served: ``chat`` and/or ``responses`` (may be replaced between requests).
        self.apis = set(apis)
        #: The address it listens on (``0.0.0.0``: also for containers on the host's bridges).
        self.host = host
        self.model = model
        #: The strictness modes in force (may be replaced between requests).
        self.strict = strict or Strictness()
        #: Why each refused request was refused (strictness modes), in order.
        self.rejected: list[str] = []
        #: Every request body, in arrival order (retries included), and which API each came to.
        self.requests: list[dict[str, Any]] = []
        self.endpoints: list[str] = []
        #: The paths of requests to an API not served (answered 404).
        self.missing: list[str] = []
        #: Requests that arrived after the script ran dry.
        self.exhausted = 0
        #: (prompt_tokens, completion_tokens) summed over the replies served.
        self.served_usage = (0, 0)
        self._steps: deque[Step] = deque()
        #: The id of each item this server gave after a reasoning item → that reasoning item's id.
        self._after_reasoning: dict[str, str] = {}
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
        app.router.add_post("/v1/responses", self._responses)
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
        return await self._serve(request, "chat")

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "responses")

    async def _serve(self, request: web.Request, api: str) -> web.StreamResponse:
        if api not in self.apis:
            self.missing.append(request.path)
            return _error_response(_Error(404, "Not Found", style="fastapi"))
        body = await request.json()
        self.requests.append(body)
        self.endpoints.append(api)
        if (denied := self._check_key(request)) is not None:
            return denied
        refusal = self._refuse(body) or (self._refuse_responses(body) if api == "responses" else None)
        if refusal is not None:
            self.rejected.append(refusal.message)
            return _error_response(refusal)
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
        model = body.get("model", self.model)
        if api == "responses":
            response = _response(model, step, usage, body)
            self._remember_reasoning(response["output"])
            if body.get("stream"):
                return await self._send_events(request, _events(response), step.pace_s)
            return web.json_response(response)
        if body.get("stream"):
            return await self._stream(request, body, step, usage)
        return web.json_response(_completion(model, step, usage, self.strict))

    def _refuse(self, body: dict[str, Any]) -> _Error | None:
        """The error a strictness mode refuses the request with (either API), if any."""
        strict, messages = self.strict, body.get("messages", body.get("input", []))
        if strict.check_model and body.get("model") != self.model:
            message = f"The model `{body.get('model')}` does not exist or you do not have access to it."
            return _Error(404, message, code="model_not_found")
        if strict.no_tools is not None and body.get("tools"):
            status, message, style = _NO_TOOLS[strict.no_tools]
            return _Error(status, message, style=style)
        for param, message in strict.refuse_params.items():
            if param in body:
                return _Error(400, message, param=param, code="unsupported_parameter")
        if strict.null_fields is not None:
            for index, message in enumerate(body.get("messages", [])):
                nulls = [k for k, v in message.items() if v is None]
                if nulls:
                    if strict.null_fields >= 500:  # llama.cpp's server: a C++ JSON type error
                        return _Error(
                            strict.null_fields, "[json.exception.type_error.302] type must be string, but is null"
                        )
                    return _Error(strict.null_fields, f"messages[{index}].{nulls[0]}: Input should be a valid string")
        if strict.no_stream and (body.get("stream") or "stream_options" in body):
            return _Error(400, "stream_options: extra inputs are not permitted")
        if strict.tool_choice_required and body.get("tool_choice") == "required":
            return _Error(400, "tool_choice 'required' is not supported")
        if strict.context_chars is not None:
            size = len(json.dumps(messages)) + len(body.get("instructions") or "")
            if size > strict.context_chars:
                limit, used = strict.context_chars // 4, size // 4
                completion = body.get("max_tokens") or body.get("max_output_tokens") or 0
                return _Error(400, _context_message(strict.context_style, limit, used, completion))
        return None

    def _refuse_responses(self, body: dict[str, Any]) -> _Error | None:
        """The 400 OpenAI's Responses API answers a request it cannot take with, if any."""
        for key in body:
            if key not in _RESPONSES_PARAMS:
                return _Error(400, f"Unknown parameter: '{key}'.", param=key, code="unknown_parameter")
        if "input" not in body:
            return _Error(400, "Missing required parameter: 'input'.", param="input", code="missing_required_parameter")
        for index, tool in enumerate(body.get("tools") or ()):
            if tool.get("type") == "function" and not isinstance(tool.get("name"), str):
                where = f"tools[{index}].name"
                return _Error(400, f"Missing required parameter: '{where}'.", param=where)
            if (
                tool.get("type") == "function"
                and tool.get("strict", True)
                and not _strict_schema(tool.get("parameters"))
            ):
                return _Error(
                    400,
                    f"Invalid schema for function '{tool['name']}': In context=(), 'additionalProperties' is "
                    "required to be supplied and to be false.",
                    param=f"tools[{index}].parameters",
                    code="invalid_function_parameters",
                )
        items = body["input"] if isinstance(body["input"], list) else []
        calls: set[str] = set()
        given: set[str] = set()
        for index, item in enumerate(items):
            kind = item.get("type", "message" if "role" in item else None)
            if kind == "message":
                if item.get("role") not in ("user", "assistant", "system", "developer") or "content" not in item:
                    return _Error(400, f"Invalid value for 'input[{index}]'.", param=f"input[{index}]")
            elif kind == "function_call":
                if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
                    return _Error(400, f"Missing required parameter: 'input[{index}].call_id'.")
                calls.add(item["call_id"])
            elif kind == "function_call_output":
                if item.get("call_id") not in calls:
                    return _Error(
                        400, f"No tool call found for function call output with call_id {item.get('call_id')}."
                    )
            elif kind == "reasoning":
                if not isinstance(item.get("summary"), list):
                    return _Error(400, f"Missing required parameter: 'input[{index}].summary'.")
                if body.get("store") is False and not item.get("encrypted_content"):
                    return _Error(
                        404,
                        f"Item with id '{item.get('id')}' not found. Items are not persisted when `store` is "
                        "set to false.",
                    )
            else:
                return _Error(400, f"Invalid value: '{kind}'. Supported values are: 'message', 'function_call', …")
            if isinstance(item.get("id"), str):
                reasoning = self._after_reasoning.get(item["id"])
                if reasoning is not None and reasoning not in given:
                    return _Error(
                        400,
                        f"Item '{item['id']}' of type '{kind}' was provided without its required 'reasoning' item: "
                        f"'{reasoning}'.",
                    )
                given.add(item["id"])
        return None

    def _remember_reasoning(self, output: list[dict[str, Any]]) -> None:
        reasoning = None
        for item in output:
            if item["type"] == "reasoning":
                reasoning = item["id"]
            elif reasoning is not None:
                self._after_reasoning[item["id"]] = reasoning

    async def _send_events(
        self, request: web.Request, events: list[dict[str, Any]], pace_s: float
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        for index, event in enumerate(events):
            if pace_s and index:
                await asyncio.sleep(pace_s)
            await response.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
        await response.write_eof()
        return response

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
    payload: dict[str, Any]
    if err.style == "fastapi":
        payload = {"detail": err.message}
    elif err.style == "vllm":
        payload = {"object": "error", "message": err.message, "type": "BadRequestError", "param": err.param}
        payload["code"] = err.status
    elif err.style == "llamacpp":
        payload = {"error": {"code": err.status, "message": err.message, "type": kind}}
    else:
        payload = {"error": {"message": err.message, "type": kind, "param": err.param, "code": err.code}}
    return web.json_response(payload, status=err.status, headers=headers)


def _estimate_usage(body: dict[str, Any], reply: _Reply) -> tuple[int, int]:
    prompt = len(json.dumps(body.get("messages", body.get("input", [])))) + len(body.get("instructions") or "")
    completion = len(reply.content or "") + sum(len(args) for _, args in reply.tool_calls)
    return max(1, prompt // 4), max(1, completion // 4) + _reasoning_tokens(reply)


def _reasoning_tokens(reply: _Reply) -> int:
    return max(1, len(reply.reasoning) // 4) if reply.reasoning else 0


def _tool_calls(reply: _Reply) -> list[dict[str, Any]]:
    return [
        {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function", "function": {"name": name, "arguments": args}}
        for name, args in reply.tool_calls
    ]


def _usage(usage: tuple[int, int], reply: _Reply) -> dict[str, Any]:
    counted: dict[str, Any] = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
    if reply.reasoning:
        counted["completion_tokens_details"] = {"reasoning_tokens": min(usage[1], _reasoning_tokens(reply))}
    return counted


def _finish_reason(reply: _Reply) -> str:
    return reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")


def _completion(model: str, reply: _Reply, usage: tuple[int, int], strict: Strictness) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.reasoning:
        message["reasoning_content"] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = _tool_calls(reply)
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": _finish_reason(reply)}
    completion: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": _usage(usage, reply),
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
    thought = reply.reasoning or ""
    out += [chunk({"reasoning_content": thought[i : i + 8]}) for i in range(0, len(thought), 8)]
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
        out.append({**base, "choices": [], "usage": _usage(usage, reply)})
    return out


# -- the Responses API ------------------------------------------------------------------------

#: The top-level parameters the Responses API takes (others are refused, as OpenAI does).
_RESPONSES_PARAMS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "temperature",
        "top_p",
        "max_output_tokens",
        "store",
        "include",
        "stream",
        "stream_options",
        "reasoning",
        "parallel_tool_calls",
        "metadata",
        "text",
        "truncation",
        "user",
        "previous_response_id",
        "prompt_cache_key",
        "service_tier",
    }
)


def _strict_schema(schema: object) -> bool:
    """True for a schema strict mode takes: every object closed, every property required."""
    if not isinstance(schema, dict):
        return False
    if schema.get("type") == "object":
        properties = schema.get("properties") or {}
        if schema.get("additionalProperties") is not False or set(schema.get("required") or ()) != set(properties):
            return False
        return all(_strict_schema(p) for p in properties.values())
    return True


def _hex() -> str:
    return uuid.uuid4().hex[:16]


def _response(model: str, reply: _Reply, usage: tuple[int, int], body: dict[str, Any]) -> dict[str, Any]:
    """The reply as a Responses API ``response`` object."""
    output: list[dict[str, Any]] = []
    if reply.reasoning:
        output.append(
            {
                "type": "reasoning",
                "id": f"rs_{_hex()}",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": reply.reasoning}],
                "encrypted_content": encrypted(reply.reasoning),
            }
        )
    if reply.content:
        output.append(
            {
                "type": "message",
                "id": f"msg_{_hex()}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": reply.content, "annotations": []}],
            }
        )
    for name, arguments in reply.tool_calls:
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{_hex()}",
                "call_id": f"call_{_hex()}",
                "name": name,
                "arguments": arguments,
                "status": "completed",
            }
        )
    cut_off = reply.finish_reason == "length"
    return {
        "id": f"resp_{_hex()}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if cut_off else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut_off else None,
        "error": None,
        "model": model,
        "output": output,
        "instructions": body.get("instructions"),
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice", "auto"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature"),
        "max_output_tokens": body.get("max_output_tokens"),
        "store": body.get("store", True),
        "usage": {
            "input_tokens": usage[0],
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage[1],
            "output_tokens_details": {"reasoning_tokens": min(usage[1], _reasoning_tokens(reply))},
            "total_tokens": sum(usage),
        },
    }


def _events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The response as the stream of events OpenAI sends for it (``sequence_number`` in order)."""
    events: list[dict[str, Any]] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append({"type": kind, "sequence_number": len(events), **fields})

    started = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    emit("response.created", response=started)
    emit("response.in_progress", response=started)
    for index, item in enumerate(response["output"]):
        at = {"output_index": index, "item_id": item["id"]}
        if item["type"] == "reasoning":
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "content": [], "encrypted_content": None},
            )
            text = item["content"][0]["text"]
            for i in range(0, len(text), 8):
                emit("response.reasoning_text.delta", **at, content_index=0, delta=text[i : i + 8])
            emit("response.reasoning_text.done", **at, content_index=0, text=text)
        elif item["type"] == "message":
            emit(
                "response.output_item.added", output_index=index, item={**item, "status": "in_progress", "content": []}
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            emit("response.content_part.added", **at, content_index=0, part=part)
            text = item["content"][0]["text"]
            for i in range(0, len(text), 8):
                emit("response.output_text.delta", **at, content_index=0, delta=text[i : i + 8], logprobs=[])
            emit("response.output_text.done", **at, content_index=0, text=text, logprobs=[])
            emit("response.content_part.done", **at, content_index=0, part={**part, "text": text})
        else:
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            arguments = item["arguments"]
            for i in range(0, len(arguments), 8):
                emit("response.function_call_arguments.delta", **at, delta=arguments[i : i + 8])
            emit("response.function_call_arguments.done", **at, arguments=arguments)
        emit("response.output_item.done", output_index=index, item=item)
    emit("response.incomplete" if response["status"] == "incomplete" else "response.completed", response=response)
    return events


@pytest_asyncio.fixture
async def scripted_openai() -> AsyncIterator[ScriptedOpenAI]:
    """A running :class:`ScriptedOpenAI`, stopped after the test."""
    async with ScriptedOpenAI() as server:
        yield server
