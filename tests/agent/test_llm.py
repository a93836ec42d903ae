"""LLMClient retries and one-sentence failures, against the scripted server."""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import openai
import pytest
import pytest_asyncio

from bot.agent.llm import ContextLengthError, LLMClient, LLMError
from bot.config import LLMSettings
from tests.agent.conftest import llm_settings
from tests.fakes.openai_server import ScriptedOpenAI, Strictness, answer, delay, error, garbage, tool_call

MESSAGES = [{"role": "user", "content": "hello"}]

MakeClient = Callable[..., LLMClient]


@pytest_asyncio.fixture
async def make_client(scripted_openai: ScriptedOpenAI) -> AsyncIterator[MakeClient]:
    """Build LLMClients for the scripted server (``server=`` picks another); close them after."""
    clients: list[LLMClient] = []

    def make(server: ScriptedOpenAI | None = None, **overrides: Any) -> LLMClient:
        clients.append(LLMClient(llm_settings(server or scripted_openai, **overrides)))
        return clients[-1]

    yield make
    for made in clients:
        await made.close()


async def test_server_error_then_success(scripted_openai: ScriptedOpenAI, make_client: MakeClient) -> None:
    scripted_openai.script(error(500), answer("recovered"))
    reply = await make_client().complete(MESSAGES)
    assert reply.content == "recovered"
    assert len(scripted_openai.requests) == 2


async def test_rate_limit_honours_retry_after(scripted_openai: ScriptedOpenAI, make_client: MakeClient) -> None:
    # Without the header the client's first backoff is at most 0.5 s.
    scripted_openai.script(error(429, retry_after=1.2), answer("after the wait"))
    started = time.monotonic()
    reply = await make_client().complete(MESSAGES)
    assert reply.content == "after the wait"
    assert time.monotonic() - started >= 1.2


async def test_timeout_then_success(scripted_openai: ScriptedOpenAI, make_client: MakeClient) -> None:
    scripted_openai.script(delay(10), answer("second try"))
    started = time.monotonic()
    reply = await make_client(request_timeout_s=0.3).complete(MESSAGES)
    assert reply.content == "second try"
    assert time.monotonic() - started < 3


async def test_timeouts_exhausted_is_one_sentence(scripted_openai: ScriptedOpenAI, make_client: MakeClient) -> None:
    scripted_openai.script(delay(10), delay(10))
    overrides = {"request_timeout_s": 0.2, "max_retries": 1}
    with pytest.raises(LLMError) as failure:
        await make_client(**overrides).complete(MESSAGES)
    assert str(failure.value) == "The language model did not answer within 0.2 seconds; please try again."


async def test_bad_key_is_not_retried_and_never_echoed(make_client: MakeClient) -> None:
    async with ScriptedOpenAI(api_key="the-right-key") as server:
        with pytest.raises(LLMError) as failure:
            await make_client(server, api_key="sk-wrong-secret-key").complete(MESSAGES)
        message = str(failure.value)
        assert failure.value.status == 401
        assert "API key" in message and "HTTP 401" in message
        assert "sk-wrong" not in message and "\n" not in message and message.count(". ") == 0
        assert len(server.requests) == 1


async def test_server_errors_exhausted(scripted_openai: ScriptedOpenAI, make_client: MakeClient) -> None:
    scripted_openai.script(error(503), error(503))
    with pytest.raises(LLMError, match=r"^The language model had a server error \(HTTP 503\); please try again\.$"):
        await make_client(max_retries=1).complete(MESSAGES)
    assert scripted_openai.remaining == 0


async def test_bad_request_names_the_reason(scripted_openai: ScriptedOpenAI, make_client: MakeClient) -> None:
    scripted_openai.script(error(400, "This model's maximum context length is 8192 tokens."))
    with pytest.raises(LLMError) as failure:
        await make_client().complete(MESSAGES)
    assert str(failure.value) == (
        "The language model refused the request (HTTP 400: This model's maximum context length is 8192 tokens)."
    )
    assert len(scripted_openai.requests) == 1


async def test_unreadable_body_is_retried(scripted_openai: ScriptedOpenAI, make_client: MakeClient) -> None:
    scripted_openai.script(garbage(), answer("readable"))
    reply = await make_client().complete(MESSAGES)
    assert reply.content == "readable"


async def test_unreadable_body_exhausted(scripted_openai: ScriptedOpenAI, make_client: MakeClient) -> None:
    scripted_openai.script(garbage(), garbage("{}"))
    with pytest.raises(LLMError, match="could not be read"):
        await make_client(max_retries=1).complete(MESSAGES)


async def test_request_shape(scripted_openai: ScriptedOpenAI, make_client: MakeClient) -> None:
    scripted_openai.script(answer("ok"))
    overrides = {"temperature": 0.1}
    reply = await make_client(**overrides).complete(
        MESSAGES,
        model="other",
        tools=[{"type": "function", "function": {"name": "python", "parameters": {"type": "object"}}}],
        tool_choice="none",
    )
    body = scripted_openai.requests[0]
    assert (body["model"], body["temperature"], body["tool_choice"]) == ("other", 0.1, "none")
    assert body["messages"] == MESSAGES and "stream" not in body
    assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0


async def test_a_timeout_is_retried_once_at_most(scripted_openai: ScriptedOpenAI, make_client: MakeClient) -> None:
    # max_retries covers 429/5xx; a server that timed out is often still generating, and each
    # retry would queue one more endless generation on a one-at-a-time local server.
    scripted_openai.script(delay(10), delay(10), answer("third try is never made"))
    with pytest.raises(LLMError, match="did not answer within 0.2 seconds"):
        await make_client(request_timeout_s=0.2, max_retries=5).complete(MESSAGES)
    assert len(scripted_openai.requests) == 2 and scripted_openai.remaining == 1


async def test_max_tokens_is_sent_on_every_request(scripted_openai: ScriptedOpenAI, make_client: MakeClient) -> None:
    scripted_openai.script(answer("a"), answer("b"))
    await make_client().complete(MESSAGES)
    await make_client(max_tokens=None).complete(MESSAGES)
    assert scripted_openai.requests[0]["max_tokens"] == 4096
    assert "max_tokens" not in scripted_openai.requests[1]


async def test_messages_are_sent_in_the_strict_shape(scripted_openai: ScriptedOpenAI, make_client: MakeClient) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "python", "arguments": '{"code": "1"}'}}
    stored = [
        {"role": "user", "content": "q", "name": None},
        {"role": "assistant", "content": None, "refusal": None, "tool_calls": [call], "function_call": None},
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
        {"role": "notice", "content": "our own words"},
        {"role": "assistant", "content": "done", "tool_calls": []},
    ]
    scripted_openai.script(answer("ok"))
    await make_client().complete(stored)
    assert scripted_openai.requests[0]["messages"] == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
        {"role": "assistant", "content": "done"},
    ]


@pytest.mark.parametrize(
    "message",
    [
        "This model's maximum context length is 2048 tokens. However, your messages resulted in 3000 tokens.",
        "This model's maximum context length is 2048 tokens. However, you requested 4500 tokens "
        "(404 in the messages, 4096 in the completion). Please reduce the length of the messages or completion.",
        "the request exceeds the available context size, try increasing it",
        "Input prompt is too big compared to KV size.",
        "Requested tokens (2100) exceed context window of 2048",
        "prompt too long; exceeded max context length by 12 tokens",
        "litellm.ContextWindowExceededError: litellm.BadRequestError: ContextWindowExceededError",
        "prompt is too long: 210000 tokens > 200000 maximum",
        "Too many tokens in the request.",
    ],
)
async def test_context_length_refusals_are_recognised(
    scripted_openai: ScriptedOpenAI, make_client: MakeClient, message: str
) -> None:
    scripted_openai.script(error(400, message))
    with pytest.raises(ContextLengthError) as failure:
        await make_client().complete(MESSAGES)
    assert failure.value.status == 400 and "HTTP 400" in str(failure.value)


async def test_other_bad_requests_are_not_context_errors(
    scripted_openai: ScriptedOpenAI, make_client: MakeClient
) -> None:
    scripted_openai.script(error(400, "tool_choice 'required' is not supported"))
    with pytest.raises(LLMError) as failure:
        await make_client().complete(MESSAGES)
    assert not isinstance(failure.value, ContextLengthError)


async def test_sparse_reply_without_usage_is_read(make_client: MakeClient) -> None:
    async with ScriptedOpenAI(strict=Strictness(sparse=True, omit_usage=True)) as server:
        server.script(tool_call("print(1)"), answer("fine"))
        client = make_client(server)
        first = await client.complete(MESSAGES)
        assert first.tool_calls[0].name == "python" and first.finish_reason is None
        assert first.message()["content"] == ""
        second = await client.complete(MESSAGES)
        assert second.content == "fine"
        assert (second.usage.prompt_tokens, second.usage.completion_tokens) == (0, 0)


async def test_a_refused_connection_is_named_as_one_not_as_a_timeout(make_client: MakeClient) -> None:
    # The SDK's aiohttp transport reports a refused connection as a connect timeout: the
    # person must read that the model could not be reached, at once, not that it was slow.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    client = LLMClient(
        LLMSettings(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", model="m", request_timeout_s=30, max_retries=0)
    )
    started = time.monotonic()
    try:
        with pytest.raises(LLMError) as failure:
            await client.complete(MESSAGES)
    finally:
        await client.close()
    assert (
        str(failure.value)
        == f"The language model at http://127.0.0.1:{port}/v1 could not be reached; please try again later."
    )
    assert isinstance(failure.value.__cause__, openai.APIConnectionError)
    assert not isinstance(failure.value.__cause__, openai.APITimeoutError)
    assert time.monotonic() - started < 5
