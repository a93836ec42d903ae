"""JSON logs: every line logged while a message is handled names its thread and turn."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from bot import logs
from tests.fakes.memory import MemoryChat
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call
from tests.ops.conftest import Ops

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """What the root logger writes at INFO through the JSON formatter, as ``python -m bot``
    with ``logging.format: json`` does."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.formatter("json"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]  # each line one JSON object


async def test_lines_logged_during_a_turn_carry_its_thread_and_turn(
    ops: Ops, llm: ScriptedOpenAI, captured: io.StringIO
) -> None:
    chat = MemoryChat(ops.core.dispatcher)
    llm.script(tool_call("print('hi')"), answer("Done."))
    logging.getLogger("tests.ops").info("before the turn")
    assert (await chat.say("print hi", thread="t-json", message_id="m-json")).reply.ok
    logging.getLogger("tests.ops").info("after the turn")

    written = lines(captured)
    assert all(set(line) >= {"time", "level", "logger", "message"} for line in written)
    assert all(line["time"].endswith("Z") and "T" in line["time"] for line in written)
    during = [line for line in written if line.get("turn") == "m-json"]
    assert during and all(line["thread"] == str(chat.key("t-json")) for line in during)
    # The turn's own summary line, from bot.turn, is among them.
    assert any(line["logger"] == "bot.turn" and line["message"].startswith("turn in ") for line in during)
    outside = [line for line in written if line["logger"] == "tests.ops"]
    assert [line["message"] for line in outside] == ["before the turn", "after the turn"]
    assert all("thread" not in line and "turn" not in line for line in outside), "the context ends with the turn"
    assert logs.current_thread.get() is None and logs.current_turn.get() is None


async def test_duplicates_are_logged_with_their_turn(ops: Ops, llm: ScriptedOpenAI, captured: io.StringIO) -> None:
    chat = MemoryChat(ops.core.dispatcher)
    llm.script(answer("Once."))
    await chat.say("hello", thread="t-dup", message_id="m-dup")
    await chat.say("hello", thread="t-dup", message_id="m-dup")  # a retried delivery
    dropped = [line for line in lines(captured) if "dropped duplicate" in line["message"]]
    assert [(line["thread"], line["turn"]) for line in dropped] == [(str(chat.key("t-dup")), "m-dup")]


def test_exceptions_and_the_text_format() -> None:
    record_stream = io.StringIO()
    logger = logging.getLogger("tests.ops.format")
    logger.propagate = False
    json_handler = logging.StreamHandler(record_stream)
    json_handler.setFormatter(logs.JsonFormatter())
    text_stream = io.StringIO()
    text_handler = logging.StreamHandler(text_stream)
    text_handler.setFormatter(logs.formatter("text"))
    logger.addHandler(json_handler)
    logger.addHandler(text_handler)
    try:
        tokens = logs.enter_turn("slack:T1:C1:1.0", "C1:1.1")
        try:
            try:
                raise ValueError("bad ünïcode value")
            except ValueError:
                logger.exception("it failed: %s", "here")
        finally:
            logs.leave_turn(tokens)
        logger.warning("outside")
    finally:
        logger.removeHandler(json_handler)
        logger.removeHandler(text_handler)
        logger.propagate = True
    first, second = (json.loads(line) for line in record_stream.getvalue().splitlines())
    assert first["message"] == "it failed: here" and first["level"] == "ERROR" and first["logger"] == "tests.ops.format"
    assert "ValueError: bad ünïcode value" in first["exception"] and first["exception"].startswith("Traceback")
    assert (first["thread"], first["turn"]) == ("slack:T1:C1:1.0", "C1:1.1")
    assert "exception" not in second and "thread" not in second
    text = text_stream.getvalue().splitlines()
    assert text[0].endswith("it failed: here [thread=slack:T1:C1:1.0 turn=C1:1.1]")
    assert text[-1].endswith("WARNING tests.ops.format: outside")
