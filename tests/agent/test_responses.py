"""The Responses API beside chat completions: which one ``llm.api`` speaks, the same turn over
both, and a reasoning model's reasoning handed back with each tool result of its turn only."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from pydantic import SecretStr

from bot.agent import Agent, TurnResult
from bot.agent.llm import LLMClient, LLMError
from bot.config import LLMSettings
from kernels.seam.result import ExecutionResult, StreamChunk
from tests.agent.conftest import PreparedRunner, assert_valid_transcript, llm_settings
from tests.fakes.openai_server import (
    ScriptedOpenAI,
    Strictness,
    answer,
    delay,
    encrypted,
    error,
    garbage,
    last_tool_output,
    raw_tool_call,
    text_tool_call,
    tool_call,
)

SYSTEM = "You are a test assistant."
THOUGHT_1 = "SECRET-THOUGHT-ONE: load the file first"
THOUGHT_2 = "SECRET-THOUGHT-TWO: now the mean"


def printed(text: str) -> ExecutionResult:
    return ExecutionResult(streams=[StreamChunk("stdout", text)])


@dataclass
class Drafts:
    shown: list[str] = field(default_factory=list)

    async def draft(self, text: str) -> None:
        self.shown.append(text)

    async def drop_draft(self) -> None:
        self.shown.append("<dropped>")


@pytest_asyncio.fixture
async def responses_only() -> AsyncIterator[ScriptedOpenAI]:
    async with ScriptedOpenAI(apis=("responses",)) as server:
        yield server


async def turn(agent: Agent, text: str, runner: PreparedRunner | None = None, **kwargs: Any) -> TurnResult:
    result = await agent.run_turn(
        history=kwargs.pop("history", []),
        user_content=text,
        runner=runner or PreparedRunner(),
        system_prompt=SYSTEM,
        **kwargs,
    )
    assert_valid_transcript(result.new_messages)
    return result


def reasoning_ids(request: dict[str, Any]) -> list[str]:
    return [item["id"] for item in request["input"] if item.get("type") == "reasoning"]


# -- which API ---------------------------------------------------------------------------------


async def test_auto_finds_a_responses_only_server_once_and_says_so_once(
    responses_only: ScriptedOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    responses_only.script(answer("first"), answer("second"))
    client = LLMClient(llm_settings(responses_only))
    try:
        with caplog.at_level(logging.INFO, logger="bot.agent.llm"):
            assert client.api is None
            assert (await client.complete([{"role": "user", "content": "a"}])).content == "first"
            assert (await client.complete([{"role": "user", "content": "b"}])).content == "second"
    finally:
        await client.close()
    assert client.api == "responses"
    assert responses_only.missing == ["/v1/chat/completions"]  # asked once, remembered
    assert responses_only.endpoints == ["responses", "responses"]
    chosen = [r.getMessage() for r in caplog.records if r.getMessage().startswith("LLM API:")]
    assert chosen == [
        f"LLM API: responses at {responses_only.base_url} (llm.api: auto, POST /chat/completions answered HTTP 404)"
    ]


async def test_auto_keeps_chat_completions_where_the_server_has_them() -> None:
    async with ScriptedOpenAI(apis=("chat",)) as server:
        server.script(tool_call("print(1)"), answer("It printed 1."))
        agent = Agent(llm_settings(server))
        try:
            result = await turn(agent, "print 1", PreparedRunner(printed("1\n")))
        finally:
            await agent.close()
    assert result.text == "It printed 1."
    assert server.endpoints == ["chat", "chat"] and server.missing == []


def test_openais_own_endpoint_speaks_responses_without_asking() -> None:
    assert LLMClient(LLMSettings(base_url="https://api.openai.com/v1", api_key=SecretStr("k"))).api == "responses"
    assert (
        LLMClient(LLMSettings(base_url="https://api.openai.com/v1", api_key=SecretStr("k"), api="chat")).api == "chat"
    )
    assert LLMClient(LLMSettings(base_url="http://api.openai.com.example.net/v1")).api is None
    assert LLMClient(LLMSettings(base_url="http://127.0.0.1:8000/v1", api="responses")).api == "responses"


async def test_llm_api_responses_is_spoken_from_the_first_request(scripted_openai: ScriptedOpenAI) -> None:
    scripted_openai.script(answer("hi"))
    client = LLMClient(llm_settings(scripted_openai, api="responses", temperature=0.2, max_tokens=300))
    try:
        await client.complete(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "q"}],
            tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            tool_choice="none",
        )
    finally:
        await client.close()
    [body] = scripted_openai.requests
    assert scripted_openai.endpoints == ["responses"]
    assert body["instructions"] == SYSTEM and body["input"] == [{"role": "user", "content": "q"}]
    assert body["store"] is False and body["include"] == ["reasoning.encrypted_content"]
    assert body["tools"] == [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": False}]
    assert (body["tool_choice"], body["temperature"], body["max_output_tokens"]) == ("none", 0.2, 300)
    assert "max_tokens" not in body and "messages" not in body


# -- the same turn over both APIs --------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_two_step_turn_hands_each_tool_result_back_with_the_turns_reasoning(
    responses_only: ScriptedOpenAI, streamed: bool
) -> None:
    responses_only.script(
        tool_call("df = load()", reasoning=THOUGHT_1, content="Loading the file."),
        tool_call("print(df.x.mean())", reasoning=THOUGHT_2),
        lambda body: answer(f"The mean is {last_tool_output(body)}.", reasoning="SECRET-THOUGHT-THREE"),
        answer("You asked about the mean."),
    )
    drafts = Drafts()
    agent = Agent(llm_settings(responses_only))
    try:
        first = await turn(
            agent,
            "mean of x?",
            PreparedRunner(printed(""), printed("2.5\n")),
            drafts=drafts if streamed else None,
        )
        second = await turn(agent, "what did I ask?", history=first.new_messages)
    finally:
        await agent.close()
    assert first.text.startswith("The mean is ") and "2.5" in first.text
    assert second.text == "You asked about the mean."
    assert responses_only.rejected == []

    ask_1, ask_2, ask_3, next_turn = responses_only.requests
    assert responses_only.endpoints == ["responses"] * 4 and responses_only.missing == ["/v1/chat/completions"]
    assert reasoning_ids(ask_1) == []
    # Each tool result goes back after the reasoning that led to its call, as the server gave it.
    assert len(reasoning_ids(ask_2)) == 1 and len(reasoning_ids(ask_3)) == 2
    kinds = [item.get("type", item.get("role")) for item in ask_3["input"]]
    assert kinds == [
        "user",
        "reasoning",
        "message",
        "function_call",
        "function_call_output",
        "reasoning",
        "function_call",
        "function_call_output",
    ]
    sent = json.dumps(ask_3["input"])
    assert encrypted(THOUGHT_1) in sent and encrypted(THOUGHT_2) in sent
    # Not across turns: the next turn replays the stored history, which holds no reasoning.
    assert reasoning_ids(next_turn) == [] and "gAAAA" not in json.dumps(next_turn)
    assert [item.get("type", item.get("role")) for item in next_turn["input"]][:5] == [
        "user",
        "assistant",
        "function_call",
        "function_call_output",
        "function_call",
    ]
    # Never stored, never shown.
    for text in (json.dumps(first.new_messages), first.text, json.dumps(drafts.shown)):
        assert "SECRET-THOUGHT" not in text and "gAAAA" not in text
    if streamed:
        assert drafts.shown[-1] == first.text  # the answer streamed in as a draft
    assert first.usage.reasoning_tokens > 0
    assert first.usage.completion_tokens >= first.usage.reasoning_tokens


async def test_a_thread_may_switch_api_between_turns(scripted_openai: ScriptedOpenAI) -> None:
    scripted_openai.script(tool_call("x = 1"), answer("chat answer"), tool_call("print(x)"), answer("responses answer"))
    chat = Agent(llm_settings(scripted_openai, api="chat"))
    responses = Agent(llm_settings(scripted_openai, api="responses"))
    try:
        first = await turn(chat, "set x", PreparedRunner(printed("")))
        second = await turn(responses, "show x", PreparedRunner(printed("1\n")), history=first.new_messages)
        scripted_openai.script(answer("back on chat"))
        third = await turn(chat, "again", history=[*first.new_messages, *second.new_messages])
    finally:
        await chat.close()
        await responses.close()
    assert (first.text, second.text, third.text) == ("chat answer", "responses answer", "back on chat")
    assert scripted_openai.endpoints == ["chat", "chat", "responses", "responses", "chat"]
    assert scripted_openai.rejected == []
    replayed = scripted_openai.requests[2]["input"]
    assert [i.get("type", i.get("role")) for i in replayed][:4] == [
        "user",
        "function_call",
        "function_call_output",
        "assistant",
    ]


async def test_other_tools_go_out_as_responses_function_tools(responses_only: ScriptedOpenAI) -> None:
    @dataclass
    class Lookup:
        name: str = "lookup"
        spec: dict[str, Any] = field(
            default_factory=lambda: {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "description": "Look a word up.",
                    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
                },
            }
        )
        calls: list[str] = field(default_factory=list)

        async def call(self, arguments: str) -> str:
            self.calls.append(arguments)
            return "a small furry animal"

    lookup = Lookup()
    responses_only.script(raw_tool_call('{"word": "vole"}', name="lookup", reasoning="look it up"), answer("A vole."))
    agent = Agent(llm_settings(responses_only, api="responses"))
    try:
        result = await turn(agent, "what is a vole?", tools=[lookup])
    finally:
        await agent.close()
    assert result.text == "A vole." and lookup.calls == ['{"word": "vole"}']
    tools = {tool["name"]: tool for tool in responses_only.requests[0]["tools"]}
    assert set(tools) == {"python", "lookup"} and tools["lookup"]["description"] == "Look a word up."
    assert all(tool["strict"] is False and "function" not in tool for tool in tools.values())
    assert last_tool_output(responses_only.requests[1]) == "a small furry animal"
    assert reasoning_ids(responses_only.requests[1])


async def test_code_written_as_text_runs_over_responses_too(responses_only: ScriptedOpenAI) -> None:
    responses_only.script(text_tool_call("print(6 * 7)", style="fence"), answer("42."))
    agent = Agent(llm_settings(responses_only, api="responses"))
    runner = PreparedRunner(printed("42\n"))
    try:
        result = await turn(agent, "6 times 7?", runner)
    finally:
        await agent.close()
    assert runner.codes == ["print(6 * 7)"] and result.text == "42."


async def test_a_cut_off_response_gets_the_note(responses_only: ScriptedOpenAI) -> None:
    responses_only.script(answer("The sales gr", finish_reason="length"))
    agent = Agent(llm_settings(responses_only, api="responses"))
    try:
        result = await turn(agent, "explain")
    finally:
        await agent.close()
    assert result.text.startswith("The sales gr") and "cut off" in result.notice


async def test_a_context_refusal_on_responses_shrinks_the_history(responses_only: ScriptedOpenAI) -> None:
    history: list[dict[str, Any]] = []
    for n in range(6):
        history += [
            {"role": "user", "content": f"question {n} " + "q" * 300},
            {"role": "assistant", "content": f"answer {n} " + "a" * 300},
        ]
    responses_only.strict = Strictness(context_chars=2500, context_style="openai")
    responses_only.script(answer("fits now"))
    agent = Agent(llm_settings(responses_only, api="responses"))
    try:
        result = await turn(agent, "latest", history=history)
    finally:
        await agent.close()
    assert result.text == "fits now" and result.shrunk and len(responses_only.rejected) == 1


async def test_retries_timeouts_and_unreadable_replies_are_handled_alike(responses_only: ScriptedOpenAI) -> None:
    responses_only.script(error(503), delay(10), garbage(), answer("at last", usage=(12, 5)))
    client = LLMClient(llm_settings(responses_only, api="responses", request_timeout_s=0.3, max_retries=3))
    try:
        reply = await client.complete([{"role": "user", "content": "q"}])
    finally:
        await client.close()
    assert reply.content == "at last" and len(responses_only.requests) == 4
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.reasoning_tokens) == (12, 5, 0)


async def test_a_server_that_will_not_stream_responses_is_asked_plainly(responses_only: ScriptedOpenAI) -> None:
    responses_only.strict = Strictness(no_stream=True)
    responses_only.script(answer("plain one"), answer("plain two"))
    shown: list[str] = []

    async def on_text(text: str) -> None:
        shown.append(text)

    client = LLMClient(llm_settings(responses_only, api="responses"))
    try:
        first = await client.complete([{"role": "user", "content": "a"}], on_text=on_text)
        second = await client.complete([{"role": "user", "content": "b"}], on_text=on_text)
    finally:
        await client.close()
    assert (first.content, second.content) == ("plain one", "plain two")
    assert [bool(r.get("stream")) for r in responses_only.requests] == [True, False, False]


async def test_a_stream_that_ends_before_its_last_event_is_not_taken_for_the_answer() -> None:
    """A Responses stream closed cleanly before ``response.completed`` (a proxy's cut, a server
    that died mid-answer) holds part of a reply: it is asked again, never posted as the answer."""
    streams: list[int] = []

    async def cut_short(request: web.Request) -> web.StreamResponse:
        await request.read()
        streams.append(len(streams))
        reply = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await reply.prepare(request)
        delta = {"type": "response.output_text.delta", "output_index": 0, "delta": "The total is 4"}
        await reply.write(f"event: {delta['type']}\ndata: {json.dumps(delta)}\n\n".encode())
        await reply.write_eof()  # "2." and response.completed never come
        return reply

    app = web.Application()
    app.router.add_post("/v1/responses", cut_short)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    settings = LLMSettings(
        model="m", base_url=f"http://127.0.0.1:{port}/v1", api="responses", api_key=SecretStr("k"), max_retries=1
    )
    client = LLMClient(settings)
    shown: list[str] = []

    async def on_text(text: str) -> None:
        shown.append(text)

    try:
        with pytest.raises(LLMError, match="could not be read"):
            await client.complete([{"role": "user", "content": "what is 2 + 2?"}], on_text=on_text)
    finally:
        await client.close()
        await runner.cleanup()
    assert len(streams) == 2 and shown == ["The total is 4", "The total is 4"]  # drafted, then asked again
