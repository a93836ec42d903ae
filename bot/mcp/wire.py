"""An MCP server's JSON-RPC messages parsed without stalling the event loop.

A small message is parsed where it arrives. A large one (:data:`OFF_LOOP_BYTES` and over) is
parsed in a worker thread, but a thread alone would not free the loop: a JSON parser (the
SDK's pydantic-core, or :mod:`json`) holds the GIL for the whole of one call, ~4 ms a MB on
the loop's own core as much as on another. So a large message's long string literals (a
tool's text, almost always what makes it large) are decoded in slices of
:data:`SLICE_BYTES`, each one short call between which the thread hands the GIL back; the
rest of the message is parsed whole with each long literal stood in for by a placeholder,
and the decoded strings are put in their places. The result is what ``json.loads`` of the
whole would give.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

import mcp_types as types

#: A message this large (bytes) is parsed in a worker thread.
OFF_LOOP_BYTES = 256 * 1024
#: A string literal longer than this is decoded in slices of about this many bytes.
SLICE_BYTES = 128 * 1024
#: A message with more string literals than this is parsed whole (in the thread): it is large
#: by its many small values, which slicing would not help, and finding them costs Python time.
MAX_LITERALS = 50_000
#: How far past a slice's end a place to cut it is looked for (past it, the rest goes whole).
_CUT_SEARCH = 64

_QUOTE, _BACKSLASH, _U = 0x22, 0x5C, 0x75
_WHITESPACE = re.compile(rb"[ \t\r\n]*")
_LOW_SURROGATE = (b"dc", b"dd", b"de", b"df")


def too_large(limit: int) -> str:
    """What a call is told whose answer was past ``limit`` bytes (and so dropped)."""
    return f"the answer is over {limit // 2**20} MiB"


def parse(data: bytes | str) -> types.JSONRPCMessage:
    """One JSON-RPC message (:class:`ValueError` when it is not one), as the SDK's transports
    parse it; a large one's long strings decoded in slices."""
    adapter = types.jsonrpc_message_adapter
    if len(data) < OFF_LOOP_BYTES:
        return adapter.validate_json(data, by_name=False)
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    return adapter.validate_python(loads_sliced(raw), by_name=False)


async def parse_message(data: bytes | str) -> types.JSONRPCMessage:
    """:func:`parse`, in a worker thread when ``data`` is :data:`OFF_LOOP_BYTES` or more."""
    if len(data) < OFF_LOOP_BYTES:
        return parse(data)
    return await asyncio.to_thread(parse, data)


def loads_sliced(raw: bytes) -> Any:
    """``json.loads(raw)`` where no one call to the decoder takes much longer than a slice."""
    spans = _long_values(raw)
    if spans:
        return _assemble(raw, spans)
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("the message is nested too deeply") from None


def _assemble(raw: bytes, spans: list[tuple[int, int]]) -> Any:
    """``raw`` parsed with the literals at ``spans`` decoded apart and put in their places."""
    token = secrets.token_hex(8)
    marker = f"\x00threadbook-{token}:"
    skeleton: list[bytes] = []
    at = 0
    for index, (start, end) in enumerate(spans):
        skeleton += [raw[at:start], f'"\\u0000threadbook-{token}:{index}"'.encode()]
        at = end
    skeleton.append(raw[at:])
    try:
        value = json.loads(b"".join(skeleton))
    except RecursionError:  # nested past the parser's depth: not a message (pydantic says ValueError too)
        raise ValueError("the message is nested too deeply") from None
    del skeleton
    strings = [_decode_literal(raw, start, end) for start, end in spans]
    return _put_back(value, marker, strings)


def _long_values(raw: bytes) -> list[tuple[int, int]]:
    """The spans (from the opening quote to after the closing one) of the string literals longer
    than :data:`SLICE_BYTES` that are values, not keys; none when there are too many literals
    (or the text is not well formed: ``json.loads`` of the whole says why)."""
    spans: list[tuple[int, int]] = []
    find = raw.find
    at = 0
    for _ in range(MAX_LITERALS):
        start = find(b'"', at)
        if start < 0:
            return spans
        end = start + 1
        while True:
            end = find(b'"', end)
            if end < 0:
                return []
            if _escaped(raw, end, start + 1):
                end += 1
                continue
            break
        end += 1
        if end - start > SLICE_BYTES and not _is_key(raw, end):
            spans.append((start, end))
        at = end
    return []


def _is_key(raw: bytes, end: int) -> bool:
    """Whether the literal that ends at ``end`` is an object's key (a colon follows it)."""
    after = _WHITESPACE.match(raw, end)
    at = after.end() if after else end
    return raw[at : at + 1] == b":"


def _escaped(raw: bytes, index: int, floor: int) -> bool:
    """Whether the byte at ``index`` follows an odd run of backslashes (none before ``floor``)."""
    run = 0
    while index - run - 1 >= floor and raw[index - run - 1] == _BACKSLASH:
        run += 1
    return run % 2 == 1


def _decode_literal(raw: bytes, start: int, end: int) -> str:
    """The string literal ``raw[start:end]`` (quotes included), decoded slice by slice."""
    parts: list[str] = []
    at, stop = start + 1, end - 1
    while at < stop:
        cut = stop if stop - at <= SLICE_BYTES else _cut(raw, at + SLICE_BYTES, stop, at)
        parts.append(scanstring(raw[at:cut].decode("utf-8", "surrogatepass") + '"', 0, True)[0])
        at = cut
    return "".join(parts)


def _cut(raw: bytes, want: int, stop: int, floor: int) -> int:
    """A place at or after ``want`` where a literal's body can be cut: not inside a UTF-8
    character nor an escape, nor between the two halves of a surrogate pair (``stop`` when
    none is near)."""
    for at in range(want, min(want + _CUT_SEARCH, stop)):
        if 0x80 <= raw[at] < 0xC0 or _escaped(raw, at, floor):
            continue
        if any(
            raw[q] == _BACKSLASH and raw[q + 1] == _U and not _escaped(raw, q, floor)
            for q in range(max(floor, at - 5), at - 1)
        ):
            continue  # inside \uXXXX
        if raw[at] == _BACKSLASH and raw[at + 1 : at + 2] == b"u" and raw[at + 2 : at + 4].lower() in _LOW_SURROGATE:
            continue  # the second half of a surrogate pair
        return at
    return stop


def _put_back(value: Any, marker: str, strings: list[str]) -> Any:
    """``value`` with each placeholder string replaced by its decoded literal."""

    def real(item: Any) -> Any:
        if isinstance(item, str) and item.startswith(marker):
            return strings[int(item[len(marker) :])]
        return item

    todo: list[Any] = [value]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            for key, item in node.items():
                if isinstance(item, str):
                    node[key] = real(item)
                elif isinstance(item, dict | list):
                    todo.append(item)
        elif isinstance(node, list):
            for index, item in enumerate(node):
                if isinstance(item, str):
                    node[index] = real(item)
                elif isinstance(item, dict | list):
                    todo.append(item)
    return real(value)
