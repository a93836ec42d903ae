"""The streamable HTTP transport: the SDK's, with a large answer parsed off the event loop.

The SDK's :class:`~mcp.client.streamable_http.StreamableHTTPTransport` parses each message
(an SSE event's data, or a JSON body) on the event loop, and before it hands an SSE message on
formats the whole of it for a debug line, whatever the log level: ~60 ms of the loop for a
3 MB text. :class:`_Transport` overrides the two places a message is parsed
(``_handle_sse_event``, ``_handle_json_response``) to parse with :func:`bot.mcp.wire.parse_message`
(a large one in a worker thread) and hand it on as the SDK does, and tells a call whose SSE
event was past the cap that its answer was too large (``_resolve_abandoned_request``: the SDK
says the connection closed); everything else (the POSTs,
the GET stream, resumption, redirects within the origin, the session's end) is the SDK's.
:func:`http_transport` is ``mcp.client.streamable_http.streamable_http_client`` (SDK 2.3)
with that class, since the SDK's function takes no transport of one's own.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import mcp_types as types
from httpx2 import ServerSentEvent
from mcp.client.streamable_http import StreamableHTTPTransport, StreamWriter
from mcp.shared._context_streams import create_context_streams
from mcp.shared.message import SessionMessage

from bot.mcp import wire

log = logging.getLogger(__name__)


class _Transport(StreamableHTTPTransport):
    """The SDK's transport, each message parsed by :func:`bot.mcp.wire.parse_message`."""

    async def _handle_sse_event(
        self,
        sse: ServerSentEvent,
        read_stream_writer: StreamWriter,
        original_request_id: types.RequestId | None = None,
        resumption_callback: Callable[[str], Awaitable[None]] | None = None,
    ) -> bool:
        if sse.event != "message" or len(sse.data) < wire.OFF_LOOP_BYTES:
            return await super()._handle_sse_event(sse, read_stream_writer, original_request_id, resumption_callback)
        try:
            message = await wire.parse_message(sse.data)
        except ValueError as exc:
            log.warning("An MCP server sent an event that is not a JSON-RPC message (%s)", type(exc).__name__)
            if original_request_id is None:
                await read_stream_writer.send(exc)
                return False
            said = f"Failed to parse SSE message ({type(exc).__name__})"
            await read_stream_writer.send(_parse_error(original_request_id, said))
            return True
        if original_request_id is not None and isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
            message.id = original_request_id
        await read_stream_writer.send(SessionMessage(message))
        if sse.id and resumption_callback:
            await resumption_callback(sse.id)
        return isinstance(message, types.JSONRPCResponse | types.JSONRPCError)

    async def _handle_json_response(
        self, response: httpx2.Response, read_stream_writer: StreamWriter, *, request_id: types.RequestId
    ) -> None:
        try:
            content = await response.aread()
            message = await wire.parse_message(content)
        except httpx2.StreamError as exc:  # past the cap (see Connection._see_response)
            await read_stream_writer.send(_parse_error(request_id, f"Failed to read JSON response: {exc}"))
            return
        except ValueError as exc:
            log.warning("An MCP server sent a body that is not a JSON-RPC message (%s)", type(exc).__name__)
            await read_stream_writer.send(
                _parse_error(request_id, f"Failed to parse JSON response ({type(exc).__name__})")
            )
            return
        await read_stream_writer.send(SessionMessage(message))

    async def _resolve_abandoned_request(
        self,
        read_stream_writer: StreamWriter,
        request_id: types.RequestId,
        message: str,
        *,
        code: int = types.CONNECTION_CLOSED,
    ) -> None:
        # An SSE event past the cap ends its POST's stream, which the SDK reports as a closed
        # connection (so the session would be opened anew): it is one answer too large.
        if self.max_sse_event_size is not None and f"exceeded the {self.max_sse_event_size} byte limit" in message:
            message, code = wire.too_large(self.max_sse_event_size), types.INTERNAL_ERROR
        await super()._resolve_abandoned_request(read_stream_writer, request_id, message, code=code)


def _parse_error(request_id: types.RequestId, said: str) -> SessionMessage:
    error = types.ErrorData(code=types.PARSE_ERROR, message=said)
    return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))


@asynccontextmanager
async def http_transport(url: str, client: httpx2.AsyncClient, *, max_message_bytes: int) -> AsyncIterator[Any]:
    """The session's read and write streams over streamable HTTP to ``url`` with ``client``
    (its headers, timeouts and hooks); one SSE event may be ``max_message_bytes`` long. On exit
    the server is told the session ended (DELETE)."""
    transport = _Transport(url, max_sse_event_size=max_message_bytes)
    read_stream_writer, read_stream = create_context_streams[SessionMessage | Exception](0)
    write_stream, write_stream_reader = create_context_streams[SessionMessage](0)
    async with read_stream_writer, read_stream, write_stream, write_stream_reader, anyio.create_task_group() as group:

        def start_get_stream() -> None:
            group.start_soon(transport.handle_get_stream, client, read_stream_writer)

        group.start_soon(
            transport.post_writer,
            client,
            write_stream_reader,
            read_stream_writer,
            write_stream,
            start_get_stream,
            group,
        )
        try:
            yield read_stream, write_stream
        finally:
            if transport.session_id:
                await transport.terminate_session(client)
            group.cancel_scope.cancel()
