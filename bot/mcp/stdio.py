"""The stdio transport: a server the bot starts, spoken to in lines of JSON over its stdin and
stdout.

It stands in for the SDK's ``mcp.client.stdio.stdio_client`` (same streams of
:class:`~mcp.shared.message.SessionMessage` for :class:`~mcp.client.session.ClientSession`,
same way of stopping the server), whose reader has no bound on a line and copies all it has
buffered for every chunk that comes (a 32 MiB line took 10 s), and parses every message on the
event loop. Here a line is collected in linear time and may be ``max_line_bytes`` long: the
rest of a longer one is read and thrown away, and the call it answers fails with one sentence.
A large message is parsed off the loop (:mod:`bot.mcp.wire`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import TextIO

import anyio
import mcp_types as types
from anyio.abc import Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

from bot.mcp import wire

log = logging.getLogger(__name__)

#: How long a server has to exit after its stdin closes, and again after SIGTERM (the SDK's).
GRACE_S = 2.0
#: How long messages already accepted have to reach the server's stdin when it is closed.
FLUSH_S = 0.5
#: Of a line past the limit, this much is kept to find the id of the request it answers.
_HEAD_BYTES = 1024
#: A response's id, where it leads (after "jsonrpc") and "result" or "error" follows, as servers
#: write it (the SDKs do).
_LEADING_ID = re.compile(
    rb'\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*(-?\d{1,18}|"[^"\\]{0,200}")\s*,\s*"(?:result|error)"'
)


@dataclass(frozen=True)
class Overlong:
    """A line past the limit: its first bytes (to find the request it answers)."""

    head: bytes


class Lines:
    """Splits a byte stream into lines of at most ``limit`` bytes, in time linear in its length."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        self._head: bytes | None = None  # set while the rest of an over-long line is thrown away

    def feed(self, chunk: bytes) -> list[bytes | Overlong]:
        """The lines that ``chunk`` completes (without their newlines; blank ones left out)."""
        done: list[bytes | Overlong] = []
        at = 0
        while (end := chunk.find(b"\n", at)) >= 0:
            self._add(chunk[at:end])
            line = self._take()
            if isinstance(line, Overlong) or line.strip():
                done.append(line)
            at = end + 1
        self._add(chunk[at:])
        return done

    def _add(self, data: bytes) -> None:
        if not data or self._head is not None:
            return
        if self._size + len(data) > self._limit:
            head = b""
            for part in (*self._parts, data):
                head += part[: _HEAD_BYTES - len(head)]
                if len(head) >= _HEAD_BYTES:
                    break
            self._head = head
            self._parts, self._size = [], 0
            return
        self._parts.append(data)
        self._size += len(data)

    def _take(self) -> bytes | Overlong:
        if self._head is not None:
            head, self._head = self._head, None
            return Overlong(head)
        line = b"".join(self._parts)
        self._parts, self._size = [], 0
        return line


@asynccontextmanager
async def stdio_transport(
    command: str, args: list[str], env: dict[str, str], *, errlog: TextIO, max_line_bytes: int, name: str
) -> AsyncIterator[
    tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]
]:
    """Starts ``command`` (in a process group of its own, with exactly ``env``, stderr to
    ``errlog``) and yields the session's read and write streams; on exit its stdin is closed,
    and it is stopped if it does not exit. ``name`` is the server's, for the log."""
    process = await anyio.open_process([command, *args], env=env, stderr=errlog, start_new_session=True)
    # No await from here until the task group holds the tasks: a cancellation would leak the process.
    read_sink, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_source = anyio.create_memory_object_stream[SessionMessage](0)
    written = anyio.Event()
    async with anyio.create_task_group() as group:
        group.start_soon(_read, process, read_sink, max_line_bytes, name)
        group.start_soon(_write, process, write_source, read_sink, written)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):  # every wait in it is bounded
                read_stream.close()  # the reader goes on draining stdout, so the server can exit
                write_stream.close()
                with anyio.move_on_after(FLUSH_S):
                    await written.wait()
                await _stop(process)
                for stream in (read_stream, write_stream, read_sink, write_source):
                    await stream.aclose()
            group.cancel_scope.cancel()


async def _read(
    process: Process, sink: MemoryObjectSendStream[SessionMessage | Exception], limit: int, name: str
) -> None:
    """The server's stdout, line by line, to the session (then drained until it ends)."""
    assert process.stdout is not None
    lines = Lines(limit)
    delivering = True
    with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        async with sink:
            async for chunk in process.stdout:
                if not delivering:
                    continue
                for line in lines.feed(chunk):
                    item = await _message(line, limit, name)
                    if item is None:  # no way to tell which call it answered: end the session
                        delivering = False
                        await sink.aclose()
                        break
                    try:
                        await sink.send(item)
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                        delivering = False  # the session is gone: only draining is left
                        break


async def _message(line: bytes | Overlong, limit: int, name: str) -> SessionMessage | Exception | None:
    """One line as the session takes it: a message, a parse error, or for a line past the limit
    an error answer to the request it answers (None when its id is not at its start)."""
    if isinstance(line, Overlong):
        found = _LEADING_ID.match(line.head)
        log.warning("MCP server %s: an answer over %d MiB was dropped", name, limit // 2**20)
        try:
            request_id = json.loads(found.group(1)) if found is not None else None
        except ValueError:  # a quoted id with a control character in it
            request_id = None
        if request_id is None:
            return None
        error = types.ErrorData(code=types.INTERNAL_ERROR, message=wire.too_large(limit))
        return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))
    try:
        return SessionMessage(await wire.parse_message(line))
    except ValueError as exc:  # its text could hold anything the server sent: only the type is logged
        log.warning("MCP server %s sent a line that is not a JSON-RPC message (%s)", name, type(exc).__name__)
        return exc


async def _write(
    process: Process,
    source: MemoryObjectReceiveStream[SessionMessage],
    read_sink: MemoryObjectSendStream[SessionMessage | Exception],
    written: anyio.Event,
) -> None:
    """The session's messages to the server's stdin, one line each."""
    assert process.stdin is not None
    try:
        async with source:
            async for message in source:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                await process.stdin.send(data.encode() + b"\n")
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        # The server stopped reading: end the session's stream, so no request waits forever.
        await read_sink.aclose()
    finally:
        written.set()


async def _stop(process: Process) -> None:
    """Stdin closed, a grace period, then SIGTERM and SIGKILL to its whole process group."""
    assert process.stdin is not None
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    if not await _exited(process, GRACE_S):
        await terminate_posix_process_tree(process, GRACE_S)
        if not await _exited(process, GRACE_S):
            log.warning("MCP server process %d is still alive after SIGKILL; left behind", process.pid)
            return
    with anyio.move_on_after(GRACE_S):
        await process.aclose()


async def _exited(process: Process, timeout_s: float) -> bool:
    with anyio.move_on_after(timeout_s):
        await process.wait()
        return True
    return False
