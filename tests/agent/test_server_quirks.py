"""What servers differ on: reasoning sent beside the answer (never shown, never stored), the
parameters reasoning models refuse, and the three set-up mistakes told apart."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from bot.agent.failures import EndpointMissingError, LLMError, ModelMissingError, ToolsUnsupportedError
from bot.agent.llm import LLMClient
from bot.agent.loop import PYTHON_TOOL
from bot.app import Core
from tests.agent.conftest import llm_settings
from tests.conftest import make_settings
from tests.fakes.memory import MemoryChat
from tests.fakes.openai_server import O_SERIES, ScriptedOpenAI, Strictness, answer, error, tool_call

MESSAGES = [{"role": "user", "content": "hello"}]
SECRET = "SECRET-REASONING"


# -- reasoning is never shown ------------------------------------------------------------------


@pytest_asyncio.fixture
async def core(tmp_path: Path, scripted_openai: ScriptedOpenAI) -> AsyncIterator[Core]:
    settings = make_settings(tmp_path, llm_url=scripted_openai.base_url, llm={"api": "chat"})
    async with Core.open(settings) as running:
        yield running


async def test_reasoning_content_never_reaches_the_answer_drafts_history_or_notebook(
    scripted_openai: ScriptedOpenAI, core: Core
) -> None:
    chat = MemoryChat(core.dispatcher)
    scripted_openai.script(
        tool_call("x = 6 * 7\nprint(x)", reasoning=f"{SECRET} one: compute it"),
        answer("x is 42.", reasoning=f"{SECRET} two: it printed 42", pace_s=0.01),
    )
    out = await chat.say("what is 6 times 7?")
    assert out.reply.text == "x is 42."
    assert ("draft", "x is 42.") in out.progress_log  # it did stream as a draft…
    assert SECRET not in json.dumps(out.progress_log)  # …without its reasoning
    assert SECRET not in json.dumps(await core.store.transcripts.history(chat.key()))
    export = (await chat.say("export", mentioned=False)).reply.files[0]
    with export.open_reader() as reader:
        notebook = reader.read().decode()
    assert "x = 6 * 7" in notebook and SECRET not in notebook
    assert all(SECRET not in json.dumps(request) for request in scripted_openai.requests)  # nor sent back


@pytest.mark.parametrize("stream", [False, True])
async def test_a_leading_think_block_is_not_the_answer(scripted_openai: ScriptedOpenAI, stream: bool) -> None:
    scripted_openai.script(answer(f"<think>{SECRET}: the user greets me</think>\n\nHello!", pace_s=0.001))
    shown: list[str] = []

    async def on_text(text: str) -> None:
        shown.append(text)

    client = LLMClient(llm_settings(scripted_openai))
    try:
        reply = await client.complete(MESSAGES, on_text=on_text if stream else None)
    finally:
        await client.close()
    assert reply.content == "Hello!"
    assert SECRET not in json.dumps(shown) and (shown[-1] == "Hello!" if stream else shown == [])


# -- parameters ---------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["o3-mini", "o1", "gpt-5", "gpt-5.1-mini", "openai/o4-mini-2025-04-16"])
async def test_reasoning_models_get_max_completion_tokens_and_no_temperature(
    scripted_openai: ScriptedOpenAI, model: str
) -> None:
    scripted_openai.strict = Strictness(refuse_params=O_SERIES)
    scripted_openai.script(answer("ok"))
    client = LLMClient(llm_settings(scripted_openai, temperature=0.2, max_tokens=500))
    try:
        await client.complete(MESSAGES, model=model)
    finally:
        await client.close()
    [body] = scripted_openai.requests
    assert body["max_completion_tokens"] == 500 and "max_tokens" not in body and "temperature" not in body
    assert scripted_openai.rejected == []


@pytest.mark.parametrize("model", ["gpt-4o-mini", "o", "foo3", "gpt-50x"])
async def test_other_models_get_max_tokens_and_temperature(scripted_openai: ScriptedOpenAI, model: str) -> None:
    scripted_openai.script(answer("ok"))
    client = LLMClient(llm_settings(scripted_openai, temperature=0.2, max_tokens=500))
    try:
        await client.complete(MESSAGES, model=model)
    finally:
        await client.close()
    [body] = scripted_openai.requests
    assert (body["max_tokens"], body["temperature"]) == (500, 0.2) and "max_completion_tokens" not in body


async def test_a_refused_parameter_is_asked_again_once_and_remembered_for_the_model(
    scripted_openai: ScriptedOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    """An Azure deployment of a reasoning model has a name of its own: its refusals teach the client."""
    scripted_openai.strict = Strictness(refuse_params=O_SERIES)
    scripted_openai.script(answer("first"), answer("second"), answer("other model"))
    client = LLMClient(llm_settings(scripted_openai, temperature=0.2, max_tokens=500, max_retries=0))
    try:
        with caplog.at_level(logging.WARNING, logger="bot.agent.params"):
            assert (await client.complete(MESSAGES, model="our-reasoner")).content == "first"
            assert (await client.complete(MESSAGES, model="our-reasoner")).content == "second"
        scripted_openai.strict = Strictness()
        assert (await client.complete(MESSAGES, model="plain")).content == "other model"
    finally:
        await client.close()
    refused, retried, served, remembered, plain = scripted_openai.requests
    assert "temperature" in refused and "temperature" not in retried and "max_tokens" in retried
    assert "max_tokens" not in served and served["max_completion_tokens"] == 500
    assert "temperature" not in remembered and remembered["max_completion_tokens"] == 500  # no refusal this time
    assert (plain["temperature"], plain["max_tokens"]) == (0.2, 500)  # another model is not affected
    assert len(scripted_openai.rejected) == 2
    learned = [r.getMessage() for r in caplog.records]
    assert any("'temperature'" in line and "without it" in line for line in learned)
    assert any("'max_tokens'" in line and "'max_completion_tokens' instead" in line for line in learned)


async def test_a_refused_tool_choice_is_dropped_once(scripted_openai: ScriptedOpenAI) -> None:
    scripted_openai.strict = Strictness(
        refuse_params={"tool_choice": "Unrecognized request argument supplied: tool_choice"}
    )
    scripted_openai.script(answer("summary"))
    client = LLMClient(llm_settings(scripted_openai, max_retries=0))
    try:
        reply = await client.complete(MESSAGES, tools=[PYTHON_TOOL], tool_choice="none")
    finally:
        await client.close()
    assert reply.content == "summary" and "tool_choice" not in scripted_openai.requests[-1]


async def test_a_parameter_retry_happens_once_per_parameter(scripted_openai: ScriptedOpenAI) -> None:
    scripted_openai.script(
        error(400, "'temperature' is not supported", param="temperature"),
        error(400, "'temperature' is not supported", param="temperature"),
    )
    client = LLMClient(llm_settings(scripted_openai, temperature=0.5, max_retries=0))
    try:
        with pytest.raises(LLMError, match="HTTP 400"):
            await client.complete(MESSAGES)
    finally:
        await client.close()
    assert len(scripted_openai.requests) == 2 and "temperature" not in scripted_openai.requests[1]


# -- three set-up mistakes, three messages -----------------------------------------------------


async def test_a_missing_endpoint_model_and_tool_support_are_three_messages(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="bot.agent.failures")
    sentences: dict[str, str] = {}

    async with ScriptedOpenAI(apis=("responses",)) as server:  # llm.api: chat at a server without it
        client = LLMClient(llm_settings(server, api="chat"))
        with pytest.raises(EndpointMissingError) as endpoint:
            await client.complete(MESSAGES)
        await client.close()
        sentences["endpoint"] = str(endpoint.value)
        endpoint_line = f"LLM endpoint missing: POST {server.base_url}/chat/completions answered HTTP 404"

    async with ScriptedOpenAI(strict=Strictness(check_model=True)) as server:
        client = LLMClient(llm_settings(server, model="gpt-4o-typo"))
        with pytest.raises(ModelMissingError) as model:
            await client.complete(MESSAGES)
        await client.close()
        sentences["model"] = str(model.value)
        assert server.endpoints == ["chat"]  # a missing model is no reason to try the other API

    async with ScriptedOpenAI(strict=Strictness(no_tools="llamacpp")) as server:
        client = LLMClient(llm_settings(server))
        with pytest.raises(ToolsUnsupportedError) as tools:
            await client.complete(MESSAGES, tools=[PYTHON_TOOL])
        await client.close()
        sentences["tools"] = str(tools.value)
        assert len(server.requests) == 1  # llama.cpp says it with HTTP 500: not retried

    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 3 and all("\n" not in line for line in lines)
    assert lines[0].startswith(endpoint_line) and "llm.api: responses" in lines[0] and "/v1" in lines[0]
    assert lines[1].startswith("LLM model missing:") and "'gpt-4o-typo'" in lines[1] and "/models" in lines[1]
    assert lines[2].startswith("LLM server without tool calls:") and "--jinja" in lines[2]
    assert sentences == {
        "endpoint": "The language model server does not offer the API the bot speaks (HTTP 404); "
        "the bot's operator should check llm.base_url and llm.api.",
        "model": "The language model endpoint does not know the model 'gpt-4o-typo' (HTTP 404); "
        "the bot's operator should check llm.model.",
        "tools": "The language model server is not set up for tool calls (HTTP 500); "
        "the bot's operator should check the bot's log.",
    }


@pytest.mark.parametrize(
    ("server", "how"),
    [("vllm", "--enable-auto-tool-choice --tool-call-parser"), ("ollama", "tool support")],
)
async def test_each_server_without_tools_is_told_how_to_start_with_them(
    caplog: pytest.LogCaptureFixture, server: str, how: str
) -> None:
    caplog.set_level(logging.ERROR, logger="bot.agent.failures")
    async with ScriptedOpenAI(strict=Strictness(no_tools=server)) as fake:
        client = LLMClient(llm_settings(fake))
        with pytest.raises(ToolsUnsupportedError, match=r"^The language model server is not set up for tool calls"):
            await client.complete(MESSAGES, tools=[PYTHON_TOOL], on_text=_ignore)  # streamed: the same
        await client.close()
    [line] = [record.getMessage() for record in caplog.records]
    assert how in line


async def test_auto_at_a_server_with_neither_api_says_check_the_base_url(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="bot.agent.failures")
    async with ScriptedOpenAI(apis=()) as server:
        client = LLMClient(llm_settings(server))
        with pytest.raises(EndpointMissingError):
            await client.complete(MESSAGES)
        await client.close()
        assert server.missing == ["/v1/chat/completions", "/v1/responses"]
    [line] = [record.getMessage() for record in caplog.records]
    assert "/chat/completions answered HTTP 404 and POST" in line and "/responses HTTP 404" in line
    assert "llm.base_url must be the API's root" in line


async def test_the_person_in_the_thread_gets_one_sentence(tmp_path: Path) -> None:
    async with ScriptedOpenAI(strict=Strictness(no_tools="vllm")) as server:
        async with Core.open(make_settings(tmp_path, llm_url=server.base_url)) as core:
            out = await MemoryChat(core.dispatcher).say("plot my data")
    text = out.reply.text
    assert text == (
        "The language model server is not set up for tool calls (HTTP 400); the bot's operator should check the bot's log."
    )


async def _ignore(text: str) -> None:
    return None
