"""LLMClient retries and one-sentence failures, against the scripted server."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio

from bot.agent.llm import LLMClient, LLMError
from tests.agent.conftest import llm_settings
from tests.fakes.openai_server import ScriptedOpenAI, answer, delay, error, garbage

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
    reply = await make_client(**overrides).complete(MESSAGES, model="other", tools=[{"type": "function", "function": {
        "name": "python", "parameters": {"type": "object"}}}], tool_choice="none")
    body = scripted_openai.requests[0]
    assert (body["model"], body["temperature"], body["tool_choice"]) == ("other", 0.1, "none")
    assert body["messages"] == MESSAGES and "stream" not in body
    assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0
