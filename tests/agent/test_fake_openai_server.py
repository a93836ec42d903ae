"""The scripted OpenAI server, driven by the real openai client."""

from __future__ import annotations

import json
import time

import aiohttp
import openai
import pytest

from tests.fakes.openai_server import (
    ScriptedOpenAI,
    Strictness,
    answer,
    delay,
    encrypted,
    error,
    garbage,
    raw_tool_call,
    tool_call,
)


def client(server: ScriptedOpenAI, **kwargs: object) -> openai.AsyncOpenAI:
    options: dict[str, object] = {"base_url": server.base_url, "api_key": "k", "max_retries": 0, **kwargs}
    return openai.AsyncOpenAI(**options)  # type: ignore[arg-type]


async def test_answer_and_tool_calls_are_served_and_requests_recorded(scripted_openai: ScriptedOpenAI) -> None:
    scripted_openai.script(tool_call("print(1)", "x = 2"), answer("done", usage=(7, 3)))
    llm = client(scripted_openai)
    messages = [{"role": "user", "content": "hi"}]

    first = await llm.chat.completions.create(model="m1", messages=messages)  # type: ignore[arg-type]
    calls = first.choices[0].message.tool_calls or []
    codes = [json.loads(c.function.arguments)["code"] for c in calls]  # type: ignore[union-attr]
    assert codes == ["print(1)", "x = 2"]
    assert first.choices[0].finish_reason == "tool_calls"
    assert len({c.id for c in calls}) == 2

    second = await llm.chat.completions.create(model="m1", messages=messages)  # type: ignore[arg-type]
    assert second.choices[0].message.content == "done"
    assert second.usage is not None and (second.usage.prompt_tokens, second.usage.completion_tokens) == (7, 3)

    assert [r["messages"] for r in scripted_openai.requests] == [messages, messages]
    assert scripted_openai.requests[0]["model"] == "m1"
    assert scripted_openai.remaining == 0
    assert scripted_openai.served_usage[0] >= 7 + 1 and scripted_openai.served_usage[1] >= 3 + 1


async def test_sse_streaming_carries_text_tool_calls_and_usage(scripted_openai: ScriptedOpenAI) -> None:
    long_text = "The answer is forty-two, as computed."
    scripted_openai.script(answer(long_text), tool_call('print("a, b")'))
    llm = client(scripted_openai)

    stream = await llm.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "q"}], stream=True, stream_options={"include_usage": True}
    )
    pieces, usage = [], None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    assert "".join(pieces) == long_text
    assert len(pieces) > 1  # really streamed in pieces
    assert usage is not None and usage.completion_tokens > 0

    stream = await llm.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}], stream=True)
    arguments, finish = "", None
    async for chunk in stream:
        for delta_call in chunk.choices[0].delta.tool_calls or ():
            assert delta_call.index == 0
            arguments += (delta_call.function.arguments if delta_call.function else "") or ""
        finish = chunk.choices[0].finish_reason or finish
    assert json.loads(arguments) == {"code": 'print("a, b")'}
    assert finish == "tool_calls"


async def test_error_statuses_have_openai_bodies_and_retry_after(scripted_openai: ScriptedOpenAI) -> None:
    scripted_openai.script(error(500), error(429, retry_after=0.25))
    llm = client(scripted_openai)
    with pytest.raises(openai.InternalServerError) as server_error:
        await llm.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
    assert server_error.value.status_code == 500
    assert "server had an error" in server_error.value.message

    with pytest.raises(openai.RateLimitError) as rate_limited:
        await llm.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
    assert rate_limited.value.response.headers["retry-after"] == "0.25"


async def test_api_key_check_does_not_consume_steps() -> None:
    async with ScriptedOpenAI(api_key="right") as server:
        server.script(answer("secret answer"))
        with pytest.raises(openai.AuthenticationError):
            await client(server, api_key="wrong").chat.completions.create(model="m", messages=[])
        assert server.remaining == 1
        ok = await client(server, api_key="right").chat.completions.create(model="m", messages=[])
        assert ok.choices[0].message.content == "secret answer"


async def test_callable_step_sees_the_request(scripted_openai: ScriptedOpenAI) -> None:
    scripted_openai.script(lambda body: answer("echo: " + body["messages"][-1]["content"]))
    reply = await client(scripted_openai).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "ping"}]
    )
    assert reply.choices[0].message.content == "echo: ping"


async def test_delay_triggers_client_timeout(scripted_openai: ScriptedOpenAI) -> None:
    scripted_openai.script(delay(10), answer("on time"))
    llm = client(scripted_openai, timeout=0.3)
    started = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        await llm.chat.completions.create(model="m", messages=[])
    assert time.monotonic() - started < 2
    reply = await llm.chat.completions.create(model="m", messages=[])
    assert reply.choices[0].message.content == "on time"


async def test_garbage_raw_arguments_and_exhaustion(scripted_openai: ScriptedOpenAI) -> None:
    scripted_openai.script(raw_tool_call('{"code": "print('), garbage())
    llm = client(scripted_openai)
    bad = await llm.chat.completions.create(model="m", messages=[])
    bad_call = bad.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert bad_call.function.arguments == '{"code": "print('  # type: ignore[union-attr]

    async with aiohttp.ClientSession() as http:
        async with http.post(f"{scripted_openai.base_url}/chat/completions", json={"messages": []}) as response:
            assert response.status == 200
            assert await response.text() == "this is not json"

    with pytest.raises(openai.BadRequestError, match="script exhausted"):
        await llm.chat.completions.create(model="m", messages=[])
    assert scripted_openai.exhausted == 1


async def test_models_endpoint(scripted_openai: ScriptedOpenAI) -> None:
    models = await client(scripted_openai).models.list()
    assert [m.id async for m in models] == ["fake-model"]


async def test_strictness_modes_refuse_without_consuming_a_step() -> None:
    strict = Strictness(null_fields=500, tool_choice_required=True, context_chars=200, context_style="vllm")
    async with ScriptedOpenAI(strict=strict) as server:
        server.script(answer("ok"))
        llm = client(server)
        with pytest.raises(openai.InternalServerError):
            await llm.with_options(max_retries=0).chat.completions.create(
                model="m", messages=[{"role": "assistant", "content": None}]
            )
        with pytest.raises(openai.BadRequestError):
            await llm.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "q"}],
                tool_choice="required",
                tools=[{"type": "function", "function": {"name": "python", "parameters": {"type": "object"}}}],
            )
        with pytest.raises(openai.BadRequestError, match="maximum context length is 50 tokens"):
            await llm.chat.completions.create(model="m", messages=[{"role": "user", "content": "q" * 300}])
        assert len(server.rejected) == 3 and server.remaining == 1


async def test_empty_deltas_and_no_usage_when_streaming() -> None:
    async with ScriptedOpenAI(strict=Strictness(empty_deltas=True, omit_usage=True)) as server:
        server.script(answer("streamed text"))
        stream = await client(server).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "q"}], stream=True, stream_options={"include_usage": True}
        )
        pieces, usages = [], []
        async for chunk in stream:
            usages.append(chunk.usage)
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
        assert "".join(pieces) == "streamed text" and usages == [None] * len(usages)


# -- the Responses API ------------------------------------------------------------------------

FLAT_TOOL = {
    "type": "function",
    "name": "python",
    "description": "Run code.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    "strict": False,
}


def strict_client(server: ScriptedOpenAI) -> openai.AsyncOpenAI:
    """A client that validates every reply against the SDK's own Responses types."""
    return openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0, _strict_response_validation=True)


async def test_responses_are_served_in_the_sdks_own_types(scripted_openai: ScriptedOpenAI) -> None:
    scripted_openai.script(tool_call("print(1)", reasoning="first I think"), answer("It is 1.", usage=(9, 4)))
    llm = strict_client(scripted_openai)
    first = await llm.responses.create(model="m", input="q", tools=[FLAT_TOOL], store=False)  # type: ignore[list-item]
    reasoning, call = first.output
    assert reasoning.type == "reasoning" and reasoning.encrypted_content == encrypted("first I think")
    assert call.type == "function_call" and json.loads(call.arguments) == {"code": "print(1)"}
    assert first.usage is not None and first.usage.output_tokens_details.reasoning_tokens > 0

    items = [{"role": "user", "content": "q"}, *(item.model_dump(exclude_none=True) for item in first.output)]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "1"})
    second = await llm.responses.create(model="m", input=items, store=False)  # type: ignore[arg-type]
    assert second.output_text == "It is 1." and second.status == "completed"
    assert second.usage is not None and (second.usage.input_tokens, second.usage.output_tokens) == (9, 4)
    assert scripted_openai.endpoints == ["responses", "responses"] and scripted_openai.rejected == []


async def test_responses_stream_as_named_events(scripted_openai: ScriptedOpenAI) -> None:
    scripted_openai.script(answer("The answer is forty-two, as computed.", reasoning="let me see"))
    stream = await strict_client(scripted_openai).responses.create(model="m", input="q", stream=True)
    kinds, text, thought, final = [], "", "", None
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        elif event.type == "response.reasoning_text.delta":
            thought += event.delta
        elif event.type == "response.completed":
            final = event.response
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert text == "The answer is forty-two, as computed." and thought == "let me see"
    assert final is not None and final.output[0].type == "reasoning" and final.output_text == text


async def test_responses_refuse_what_openai_refuses(scripted_openai: ScriptedOpenAI) -> None:
    scripted_openai.script(tool_call("x = 1", reasoning="hm"), answer("never served"))
    llm = client(scripted_openai)
    nested = {"type": "function", "function": {"name": "python", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError, match=r"tools\[0\].name"):
        await llm.responses.create(model="m", input="q", tools=[nested])  # type: ignore[list-item]
    with pytest.raises(openai.BadRequestError, match="additionalProperties"):
        await llm.responses.create(model="m", input="q", tools=[{**FLAT_TOOL, "strict": True}])  # type: ignore[list-item]
    with pytest.raises(openai.BadRequestError, match="Unknown parameter: 'messages'"):
        await llm.post("/responses", body={"model": "m", "input": "q", "messages": []}, cast_to=object)
    with pytest.raises(openai.BadRequestError, match="No tool call found"):
        await llm.responses.create(model="m", input=[{"type": "function_call_output", "call_id": "c9", "output": "1"}])

    first = await llm.responses.create(model="m", input="q", store=False)
    _, call = first.output
    assert call.type == "function_call"
    without_reasoning = [
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "1"},
    ]
    with pytest.raises(openai.BadRequestError, match="without its required 'reasoning' item"):
        await llm.responses.create(model="m", input=without_reasoning, store=False)  # type: ignore[arg-type]
    assert len(scripted_openai.rejected) == 5 and scripted_openai.remaining == 1


async def test_an_api_not_served_answers_404_like_fastapi() -> None:
    async with ScriptedOpenAI(apis=("responses",)) as server:
        server.script(answer("only here"))
        with pytest.raises(openai.NotFoundError) as missing:
            await client(server).chat.completions.create(model="m", messages=[])
        assert missing.value.body == {"detail": "Not Found"}
        assert server.missing == ["/v1/chat/completions"] and server.requests == [] and server.remaining == 1
        server.apis = {"chat"}
        assert (await client(server).chat.completions.create(model="m", messages=[])).choices[0].message.content


async def test_reasoning_content_on_chat_completions(scripted_openai: ScriptedOpenAI) -> None:
    scripted_openai.script(answer("42", reasoning="thinking it over"), answer("43", reasoning="again"))
    llm = client(scripted_openai)
    whole = await llm.chat.completions.create(model="m", messages=[])
    assert whole.choices[0].message.content == "42"
    assert whole.choices[0].message.reasoning_content == "thinking it over"  # type: ignore[attr-defined]
    stream = await llm.chat.completions.create(model="m", messages=[], stream=True)
    thought = ""
    async for chunk in stream:
        if chunk.choices:
            thought += getattr(chunk.choices[0].delta, "reasoning_content", None) or ""
    assert thought == "again"
