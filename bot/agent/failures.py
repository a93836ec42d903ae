"""Failed model requests: one sentence for the thread, one line for the operator.

Every failure that survives the client's retries becomes an :class:`LLMError` whose ``str()`` is
one sentence fit to post in the chat thread (never the API key, never a stack trace). Three
set-up mistakes that look alike on the wire (all often HTTP 404) are told apart, each with its
own line in the log that says what to fix:

- :class:`EndpointMissingError`: the server has no such path (``llm.base_url`` or ``llm.api``);
- :class:`ModelMissingError`: the server does not serve the model it was asked for (``llm.model``);
- :class:`ToolsUnsupportedError`: the server cannot take tool calls as started (llama.cpp
  without ``--jinja``, vLLM without ``--enable-auto-tool-choice --tool-call-parser``, an Ollama
  model without tool support).

A refusal because the request is longer than the model's context is a
:class:`ContextLengthError`, so the loop can shrink the history.
"""

from __future__ import annotations

import logging
import re

import openai

log = logging.getLogger(__name__)

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
#: How servers say they do not serve a model: OpenAI and vLLM ("The model `x` does not exist",
#: code ``model_not_found``), Ollama ("model \"x\" not found, try pulling it first"), LiteLLM
#: ("Invalid model name passed in model=x"), LM Studio ("model 'x' not found").
_MODEL_MISSING = re.compile(
    r"model[_ ]not[_ ]found|(?:unknown|invalid|no such) model|not a valid model|"
    r"\bmodel\b[^.\n]{0,80}?\b(?:not found|does not exist|doesn't exist|is not (?:available|served|loaded))",
    re.IGNORECASE,
)
#: How servers say they cannot take tools as started: llama.cpp ("tools param requires --jinja
#: flag"), vLLM ("\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser
#: to be set"), Ollama ("… does not support tools"), and generic phrasings.
_NO_TOOLS = re.compile(
    r"--jinja|enable-auto-tool-choice|tool-call-parser|tool choice requires|does not support tools|"
    r"tools? (?:are|is) not supported|tool calling is not (?:supported|enabled)|"
    r"function calling is not (?:supported|enabled)",
    re.IGNORECASE,
)
#: A 404 about something the request named (OpenAI: "Item with id 'rs_…' not found", "Previous
#: response with id … not found"), not about the path.
_NOT_THE_PATH = re.compile(r"\bitem with id\b|\bresponse with id\b", re.IGNORECASE)
_HOW_TO_START = {
    "llamacpp": "start llama-server with --jinja (llama-cpp-python: --chat_format chatml-function-calling)",
    "vllm": (
        "start vLLM with --enable-auto-tool-choice --tool-call-parser <parser> "
        "(the model's own: hermes, llama3_json, mistral, qwen3_coder, …)"
    ),
    "ollama": "pick a model with tool support (Ollama's library marks them 'tools'; e.g. qwen2.5, llama3.1)",
}


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


class EndpointMissingError(LLMError):
    """The server has no such path: ``llm.base_url`` or ``llm.api`` is wrong."""


class ModelMissingError(LLMError):
    """The server does not serve the model asked for: ``llm.model`` (or the channel's) is wrong."""


class ToolsUnsupportedError(LLMError):
    """The server cannot take tool calls as it was started."""


def error_message(exc: openai.APIStatusError) -> str:
    """The server's own words for an HTTP error (OpenAI's, vLLM's, Ollama's body shapes)."""
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
        if isinstance(inner, dict) and isinstance(inner.get("detail"), str):  # FastAPI: {"detail": "Not Found"}
            return str(inner["detail"])
        if isinstance(inner, str):  # Ollama and some proxies: {"error": "text"}
            return inner
    if isinstance(body, str):
        return body
    return ""


def error_field(exc: openai.APIStatusError, name: str) -> object:
    """A field of the error object (``param``, ``code``, ``type``), None when absent."""
    body = exc.body
    inner = body.get("error", body) if isinstance(body, dict) else None
    return inner.get(name) if isinstance(inner, dict) else None


def is_context_exceeded(message: str, body: object = None) -> bool:
    """True when an error message (or its body's ``code``/``type``) says the context was exceeded."""
    codes = ""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict):
            codes = f"{inner.get('code') or ''} {inner.get('type') or ''}"
    return bool(_CONTEXT_EXCEEDED.search(f"{message} {codes.replace('_', ' ')}"))


def names_missing_model(exc: openai.APIStatusError) -> bool:
    """True when a 404 or 400 says the model asked for is not served (not that a path is missing)."""
    if exc.status_code not in (400, 404, 422):
        return False
    code = error_field(exc, "code")
    return code == "model_not_found" or _MODEL_MISSING.search(error_message(exc)) is not None


def is_missing_endpoint(exc: openai.APIStatusError) -> bool:
    """True when a 404/405 is about the path itself, not about a model."""
    return (
        exc.status_code in (404, 405)
        and not names_missing_model(exc)
        and _NOT_THE_PATH.search(error_message(exc)) is None
    )


def tools_unsupported(exc: openai.APIStatusError) -> bool:
    """True when the server says it cannot take tools as started (a 400, or llama.cpp's 500)."""
    return exc.status_code in (400, 422, 500) and _NO_TOOLS.search(error_message(exc)) is not None


def endpoint_missing(url: str, status: int, *, api: str, other: tuple[str, int] | None = None) -> LLMError:
    """The error for a server without the API's path; ``other``: the other API's URL and status, also missing."""
    if other is not None:
        log.error(
            "LLM endpoint missing: POST %s answered HTTP %d and POST %s HTTP %d: llm.base_url must be the "
            "API's root (it usually ends in /v1)",
            url,
            status,
            *other,
        )
    else:
        speaks = "chat" if api == "responses" else "responses"
        log.error(
            "LLM endpoint missing: POST %s answered HTTP %d: llm.base_url must be the API's root (it usually "
            "ends in /v1); if the server speaks the other API, set llm.api: %s (or auto)",
            url,
            status,
            speaks,
        )
    return EndpointMissingError(
        f"The language model server does not offer the API the bot speaks (HTTP {status}); "
        "the bot's operator should check llm.base_url and llm.api.",
        status=status,
    )


def to_llm_error(exc: openai.OpenAIError, *, model: str, base_url: str, timeout_s: float) -> LLMError:
    """One sentence for the chat thread; the details (and what to fix, where we know) go to the log."""
    if isinstance(exc, openai.APITimeoutError):
        log.warning("LLM request failed: %r", exc)
        return LLMError(f"The language model did not answer within {timeout_s:g} seconds; please try again.")
    if isinstance(exc, openai.APIConnectionError):
        log.warning("LLM request failed: %r", exc)
        # The URL tried, less the endpoint, query and any user:password: the configured llm.base_url.
        tried = str(exc.request.url.copy_with(query=None, userinfo=b""))
        tried = tried.removesuffix("/chat/completions").removesuffix("/responses")
        return LLMError(f"The language model at {tried} could not be reached; please try again later.")
    if not isinstance(exc, openai.APIStatusError):
        log.warning("LLM request failed: %r", exc)
        return LLMError("The language model request failed; please try again.")
    status = exc.status_code
    message = error_message(exc)
    detail = _short(message)
    if tools_unsupported(exc):
        log.error(
            "LLM server without tool calls: %s answered HTTP %d (%s); %s",
            base_url,
            status,
            detail,
            _how_to_start(message),
        )
        return ToolsUnsupportedError(
            f"The language model server is not set up for tool calls (HTTP {status}); "
            "the bot's operator should check the bot's log.",
            status=status,
        )
    if names_missing_model(exc):
        log.error(
            "LLM model missing: %s does not serve the model '%s' (HTTP %d: %s); set llm.model (or the "
            "channel's model) to one it serves (GET %s/models lists them)",
            base_url,
            model,
            status,
            detail,
            base_url.rstrip("/"),
        )
        return ModelMissingError(
            f"The language model endpoint does not know the model '{model}' (HTTP {status}); "
            "the bot's operator should check llm.model.",
            status=status,
        )
    if is_missing_endpoint(exc):
        return endpoint_missing(str(exc.request.url.copy_with(query=None, userinfo=b"")), status, api=_api_of(exc))
    log.warning("LLM request failed: %r", exc)
    if status in (401, 403):
        sentence = (
            f"The language model rejected the bot's API key (HTTP {status}); "
            "the bot's operator should check llm.api_key."
        )
    elif status == 429:
        sentence = "The language model is rate-limiting requests (HTTP 429); please try again in a minute."
    elif status >= 500:
        sentence = f"The language model had a server error (HTTP {status}); please try again."
    else:
        sentence = f"The language model refused the request (HTTP {status}{': ' + detail if detail else ''})."
        if status in (400, 413, 422) and is_context_exceeded(message, exc.body):
            return ContextLengthError(
                sentence,
                status=status,
                limit=_number(_TOKENS_LIMIT, message),
                requested=_number(_TOKENS_ASKED, message),
            )
    return LLMError(sentence, status=status)


def _api_of(exc: openai.APIStatusError) -> str:
    return "responses" if exc.request.url.path.endswith("/responses") else "chat"


def _how_to_start(message: str) -> str:
    lowered = message.lower()
    if "jinja" in lowered:
        return _HOW_TO_START["llamacpp"]
    if "tool-choice" in lowered or "tool-call-parser" in lowered or "tool choice" in lowered:
        return _HOW_TO_START["vllm"]
    if "does not support tools" in lowered:
        return _HOW_TO_START["ollama"]
    return f"llama.cpp: {_HOW_TO_START['llamacpp']}; vLLM: {_HOW_TO_START['vllm']}; Ollama: {_HOW_TO_START['ollama']}"


def _number(pattern: re.Pattern[str], text: str) -> int | None:
    match = pattern.search(text)
    return int(match.group(1).replace(",", "")) if match else None


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split()).rstrip(".")
    return text if len(text) <= limit else text[: limit - 1] + "…"
