"""Streamed replies: the text arrives as it is written, whole and in order; code is never shown
as a draft; a server that will not stream is asked plainly."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest_asyncio

from bot.agent import Agent
from bot.agent.llm import LLMClient
from bot.agent.wire_chat import ChatStream
from kernels.seam.result import ExecutionResult, StreamChunk
from tests.agent.conftest import PreparedRunner, llm_settings
from tests.fakes.openai_server import ScriptedOpenAI, Strictness, answer, text_tool_call, tool_call

MESSAGES = [{"role": "user", "content": "hello"}]
LONG = "The mean is **42.0**, computed over 1,000 rows; " * 8


@dataclass
class Drafts:
    """Records what a platform would show."""

    events: list[tuple[str, str]] = field(default_factory=list)

    async def draft(self, text: str) -> None:
        self.events.append(("draft", text))

    async def drop_draft(self) -> None:
        self.events.append(("drop", ""))


@pytest_asyncio.fixture
async def agent(scripted_openai: ScriptedOpenAI) -> AsyncIterator[Agent]:
    made = Agent(llm_settings(scripted_openai))
    yield made
    await made.close()


async def test_streamed_text_grows_in_order_and_ends_whole(scripted_openai: ScriptedOpenAI) -> None:
    scripted_openai.script(answer(LONG, usage=(11, 22)))
    seen: list[str] = []

    async def on_text(text: str) -> None:
        seen.append(text)

    client = LLMClient(llm_settings(scripted_openai))
    try:
        reply = await client.complete(MESSAGES, on_text=on_text)
    finally:
        await client.close()
    assert reply.content == LONG and seen[-1] == LONG and len(seen) > 10
    assert all(later.startswith(earlier) for earlier, later in zip(seen, seen[1:]))
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (11, 22)
    assert scripted_openai.requests[0]["stream"] is True


async def test_a_streamed_tool_call_is_put_together(scripted_openai: ScriptedOpenAI) -> None:
    code = "import pandas as pd\nprint(pd.__version__)  # a call long enough to come in pieces"
    scripted_openai.script(tool_call(code, "x = 1"))
    client = LLMClient(llm_settings(scripted_openai))
    try:
        reply = await client.complete(MESSAGES, on_text=lambda text: _nothing())
    finally:
        await client.close()
    assert [c.name for c in reply.tool_calls] == ["python", "python"]
    assert '"x = 1"' in reply.tool_calls[1].arguments and "pd.__version__" in reply.tool_calls[0].arguments
    assert reply.finish_reason == "tool_calls"


async def test_a_server_that_refuses_streaming_is_asked_plainly_from_then_on(scripted_openai: ScriptedOpenAI) -> None:
    scripted_openai.strict = Strictness(no_stream=True)
    scripted_openai.script(answer("first"), answer("second"))
    seen: list[str] = []

    async def on_text(text: str) -> None:
        seen.append(text)

    client = LLMClient(llm_settings(scripted_openai))
    try:
        assert (await client.complete(MESSAGES, on_text=on_text)).content == "first"
        assert (await client.complete(MESSAGES, on_text=on_text)).content == "second"
    finally:
        await client.close()
    assert seen == []
    assert [bool(body.get("stream")) for body in scripted_openai.requests] == [True, False, False]
    assert scripted_openai.rejected == ["stream_options: extra inputs are not permitted"]


async def test_only_the_answer_is_drafted(scripted_openai: ScriptedOpenAI, agent: Agent) -> None:
    scripted_openai.script(
        tool_call("print(1)", content="Let me look at the data first."),
        text_tool_call("print(2)", style="fence"),
        answer(LONG),
    )
    runner = PreparedRunner(_printed("1"), _printed("2"))
    drafts = Drafts()
    result = await agent.run_turn(history=[], user_content="q", runner=runner, system_prompt="s", drafts=drafts)
    assert result.text == LONG.strip()
    texts = [text for kind, text in drafts.events if kind == "draft"]
    # The words before a tool call were shown, then taken away; the fenced code never was.
    assert drafts.events.index(("drop", "")) < drafts.events.index(("draft", texts[-1]))
    assert not any("print(2)" in text or "```" in text for text in texts)
    assert texts[-1] == LONG and drafts.events[-1][0] == "draft"


async def _nothing() -> None:
    return None


def _printed(text: str) -> ExecutionResult:
    return ExecutionResult(streams=[StreamChunk("stdout", text + "\n")])


async def test_a_stream_without_usage_is_counted_by_its_length(scripted_openai: ScriptedOpenAI) -> None:
    # llama-cpp-python ignores stream_options.include_usage: a turn must still count.
    scripted_openai.strict = Strictness(omit_usage=True)
    scripted_openai.script(answer("x" * 400))
    client = LLMClient(llm_settings(scripted_openai))
    try:
        reply = await client.complete(MESSAGES, on_text=lambda text: _nothing())
    finally:
        await client.close()
    assert reply.usage.completion_tokens == 100 and reply.usage.prompt_tokens > 0


def test_streamed_chunks_are_read_as_json_and_garbage_in_them_is_passed_over() -> None:
    # The client hands chat chunks over as parsed JSON (its types cost more than the turn's
    # other model work): what a server sends wrongly is skipped, as the typed read skipped it.
    reply = ChatStream()
    chunks: list[Any] = [
        "not a chunk",
        {"choices": {"0": {}}},
        {"choices": [{"delta": ["no", "object"]}]},
        {"choices": [{"delta": {"content": "The answer "}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "python"}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"code": '}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"1 + 1"}'}}]}}]},
        {"choices": [{"delta": {"content": "is 2."}, "finish_reason": "stop"}]},
        {
            "choices": [],
            "usage": {
                "prompt_tokens": 7,
                "completion_tokens": "many",
                "completion_tokens_details": {"reasoning_tokens": 3},
            },
        },
    ]
    shown = [reply.add(chunk) for chunk in chunks]
    assert shown == [False, False, False, True, False, False, False, True, False]
    completion = reply.completion()
    assert completion.content == "The answer is 2." and completion.finish_reason == "stop"
    assert [(c.id, c.name, c.arguments) for c in completion.tool_calls] == [("c1", "python", '{"code": "1 + 1"}')]
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (7, 0)
    assert completion.usage.reasoning_tokens == 3 and reply.usage_reported
