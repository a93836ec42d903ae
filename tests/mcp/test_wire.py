"""Large JSON-RPC messages parsed off the event loop (bot/mcp/wire.py): the result is what
``json.loads`` (and the SDK's own parser) gives, whatever falls on a slice's edge."""

from __future__ import annotations

import json
import random

import mcp_types as types
import pytest

from bot.mcp import wire

#: Pieces of a string literal's body as JSON writes it: escapes, \\uXXXX (surrogate pairs, both
#: cases, lone halves), multibyte UTF-8 (2, 3 and 4 bytes), backslash runs before a "u".
PIECES = [
    "a",
    "xyz",
    '\\"',
    "\\\\",
    "\\/",
    "\\n",
    "\\t",
    "\\b",
    "\\u00e9",
    "\\u00E9",
    "\\ud83d\\ude00",
    "\\uD83D\\uDE00",
    "\\udbff\\udfff",
    "\\ud83d",
    "\\ude00",
    "é",
    "€",
    "😀",
    "\\\\u0041",
    "\\\\\\u0041",
    "\\\\\\\\",
]


def literal(rng: random.Random, count: int) -> str:
    return '"' + "".join(rng.choice(PIECES) for _ in range(count)) + '"'


def document(rng: random.Random) -> bytes:
    values = [literal(rng, rng.randint(0, 40)) for _ in range(rng.randint(1, 5))]
    keys = [literal(rng, rng.randint(0, 12)) for _ in values]
    members = ", ".join(f"{key} : {value}" for key, value in zip(keys, values, strict=True))
    nested = '{"deep": [' + ",".join(values) + '], "n": [1, -2.5e3, true, null]}'
    return ("{" + members + ', "list": [' + ",".join(values) + '], "nested": ' + nested + "}").encode()


@pytest.mark.parametrize("slice_bytes", [1, 2, 3, 4, 5, 6, 7, 11, 16])
def test_sliced_decoding_is_json_loads_whatever_falls_on_a_cut(
    slice_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tiny slices put a cut at every place in turn: inside escapes, \uXXXX, surrogate pairs and
    # UTF-8 characters, and right after backslash runs.
    monkeypatch.setattr(wire, "SLICE_BYTES", slice_bytes)
    rng = random.Random(slice_bytes)
    for _ in range(400):
        raw = document(rng)
        expected = json.loads(raw)
        assert repr(wire.loads_sliced(raw)) == repr(expected), raw


def test_lone_surrogates_and_raw_multibyte_text_match_json_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "SLICE_BYTES", 3)
    rng = random.Random(7)
    alphabet = ["a", '"', "\\", "\n", "\x01", "é", "€", "😀", "\ud83d", "\ude00", "\udc00", "u"]
    for _ in range(500):
        value = {"k" * rng.randint(0, 9): "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))}
        text = json.dumps([value, list(value.values())], ensure_ascii=rng.random() < 0.5)
        raw = text.encode("utf-8", "surrogatepass")
        assert repr(wire.loads_sliced(raw)) == repr(json.loads(raw))


def test_what_json_loads_refuses_is_refused_as_a_value_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "SLICE_BYTES", 2)
    for body in ["\\x", "\x01", "\\u12", "\\uZZZZ", "abc\\"]:
        raw = ('{"a": "' + "yy" * 20 + body + "yy" * 20 + '"}').encode()
        with pytest.raises(ValueError):
            json.loads(raw)
        with pytest.raises(ValueError):
            wire.loads_sliced(raw)


def test_a_message_nested_past_the_parsers_depth_is_a_value_error() -> None:
    # Once failed with RecursionError, which ended the transport's task group, not the message.
    deep = b"[" * 100_000 + b"]" * 100_000
    long_text = b'"' + b"x" * (wire.SLICE_BYTES + 10) + b'"'
    message = b'{"jsonrpc": "2.0", "id": 1, "result": {"a": ' + long_text + b', "b": ' + deep + b"}}"
    with pytest.raises(ValueError):
        wire.parse(message)
    with pytest.raises(ValueError):
        wire.loads_sliced(b"[" + long_text + b"," + deep + b"]")


def test_long_keys_stay_keys_and_many_literals_parse_whole() -> None:
    long_key = "k" * (wire.SLICE_BYTES * 2)
    long_value = "v\\u00e9" * wire.SLICE_BYTES
    raw = json.dumps({long_key: {long_key: long_value}, "x": [long_value, {"y": long_value}]}).encode()
    assert wire.loads_sliced(raw) == json.loads(raw)
    many = json.dumps(["s"] * (wire.MAX_LITERALS + 5) + ["é" * wire.SLICE_BYTES * 2], ensure_ascii=False).encode()
    assert wire.loads_sliced(many) == json.loads(many)


def call_result(text: str, request_id: int | str = 7) -> bytes:
    result = {"content": [{"type": "text", "text": text}], "structuredContent": {"result": text}, "isError": False}
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}, ensure_ascii=False).encode()


@pytest.mark.parametrize("request_id", [7, "req-7"])
def test_a_large_message_is_what_the_sdk_parses(request_id: int | str) -> None:
    text = "".join(f'row {i:011d} é😀 "q" \\ \t\n' for i in range(40_000))
    raw = call_result(text, request_id)
    assert len(raw) > wire.OFF_LOOP_BYTES
    expected = types.jsonrpc_message_adapter.validate_json(raw, by_name=False)
    assert wire.parse(raw) == expected
    assert wire.parse(raw.decode()) == expected  # an SSE event's data is a str
    small = call_result("hello")
    assert wire.parse(small) == types.jsonrpc_message_adapter.validate_json(small, by_name=False)


async def test_parse_message_gives_the_message_and_refuses_what_is_not_one() -> None:
    raw = call_result("z" * (wire.OFF_LOOP_BYTES * 2))
    message = await wire.parse_message(raw)
    assert isinstance(message, types.JSONRPCResponse) and message.id == 7
    with pytest.raises(ValueError):
        await wire.parse_message(b'{"jsonrpc": "2.0", "id": 7, "result": "' + b"z" * wire.OFF_LOOP_BYTES + b"}")
    with pytest.raises(ValueError):
        await wire.parse_message(b'{"not": "' + b"z" * wire.OFF_LOOP_BYTES + b'"}')
